"""Towers and gradient clipping through `psflow train`, on real ps tasks (issue 26, items 4 and 5).

* **towers.** One worker with ``--towers 1``, ``2`` and ``4`` (CPU towers, in threads) trains the CNN of
  examples/cnn_digits.py for 20 steps of plain SGD on the same batches: the three models agree (the towers'
  gradients, each slice's weighted by its share of the batch, sum to the whole batch's).
* **clipping.** ``--clip-gradient-norm`` clips each worker's gradient before its push, by TensorFlow's
  ``clip_by_global_norm``: a run's variables equal a direct computation -- the model's own gradients, clipped
  per worker, averaged over the workers in sync mode, SGD -- between-graph (2 sync workers: each clips its own),
  ``--in-process`` (the numpy logistic model: a sparse gradient and a dense one) and in-graph (2 worker tasks
  clip their slices' gradients; the client averages them).
* **errors.** ``--device cuda`` where PyTorch sees no GPU, and towers for a numpy model, are one line each from
  the launcher before any task starts.

Every run sets ``PSFLOW_TORCH_THREADS=1``: the processes share two cores.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import REPO, ClusterHandle, run_cli

from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.variables import read_variables
from psflow.cluster import ClusterSpec
from psflow.data import Batch, read_all
from psflow.gradients import DenseGradient, Gradients
from psflow.models.registry import model_class
from psflow.optim import OptimizerSpec
from psflow.ps.client import ParameterClient
from psflow.ps.initializers import initial_value
from psflow.ps.optimizers import make_optimizer
from psflow.rpc.api import ConnectConfig
from psflow.train.build import build_model, data_options
from psflow.train.clipping import clip_by_global_norm
from psflow.train.config import TrainConfig
from psflow.train.evaluation import ArrayParameters
from psflow.train.in_graph import average_gradients

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MODEL = "examples.cnn_digits:DigitsCNN"
LEARNING_RATE = 0.2
CLIP = 0.25          # below the CNN's gradient norms here (checked: every step of the references clips)
RTOL, ATOL = 1e-5, 1e-7
cnn_digits = sys.modules[model_class(MODEL, search_path=str(REPO)).__module__]


@dataclass(frozen=True)
class Digits:
    twenty_steps: str    # 20 x 32 training examples, one file
    five_steps: str      # the first 5 x 32 of them
    schema: str


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Digits:
    out = tmp_path_factory.mktemp("digits")
    x, y, _, _ = cnn_digits.load_split()
    cnn_digits.write_records(out / "twenty.tfrecord", x[:640], y[:640])
    cnn_digits.write_records(out / "five.tfrecord", x[:160], y[:160])
    return Digits(str(out / "twenty.tfrecord"), str(out / "five.tfrecord"), str(cnn_digits.write_schema(out / "schema.yaml")))


@pytest.fixture(autouse=True)
def one_torch_thread(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every process of a run (they inherit the environment) and this one run PyTorch on one thread."""
    before = torch.get_num_threads()
    monkeypatch.setenv("PSFLOW_TORCH_THREADS", "1")
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def train(out: Path, *args: str) -> tuple[dict[str, Any], dict[str, np.ndarray], str]:
    """``psflow train ... --output out/run --checkpoint-dir out/ckpt``: its metrics, final variables and worker logs."""
    r = run_cli("train", "--output", str(out / "run"), "--checkpoint-dir", str(out / "ckpt"), "--quiet", "--no-status",
                "--log-every", "1", *args, timeout=200)
    assert r.returncode == 0, r.stderr[-4000:]
    checkpoint = latest_checkpoint(str(out / "ckpt"))
    assert checkpoint is not None
    logs = "".join(p.read_text() for p in sorted((out / "run" / "logs").glob("worker-*.log")))
    return json.loads((out / "run" / "metrics.json").read_text()), read_variables(checkpoint), logs


def cnn_args(digits: Digits, data: str, *args: str) -> list[str]:
    return ["--model", MODEL, "--format", "tfrecord", "--schema", digits.schema, "--train", data, "--epochs", "1",
            "--optimizer", "sgd", "--learning-rate", str(LEARNING_RATE), *args]


def compare(trained: dict[str, np.ndarray], want: dict[str, np.ndarray], what: str) -> None:
    assert set(want) <= set(trained), f"{what}: {sorted(trained)}"
    for name, value in want.items():
        np.testing.assert_allclose(np.asarray(trained[name]).reshape(value.shape), value, rtol=RTOL, atol=ATOL,
                                   err_msg=f"{what}: {name}")


