"""examples/cnn_digits.py: TensorFlow's synchronous multi-tower CIFAR-10 trainer, re-done on psflow.

A small PyTorch CNN (:class:`examples.cnn_digits.DigitsCNN`) on scikit-learn's bundled 8x8 digits, written
as TFRecord files with a schema, trained by real processes:

* **sync = one process on the combined batch.** Two workers of batch 16 in sync mode (between-graph:
  ``psflow train --mode sync --averaging replicas``; in-graph: one client, a tower per worker, the client
  averages the towers' gradients), and ``psflow train --in-process`` with batch 32, each for 5 steps of
  plain SGD, give the variables of a direct computation: the model's own forward/backward on the 5
  combined batches of 32 from the same initial values, with TensorFlow's SGD update (rtol 1e-5).

  The data make the combined batch well defined: one file of exactly 5 x 32 records, read once, no
  shuffling. Between-graph, with fewer files than workers, worker ``i`` reads records ``i, i+2, ...``
  (psflow/data/sharding.py), so its k-th batch of 16 is the even (odd) records of ``[32k, 32k+32)``;
  in-graph, the client reads batches of 2 x 16 = records ``[32k, 32k+32)`` and gives each worker one half;
  ``--in-process`` reads the same 32. The loss is the batch mean, so the average of two halves' gradients
  is the gradient of the whole batch (up to float32 rounding: summation order differs).
* **accuracy.** Two workers, sync between-graph, 10 epochs: test accuracy >= 0.95 on the held-out digits;
  the checkpoint exports, and ``psflow predict`` writes the class probabilities that reproduce it.

Every run sets ``PSFLOW_TORCH_THREADS=1``: the processes share two cores.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import REPO, ClusterHandle, run_cli

from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.variables import read_variables
from psflow.cluster import ClusterSpec
from psflow.data import read_all
from psflow.export import export_model, load_model
from psflow.models.registry import model_class
from psflow.optim import OptimizerSpec
from psflow.ps.client import ParameterClient
from psflow.ps.initializers import initial_value
from psflow.ps.optimizers import make_optimizer
from psflow.rpc.api import ConnectConfig
from psflow.train.build import build_model, data_options
from psflow.train.config import TrainConfig
from psflow.train.evaluation import ArrayParameters, evaluate

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MODEL = "examples.cnn_digits:DigitsCNN"
WORKERS, BATCH, STEPS = 2, 16, 5  # per-worker batch; the combined batch is WORKERS * BATCH
LEARNING_RATE = 0.2
RTOL, ATOL = 1e-5, 1e-7
THREADS = {"PSFLOW_TORCH_THREADS": "1"}
#: examples/cnn_digits.py, imported from the repository as the tasks import it.
cnn_digits = sys.modules[model_class(MODEL, search_path=str(REPO)).__module__]


@dataclass(frozen=True)
class Digits:
    train: list[str]        # the whole training split, 2 files
    test: str               # the held-out split
    schema: str
    five_steps: str         # the first STEPS * WORKERS * BATCH training examples, one file
    uneven: str             # the first (STEPS - 1) * WORKERS * BATCH + 3: the last batch splits into 1 and 2


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Digits:
    out = tmp_path_factory.mktemp("digits")
    written = cnn_digits.write_digits(out, train_shards=2)
    x_train, y_train, _, _ = cnn_digits.load_split()
    n = STEPS * WORKERS * BATCH
    cnn_digits.write_records(out / "five_steps.tfrecord", x_train[:n], y_train[:n])
    m = n - WORKERS * BATCH + 3
    cnn_digits.write_records(out / "uneven.tfrecord", x_train[:m], y_train[:m])
    return Digits(written["train"], written["test"], written["schema"], str(out / "five_steps.tfrecord"),
                  str(out / "uneven.tfrecord"))


@pytest.fixture(autouse=True)
def one_torch_thread(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every process of a run (they inherit the environment) and this one run PyTorch on one thread."""
    before = torch.get_num_threads()
    for key, value in THREADS.items():
        monkeypatch.setenv(key, value)
    yield
    torch.set_num_threads(before)


def five_step_config(digits: Digits, data: str | None = None, **kw: Any) -> TrainConfig:
    return TrainConfig.flat(train=(data or digits.five_steps,), eval=(digits.test,), format="tfrecord", schema=digits.schema,
                            model=MODEL, model_path=str(REPO), optimizer="sgd", learning_rate=LEARNING_RATE,
                            batch_size=BATCH, epochs=1, num_ps=2, num_workers=WORKERS, mode="sync", averaging="replicas",
                            log_every=1, **kw)


@pytest.fixture(scope="module")
def reference(digits: Digits) -> dict[str, np.ndarray]:
    """One process, no psflow runtime: STEPS SGD steps of the model on the combined batches of WORKERS * BATCH."""
    return one_process(digits, digits.five_steps)


