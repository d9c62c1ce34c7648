"""Summaries TensorBoard reads, ``psflow report`` PNGs, ``psflow export`` + ``predict`` reproducing eval."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support import A9A, A9A_T, run_cli
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from psflow.data import read_all
from psflow.models.metrics import binary_metrics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_summaries_report_export_and_predict(tmp_path: Path) -> None:
    run, ckpt, model = tmp_path / "run", tmp_path / "ckpt", tmp_path / "model"
    r = run_cli("train", "--train", str(A9A), "--eval", str(A9A_T), "--num-features", "124", "--ps", "2",
                "--workers", "1", "--epochs", "2", "--checkpoint-dir", str(ckpt), "--save-summaries-steps", "10",
                "--eval-every-steps", "20", "--checkpoint-transport", "rpc", "--output", str(run), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((run / "metrics.json").read_text())

    # Each run's summaries go to a fresh directory of their own, RUN_DIR/summaries/<run id>/ (TensorBoard's
    # --logdir RUN_DIR shows each run; EventAccumulator reads one directory).
    (summaries,) = (run / "summaries").iterdir()
    assert summaries.name == json.loads((run / "config.json").read_text())["run_id"]
    acc = EventAccumulator(str(summaries))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("train/loss", "train/examples_per_sec", "train/global_step_per_sec", "eval/auc", "eval/logloss",
                "eval/accuracy", "ps/0/pulls_per_sec", "ps/1/pushes_per_sec", "ps/0/bytes_in_per_sec",
                "ps/1/bytes_out_per_sec"):
        assert tag in tags, sorted(tags)
    auc = acc.Scalars("eval/auc")
    assert [e.step for e in auc][:3] == [20, 40, 60] and auc[-1].step == metrics["global_step"]
    assert auc[-1].value == pytest.approx(metrics["eval"]["auc"], abs=1e-6)
    assert all(e.value > 0 for e in acc.Scalars("train/examples_per_sec"))

    r = run_cli("report", str(run))
    assert r.returncode == 0, r.stderr
    for name in ("loss", "eval_auc", "throughput", "ps_rates"):
        png = run / "report" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

    r = run_cli("export", str(ckpt), str(model))
    assert r.returncode == 0, r.stderr
    assert json.loads((model / "model.json").read_text())["global_step"] == metrics["global_step"]
    out = tmp_path / "probs.txt"
    r = run_cli("predict", str(model), str(A9A_T), "--output", str(out))
    assert r.returncode == 0, r.stderr
    probs = np.array([float(x) for x in out.read_text().split()])
    labels = read_all([str(A9A_T)], "libsvm").labels
    # One worker: the chief's final checkpoint holds the model the launcher evaluated.
    assert binary_metrics(labels, probs) == metrics["eval"]
    r = run_cli("predict", str(model), str(A9A_T))
    assert r.stdout == out.read_text()


def test_clear_errors_for_missing_checkpoint_and_summaries(tmp_path: Path) -> None:
    r = run_cli("export", str(tmp_path), str(tmp_path / "out"))
    assert r.returncode == 1 and "no complete checkpoint" in r.stderr
    r = run_cli("report", str(tmp_path))
    assert r.returncode == 1 and "no TensorBoard summaries" in r.stderr


def test_a_resumed_run_sharing_a_summary_dir_shows_each_step_once_in_tensorboard(tmp_path: Path) -> None:
    """The first run summarized steps 10..50 and evaluated at 20, 40 and 50, and its newest checkpoint left is
    ckpt-000000040 (the final one, 50, is gone: a crash after the summary, before the save). The resumed run
    restores step 40 and summarizes 50 and 60 again into the same --summary-dir: its chief writes a SessionLog
    START first, as TensorFlow's does, so TensorBoard drops the first run's events past step 40 and shows each
    step once (it showed 50 twice: the old curve and the new one overlapping). The first run's step 40 stays:
    it is the history of the model restored, which the resumed run does not write again (a START at step 40
    dropped its loss and its evaluation at 40, and a resumed run's START dropped the finished run's final
    evaluation)."""
    ckpt, summaries = tmp_path / "ckpt", tmp_path / "summaries"
    common = ["--train", str(A9A), "--num-features", "124", "--ps", "1", "--workers", "1", "--quiet",
              "--checkpoint-dir", str(ckpt), "--save-checkpoints-steps", "20", "--save-summaries-steps", "10",
              "--summary-dir", str(summaries), "--eval", str(A9A_T), "--eval-every-steps", "20"]
    r = run_cli("train", *common, "--max-steps", "50", "--output", str(tmp_path / "first"))
    assert r.returncode == 0, r.stderr[-3000:]
    for f in (ckpt / "ckpt-000000050").iterdir():
        f.unlink()
    (ckpt / "ckpt-000000050").rmdir()
    r = run_cli("train", *common, "--max-steps", "60", "--output", str(tmp_path / "resumed"))
    assert r.returncode == 0, r.stderr[-3000:]
    acc = EventAccumulator(str(summaries))
    acc.Reload()
    steps = [e.step for e in acc.Scalars("train/loss")]
    assert steps == [10, 20, 30, 40, 50, 60], steps  # the first run's 50 dropped; the resumed run's 50, 60
    assert [e.step for e in acc.Scalars("eval/auc")] == [20, 40, 60]  # the first run's 40 kept, its 50 dropped
    assert sum(1 for p in summaries.iterdir() if p.name.startswith("events.out.tfevents")) == 2  # one per chief