# --- towers -------------------------------------------------------------------------------------------------
def test_one_two_and_four_cpu_towers_train_the_same_model_in_20_steps(digits: Digits, tmp_path: Path) -> None:
    runs = {}
    for towers in (1, 2, 4):
        metrics, variables, logs = train(tmp_path / f"towers{towers}", *cnn_args(
            digits, digits.twenty_steps, "--ps", "2", "--workers", "1", "--batch-size", "32", "--towers", str(towers)))
        assert metrics["global_step"] == 20 and metrics["examples"] == 640
        assert (f"{towers} towers: cpu, cpu" in logs) == (towers > 1), logs[-2000:]  # the towers did the steps
        runs[towers] = variables
    start = build_model(TrainConfig.flat(train=(digits.twenty_steps,), format="tfrecord", schema=digits.schema, model=MODEL,
                                         model_path=str(REPO)), ClusterSpec({"ps": ["127.0.0.1:1"]}))[0].initial_values()
    assert np.abs(runs[1]["conv1/weight"] - start["conv1/weight"]).max() > 1e-3  # 20 steps moved the model
    for towers in (2, 4):
        compare(runs[towers], runs[1], f"{towers} towers against 1")


# --- clipping -----------------------------------------------------------------------------------------------
def reference(config: TrainConfig, steps: Sequence[Sequence[Batch]], clip: float) -> dict[str, np.ndarray]:
    """Direct SGD: per step, each worker's gradient of its batch (the model's own), clipped by global norm,
    averaged over the workers (sparse rows summed, then divided), applied once. Every step must clip."""
    model, variables = build_model(config, ClusterSpec({"ps": ["127.0.0.1:1"]}))
    values = {p.var.name: initial_value(dict(p.var.initializer), p.var.shape, 0, p.num_rows, p.var.dtype)
              for p in variables.placements()}
    values.update({k: np.array(v, np.float32) for k, v in model.initial_values().items()})
    sgd = make_optimizer(OptimizerSpec("sgd", {"learning_rate": LEARNING_RATE}))
    slots = {name: sgd.create_slots(v) for name, v in values.items()}
    for batches in steps:
        clipped: list[Gradients] = []
        for batch in batches:
            batch = model.prepare(batch)
            out = model.compute(batch, ArrayParameters(values).pull(model.lookups(batch)))
            grads, norm = clip_by_global_norm(out.gradients, clip)
            assert norm > clip, f"the reference step did not clip (norm {norm})"
            clipped.append(grads)
        for name, g in (average_gradients(clipped) if len(clipped) > 1 else clipped[0]).items():
            if isinstance(g, DenseGradient):
                sgd.apply_dense(values[name], slots[name], g.values)
            else:
                sgd.apply_sparse(values[name], slots[name], g.rows, g.values)
    return values


def digits_config(digits: Digits, **kw: Any) -> TrainConfig:
    return TrainConfig.flat(train=(digits.five_steps,), format="tfrecord", schema=digits.schema, model=MODEL,
                            model_path=str(REPO), optimizer="sgd", learning_rate=LEARNING_RATE, num_ps=2, **kw)


def test_sync_workers_each_clip_their_own_gradient(digits: Digits, tmp_path: Path) -> None:
    """2 workers of 16, sync: worker i reads records i, i+2, ... of the one file; each clips, the ps tasks average."""
    config = digits_config(digits, batch_size=16, num_workers=2, mode="sync", clip_gradient_norm=CLIP)
    data = read_all([digits.five_steps], "tfrecord", **data_options(config))
    steps = [[data.take(np.arange(32 * k + i, 32 * k + 32, 2)) for i in range(2)] for k in range(5)]
    metrics, trained, logs = train(tmp_path, *cnn_args(digits, digits.five_steps, "--ps", "2", "--workers", "2",
                                                       "--batch-size", "16", "--mode", "sync",
                                                       "--clip-gradient-norm", str(CLIP)))
    assert metrics["global_step"] == 5 and metrics.get("stale_dropped", 0) == 0
    assert "grad_norm=" in logs, logs[-2000:]  # the norm before clipping, in the step lines
    compare(trained, reference(config, steps, CLIP), "sync, 2 workers")