@pytest.fixture(scope="module")
def uneven_reference(digits: Digits) -> dict[str, np.ndarray]:
    """:func:`one_process` on ``digits.uneven``: its last step is the 3 examples left."""
    return one_process(digits, digits.uneven)


def one_process(digits: Digits, data_file: str) -> dict[str, np.ndarray]:
    """STEPS SGD steps of the model on ``data_file``'s combined batches of WORKERS * BATCH (the last: what is left).

    The initial values are the ps tasks' (each variable's initializer, then the module's own values the chief
    loads); the update is TensorFlow's ``var -= learning_rate * grad`` (psflow's sgd, as the ps tasks run it).
    """
    before = torch.get_num_threads()
    config = five_step_config(digits, data_file)
    model, variables = build_model(config, ClusterSpec({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}))
    torch.set_num_threads(1)
    values: dict[str, np.ndarray] = {}
    for p in variables.placements():
        values[p.var.name] = initial_value(dict(p.var.initializer), p.var.shape, 0, p.num_rows, p.var.dtype)
    values.update({k: np.array(v, np.float32) for k, v in model.initial_values().items()})
    sgd = make_optimizer(OptimizerSpec("sgd", {"learning_rate": LEARNING_RATE}))
    slots = {name: sgd.create_slots(v) for name, v in values.items()}
    data = read_all(list(config.data.train), config.data.format, **data_options(config))
    big = WORKERS * BATCH
    assert -(-data.num_examples // big) == STEPS
    for start in range(0, data.num_examples, big):
        batch = model.prepare(data.slice(start, min(start + big, data.num_examples)))
        out = model.compute(batch, ArrayParameters(values).pull(model.lookups(batch)))
        assert set(out.gradients) == set(values)
        for name, grad in out.gradients.items():
            sgd.apply_dense(values[name], slots[name], np.asarray(grad.values, np.float32))
    torch.set_num_threads(before)
    return values


def compare(trained: dict[str, np.ndarray], reference: dict[str, np.ndarray], what: str) -> tuple[float, float]:
    """Asserts every variable equals the reference (rtol 1e-5); returns (max abs, max relative) difference."""
    assert set(reference) <= set(trained), f"{what}: variables {sorted(trained)}"
    worst_abs = worst_rel = 0.0
    for name, want in reference.items():
        got = np.asarray(trained[name], np.float64).reshape(want.shape)
        diff = np.abs(got - want)
        worst_abs = max(worst_abs, float(diff.max()))
        worst_rel = max(worst_rel, float((diff / np.maximum(np.abs(want), 1e-3)).max()))
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"{what}: {name}")
    print(f"{what}: max |difference| {worst_abs:.3g}, max relative (|value| >= 1e-3) {worst_rel:.3g}")
    return worst_abs, worst_rel


