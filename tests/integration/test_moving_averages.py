"""Moving averages end to end: `psflow train --moving-average-decay D --eval-moving-averages` on real ps tasks, then
the chief's evaluations, the final evaluation, the evaluator task, `psflow export [--moving-averages]` and
`psflow predict [--moving-averages]` -- each with the averages when asked and the variables otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from support import A9A, A9A_T, run_cli

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.variables import averaged_variables, read_variables
from psflow.data import read_all
from psflow.export import load_checkpoint_model
from psflow.launch.evaluator import run_evaluator
from psflow.train.config import TrainConfig
from psflow.train.evaluation import ArrayParameters, evaluate
from psflow.train.summary import read_scalars

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _eval(path: str, *, moving_averages: bool) -> dict[str, float]:
    """The checkpoint's model evaluated on a9a.t from its files (its averages or its variables)."""
    loaded = load_checkpoint_model(path, moving_averages=moving_averages)
    batch = read_all([str(A9A_T)], "libsvm", num_features=124)
    return evaluate(loaded.model, ArrayParameters(loaded.values), batch)


def test_evaluation_export_and_predict_use_the_moving_averages_when_asked(tmp_path: Path) -> None:
    out, ckpt, summaries = tmp_path / "run", tmp_path / "ckpt", tmp_path / "summaries"
    # 1 worker (the chief): a checkpoint and the chief's evaluation every 20 steps see the same parameters
    r = run_cli("train", "--train", str(A9A), "--eval", str(A9A_T), "--num-features", "124", "--optimizer", "sgd",
                "--learning-rate", "1.0", "--moving-average-decay", "0.99", "--eval-moving-averages",
                "--eval-every-steps", "20", "--save-checkpoints-steps", "20", "--max-to-keep", "10",
                "--ps", "2", "--workers", "1", "--epochs", "1", "--checkpoint-dir", str(ckpt),
                "--summary-dir", str(summaries), "--output", str(out), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    final = latest_checkpoint(str(ckpt))
    assert final is not None and read_manifest(final).global_step == metrics["global_step"] == 64
    assert averaged_variables(read_manifest(final)) == ["bias", "weights"]  # on ps tasks 1 and 0

    # The launcher's final evaluation read the averages from the live ps tasks: the final checkpoint's averages.
    averaged, plain = _eval(final, moving_averages=True), _eval(final, moving_averages=False)
    for key in ("auc", "logloss", "accuracy"):
        assert metrics["eval"][key] == pytest.approx(averaged[key], rel=1e-9), key
    assert abs(averaged["logloss"] - plain["logloss"]) > 1e-4  # the averages are not the variables
    print(f"eval with moving averages {averaged}; without {plain}")
    # The chief's evaluation every 20 steps: the averages of the checkpoint at that step.
    points = dict(read_scalars(str(summaries))["eval/logloss"])
    for step in (20, 40, 60):
        checkpoint = ckpt / f"ckpt-{step:09d}"
        assert points[step] == pytest.approx(_eval(str(checkpoint), moving_averages=True)["logloss"], rel=1e-6)

    # The evaluator task, with and without --eval-moving-averages.
    config = TrainConfig.flat(eval=(str(A9A_T),), num_features=124, checkpoint_dir=str(ckpt))
    for moving_averages, want in ((True, averaged), (False, plain)):
        (done,) = run_evaluator(config.with_(eval_moving_averages=moving_averages),
                                poll_secs=0.1)
        assert done.final and done.global_step == 64
        assert done.metrics["logloss"] == pytest.approx(want["logloss"], rel=1e-9)

    # psflow export: the variables, the averages beside them; --moving-averages: the averages in their place.
    for flags, where in (((), "plain"), (("--moving-averages",), "averaged")):
        r = run_cli("export", *flags, str(ckpt), str(tmp_path / where))
        assert r.returncode == 0, r.stderr[-2000:]
    variables, shadows = read_variables(final), read_variables(final, moving_averages=True)
    for where, want in (("plain", variables), ("averaged", shadows)):
        got = load_file(str(tmp_path / where / "model.safetensors"))
        assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want), where
    beside = load_file(str(tmp_path / "plain" / "moving_averages.safetensors"))
    assert set(beside) == {"bias", "weights"} and all(np.array_equal(beside[k], shadows[k]) for k in beside)
    assert json.loads((tmp_path / "plain" / "model.json").read_text())["moving_averages"] == {
        "in_place": False, "variables": ["bias", "weights"], "file": "moving_averages.safetensors"}
    assert json.loads((tmp_path / "averaged" / "model.json").read_text())["moving_averages"] == {
        "in_place": True, "variables": ["bias", "weights"]}

    # psflow predict: --moving-averages scores with the averages, from either export.
    predictions = {}
    for name, model, flags in (("variables", "plain", ()), ("averages", "plain", ("--moving-averages",)),
                               ("averages in place", "averaged", ()),
                               ("averages in place, asked", "averaged", ("--moving-averages",))):
        target = tmp_path / f"{name}.txt"
        r = run_cli("predict", str(tmp_path / model), str(A9A_T), *flags, "--output", str(target))
        assert r.returncode == 0, r.stderr[-2000:]
        predictions[name] = np.loadtxt(target)
    assert np.array_equal(predictions["averages"], predictions["averages in place"])
    assert np.array_equal(predictions["averages"], predictions["averages in place, asked"])
    assert not np.allclose(predictions["averages"], predictions["variables"], rtol=1e-4)


def test_asking_for_averages_a_run_did_not_keep_is_one_line(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    r = run_cli("train", "--train", str(A9A), "--num-features", "124", "--in-process", "--max-steps", "3",
                "--checkpoint-dir", str(ckpt), "--output", str(tmp_path / "run"), "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_cli("export", "--moving-averages", str(ckpt), str(tmp_path / "model"))
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1].endswith(
        "holds no moving averages: train with --moving-average-decay D (or a model whose variables declare "
        "moving_average_decay)"), r.stderr
    assert run_cli("export", str(ckpt), str(tmp_path / "model")).returncode == 0
    r = run_cli("predict", "--moving-averages", str(tmp_path / "model"), str(A9A_T))
    assert r.returncode == 1
    assert f"exported model {tmp_path / 'model'} holds no moving averages" in r.stderr.strip().splitlines()[-1]