def test_in_process_clips_a_numpy_models_sparse_and_dense_gradients(tmp_path: Path) -> None:
    a9a = REPO / "data" / "a9a" / "a9a"
    if not a9a.exists():
        pytest.skip(f"{a9a} is absent")
    path = tmp_path / "a9a_320.libsvm"
    path.write_text("".join(a9a.read_text().splitlines(keepends=True)[:320]))
    clip = 0.05
    config = TrainConfig.flat(train=(str(path),), num_features=124, model="logistic", optimizer="sgd", learning_rate=LEARNING_RATE,
                              batch_size=64, num_ps=2, num_workers=1, clip_gradient_norm=clip)
    data = read_all([str(path)], "libsvm", **data_options(config))
    steps = [[data.slice(64 * k, 64 * k + 64)] for k in range(5)]
    metrics, trained, _ = train(tmp_path, "--train", str(path), "--num-features", "124", "--model", "logistic",
                                "--optimizer", "sgd", "--learning-rate", str(LEARNING_RATE), "--batch-size", "64",
                                "--ps", "2", "--in-process", "--clip-gradient-norm", str(clip))
    assert metrics["global_step"] == 5
    compare(trained, reference(config, steps, clip), "--in-process, logistic")


def test_in_graph_workers_clip_their_slices_before_the_client_averages(digits: Digits, local_cluster: Any,
                                                                        tmp_path: Path) -> None:
    """In-graph sync: the client reads 32, gives each worker task 16 contiguous examples; each clips its gradient."""
    handle: ClusterHandle = local_cluster(2, 2)
    config = digits_config(digits, batch_size=16, num_workers=2, mode="sync", replication="in-graph",
                           clip_gradient_norm=CLIP, log_every=1)
    path = tmp_path / "config.json"
    path.write_text(config.to_json())
    for i in range(2):
        handle.start("worker", i, "--config", str(path))
    client_proc = handle.start("client", 0, "--config", str(path), "--result", str(tmp_path / "client.json"))
    assert client_proc.wait(timeout=120) == 0, handle.log("client", 0)[-4000:]
    _, variables = build_model(config, handle.cluster)
    client = ParameterClient(handle.cluster, variables.placements(), client_name="test",
                             config=ConnectConfig(token=handle.token, connect_timeout=30))
    try:
        client.connect()
        assert client.global_step() == 5
        trained = client.pull(dict.fromkeys(p.var.name for p in variables.placements()))
    finally:
        client.close()
    data = read_all([digits.five_steps], "tfrecord", **data_options(config))
    steps = [[data.slice(32 * k, 32 * k + 16), data.slice(32 * k + 16, 32 * k + 32)] for k in range(5)]
    compare(trained, reference(config, steps, CLIP), "in-graph sync")


# --- errors -------------------------------------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the line where PyTorch sees no GPU")
def test_device_cuda_without_a_gpu_is_one_line_before_any_task_starts(digits: Digits, tmp_path: Path) -> None:
    r = run_cli("train", *cnn_args(digits, digits.five_steps), "--device", "cuda", "--output", str(tmp_path / "run"),
                timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip() == ("psflow train: error: --device cuda: PyTorch sees no GPU "
                                "(torch.cuda.is_available() is False)"), r.stderr
    assert not (tmp_path / "run").exists()  # nothing started


@pytest.mark.parametrize(("flags", "line"), [
    (("--towers", "2"), "--towers 2: model 'logistic' computes with numpy on the CPU, in one replica: towers and "
                        "devices (cpu, cpu) need a PyTorch model (psflow.torch.TorchModel)"),
    (("--device", "gpu"), "--device: unknown device 'gpu' (want cpu, cuda or cuda:N)"),
    (("--devices", "cpu,cpu", "--towers", "3"), "--devices cpu,cpu gives a tower per device: leave out --device and --towers"),
    (("--clip-gradient-norm", "0"), "--clip-gradient-norm must be a finite number > 0, got 0.0"),
])
def test_bad_device_and_clip_flags_are_one_line(flags: tuple[str, ...], line: str, tmp_path: Path) -> None:
    data = tmp_path / "d.libsvm"
    data.write_text("1 3:1 11:1\n0 5:1 7:1\n" * 10)
    r = run_cli("train", "--train", str(data), "--num-features", "124", "--output", str(tmp_path / "run"), *flags,
                timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip() == f"psflow train: error: {line}", r.stderr