def train_cli(digits: Digits, out: Path, *args: str, timeout: float = 120) -> dict[str, Any]:
    r = run_cli("train", "--model", MODEL, "--format", "tfrecord", "--schema", digits.schema, "--eval", digits.test,
                "--optimizer", "sgd", "--learning-rate", str(LEARNING_RATE), "--output", str(out / "run"),
                "--checkpoint-dir", str(out / "ckpt"), "--quiet", *args, timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    metrics: dict[str, Any] = json.loads((out / "run" / "metrics.json").read_text())
    return metrics


def test_reference_really_trains(reference: dict[str, np.ndarray], digits: Digits) -> None:
    """The reference moved every variable (so the comparisons below compare training, not initial values)."""
    config = five_step_config(digits)
    model, variables = build_model(config, ClusterSpec({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}))
    for p in variables.placements():
        start = initial_value(dict(p.var.initializer), p.var.shape, 0, p.num_rows, p.var.dtype)
        start = model.initial_values().get(p.var.name, start)
        assert np.abs(reference[p.var.name] - start).max() > 1e-4, p.var.name


@pytest.mark.parametrize("how", ["between-graph", "in-process"])
def test_psflow_train_sync_equals_one_process_on_the_combined_batch(how: str, digits: Digits,
                                                                     reference: dict[str, np.ndarray],
                                                                     tmp_path: Path) -> None:
    if how == "between-graph":  # SyncReplicas: 2 workers of 16, the ps tasks average the 2 gradients per step
        args = ["--mode", "sync", "--averaging", "replicas", "--ps", "2", "--workers", str(WORKERS),
                "--batch-size", str(BATCH)]
    else:  # one process, batch 32
        args = ["--in-process", "--ps", "2", "--batch-size", str(WORKERS * BATCH)]
    metrics = train_cli(digits, tmp_path, "--train", digits.five_steps, "--epochs", "1", *args)
    assert metrics["global_step"] == STEPS
    assert metrics["examples"] == STEPS * WORKERS * BATCH
    assert metrics.get("stale_dropped", 0) == 0
    checkpoint = latest_checkpoint(str(tmp_path / "ckpt"))
    assert checkpoint is not None
    compare(read_variables(checkpoint), reference, how)


@pytest.mark.parametrize("which", ["five_steps", "uneven"])
def test_in_graph_sync_equals_one_process_on_the_combined_batch(digits: Digits, which: str, local_cluster: Any,
                                                                 tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """In-graph (one client, a tower per worker task), as ``psflow train --replication in-graph`` runs it.

    The processes are started here (2 ps, 2 worker tasks serving RunStep, the client task) so that the
    variables can be read from the ps tasks when the client is done (this config gives no checkpoint directory).
    ``uneven``: the last batch, 3 examples, splits into slices of 1 and 2, and each slice's gradient counts by its
    share, as in one process on the batch (the plain mean of the two gave the 1-example slice half the step).
    """
    reference = request.getfixturevalue("reference" if which == "five_steps" else "uneven_reference")
    examples = STEPS * WORKERS * BATCH if which == "five_steps" else (STEPS - 1) * WORKERS * BATCH + 3
    handle: ClusterHandle = local_cluster(2, WORKERS)
    config = five_step_config(digits, getattr(digits, which), replication="in-graph")
    path = tmp_path / "config.json"
    path.write_text(config.to_json())
    for i in range(WORKERS):
        handle.start("worker", i, "--config", str(path))
    client_proc = handle.start("client", 0, "--config", str(path), "--result", str(tmp_path / "client.json"))
    assert client_proc.wait(timeout=120) == 0, handle.log("client", 0)[-4000:]
    result = json.loads((tmp_path / "client.json").read_text())
    assert result["steps"] == STEPS and result["examples"] == examples
    log = handle.log("client", 0)
    assert f"step={STEPS} " in log and "workers=2" in log, log[-3000:]

    _, variables = build_model(config, handle.cluster)
    client = ParameterClient(handle.cluster, variables.placements(), client_name="test",
                             config=ConnectConfig(token=handle.token, connect_timeout=30))
    try:
        client.connect()
        assert client.global_step() == STEPS
        trained = client.pull(dict.fromkeys(p.var.name for p in variables.placements()))
    finally:
        client.close()
    compare(trained, reference, "in-graph")


def test_two_sync_workers_reach_95_percent_on_held_out_digits(digits: Digits, tmp_path: Path) -> None:
    metrics = train_cli(digits, tmp_path, *[a for p in digits.train for a in ("--train", p)],
                        "--mode", "sync", "--averaging", "replicas", "--ps", "2", "--workers", str(WORKERS),
                        "--batch-size", "32", "--epochs", "10", "--log-every", "50", timeout=180)
    ev = metrics["eval"]
    print(f"sync between-graph, 2 workers, 10 epochs: global_step {metrics['global_step']}, eval {ev}")
    assert ev["examples"] == 360
    assert ev["accuracy"] >= 0.95, ev
    assert ev["logloss"] < 0.3, ev
    assert metrics["stale_dropped"] == 0
    # Each worker read its own file (719 and 718 examples): 23 steps of 32 per epoch, every one aggregated.
    assert metrics["global_step"] == 10 * 23
    worker_logs = "".join((tmp_path / "run" / "logs" / f"worker-{i}.log").read_text() for i in range(WORKERS))
    assert "accuracy=" in worker_logs and "logloss=" in worker_logs

    # Export (what `psflow export` runs) and `psflow predict`: one line of 10 class probabilities per test
    # example, reproducing the eval accuracy.
    export_model(str(tmp_path / "ckpt"), str(tmp_path / "model"))
    r = run_cli("predict", str(tmp_path / "model"), digits.test, "--model", MODEL, "--output", str(tmp_path / "probs.txt"),
                timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    probs = np.loadtxt(tmp_path / "probs.txt")
    assert probs.shape == (360, 10)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-9)
    labels = read_all([digits.test], "tfrecord", **data_options(five_step_config(digits))).labels
    assert float(np.mean(probs.argmax(axis=1) == labels)) == pytest.approx(ev["accuracy"])
    # The launcher's evaluation and an evaluation of the exported variables agree.
    exported = load_model(str(tmp_path / "model"), search_path=str(REPO), model=MODEL)
    again = evaluate(exported.model, ArrayParameters(exported.values), exported.read(digits.test))
    assert again["accuracy"] == pytest.approx(ev["accuracy"]) and again["logloss"] == pytest.approx(ev["logloss"], rel=1e-6)
    assert os.path.getsize(tmp_path / "model" / "model.safetensors") > 0
