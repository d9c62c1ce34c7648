"""Synchronous and bounded-staleness training on real processes.

Workers are real task processes (``handle.start("worker", i, ...)``) talking to
real ps processes; the test then reads the model back over gRPC.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import A9A, ClusterHandle, wait_until

from psflow.data import read_all
from psflow.gradients import SparseGradient
from psflow.optim import OptimizerSpec
from psflow.ps.client import ParameterClient
from psflow.ps.initializers import initial_value
from psflow.ps.optimizers import make_optimizer
from psflow.rpc.api import ConnectConfig
from psflow.train.build import build_model
from psflow.train.config import TrainConfig
from psflow.train.evaluation import ArrayParameters
from psflow.train.faults import NO_FAULTS, FaultInjection, task_config_json

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROWS = 3072  # divisible by 2*64 and 3*64: every worker batch is full


def small_a9a(tmp: Path) -> Path:
    path = tmp / "a9a_small.libsvm"
    path.write_text("".join(A9A.read_text().splitlines(keepends=True)[:ROWS]))
    return path


def write_config(tmp: Path, faults: FaultInjection = NO_FAULTS, **kw: Any) -> tuple[TrainConfig, Path]:
    config = TrainConfig.flat(**kw)
    path = tmp / "config.json"
    path.write_text(task_config_json(config, faults))
    return config, path


def run_workers(handle: ClusterHandle, config_path: Path, n: int, timeout: float = 120) -> list[dict[str, Any]]:
    procs = [handle.start("worker", i, "--config", str(config_path), "--result", str(handle.workdir / f"r{i}.json"))
             for i in range(n)]
    for i, p in enumerate(procs):
        assert p.wait(timeout=timeout) == 0, handle.log("worker", i)[-3000:]
    return [json.loads((handle.workdir / f"r{i}.json").read_text()) for i in range(n)]


def pull_model(handle: ClusterHandle, config: TrainConfig) -> dict[str, Any]:
    _, variables = build_model(config, handle.cluster)
    client = ParameterClient(handle.cluster, variables.placements(), client_name="test",
                             config=ConnectConfig(token=handle.token, connect_timeout=20))
    try:
        client.connect()
        model: dict[str, Any] = client.pull(dict.fromkeys(p.var.name for p in variables.placements()))
        model["stats"] = client.stats()
        return model
    finally:
        client.close()


def single_process(config: TrainConfig, path: Path, workers: int) -> dict[str, np.ndarray]:
    """Trains the run's model in one process on the combined batch of all workers (the reference).

    Same initial values (the ps tasks' initializers), same optimizers (each variable's, else the run's).
    """
    model, variables = build_model(config, _one_ps())
    data = read_all([str(path)], "libsvm")
    values, optimizers, slots = {}, {}, {}
    for p in variables.placements():
        values[p.var.name] = initial_value(dict(p.var.initializer), p.var.shape, 0, p.num_rows, p.var.dtype)
        spec = OptimizerSpec.from_json(p.var.optimizer) if p.var.optimizer else config.optimizer_spec()
        optimizers[p.var.name] = make_optimizer(spec)
        slots[p.var.name] = optimizers[p.var.name].create_slots(values[p.var.name])
    big = config.data.batch_size * workers
    for start in range(0, data.num_examples, big):
        batch = model.prepare(data.slice(start, min(start + big, data.num_examples)))
        out = model.compute(batch, ArrayParameters(values).pull(model.lookups(batch)))
        for name, grad in out.gradients.items():
            if isinstance(grad, SparseGradient):
                optimizers[name].apply_sparse(values[name], slots[name], grad.rows, grad.values)
            else:
                optimizers[name].apply_dense(values[name], slots[name], grad.values)
    return values


def _one_ps() -> Any:
    from psflow.cluster import ClusterSpec

    return ClusterSpec({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]})


@pytest.mark.parametrize(("model", "workers", "optimizer"), [
    ("logistic", 2, "sgd"), ("logistic", 3, "sgd"), ("logistic", 2, "adagrad"), ("logistic", 3, "adagrad"),
    ("logistic", 2, "ftrl"), ("logistic", 3, "ftrl"), ("fm", 2, "adagrad"), ("fm", 3, "ftrl"),
])
def test_sync_equals_single_process_with_the_combined_batch(local_cluster, tmp_path: Path, model: str, workers: int,  # type: ignore[no-untyped-def]
                                                            optimizer: str) -> None:
    data = small_a9a(tmp_path)
    handle = local_cluster(2, workers)
    config, path = write_config(tmp_path, train=(str(data),), num_features=124, optimizer=optimizer, batch_size=64,
                                epochs=1, num_ps=2, num_workers=workers, mode="sync", partitions=2, log_every=10**6,
                                model=model, embedding_dim=4)
    results = run_workers(handle, path, workers)
    trained = pull_model(handle, config)
    reference = single_process(config, data, workers)
    assert trained["stats"]["global_step"] == ROWS // (64 * workers)
    assert sum(r["stale_dropped"] for r in results) == 0
    assert set(reference) == set(trained) - {"stats"}
    for name, value in reference.items():
        np.testing.assert_allclose(trained[name], value, rtol=0, atol=1e-6, err_msg=name)


def test_backup_worker_stale_gradients_dropped_and_fast_pair_not_held(local_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """3 workers, 2 replicas to aggregate; worker 2 is a straggler whatever the machine's speed (it pushes
    only once global_step moved 4 past its read, so every push of it is stale): each of its pushes is
    dropped and counted, the fast pair is never held nor dropped, and every step value belongs to one push."""
    handle = local_cluster(1, 3)
    config, path = write_config(tmp_path, train=(str(A9A),), num_features=124, batch_size=64, epochs=1, num_ps=1,
                                num_workers=3, mode="sync", replicas_to_aggregate=2, log_every=1, max_steps=60,
                                faults=FaultInjection(step_delay={0: 0.05, 1: 0.05}, step_lag={2: 4}))
    # The straggler first, so it is up before the fast pair's 60 steps (>= 3 s) are over.
    straggler = handle.start("worker", 2, "--config", str(path), "--result", str(handle.workdir / "r2.json"))
    wait_until(lambda: "model 'logistic'" in handle.log("worker", 2), "worker 2 started")
    fast = [handle.start("worker", i, "--config", str(path), "--result", str(handle.workdir / f"r{i}.json"))
            for i in range(2)]
    for i, proc in [(0, fast[0]), (1, fast[1]), (2, straggler)]:
        assert proc.wait(timeout=120) == 0, handle.log("worker", i)[-3000:]
    results = [json.loads((handle.workdir / f"r{i}.json").read_text()) for i in range(3)]
    stats = pull_model(handle, config)["stats"]
    assert stats["global_step"] >= 60  # type: ignore[index]
    slow = results[2]
    assert slow["local_steps"] >= 3 and slow["stale_dropped"] == slow["local_steps"], slow
    assert results[0]["stale_dropped"] == results[1]["stale_dropped"] == 0, results
    assert stats["stale_dropped"] == slow["stale_dropped"], stats  # type: ignore[index]
    assert slow["local_steps"] * 3 < stats["global_step"]  # type: ignore[index]
    logs = handle.log("worker", 0) + handle.log("worker", 1) + handle.log("worker", 2)
    steps = [int(s) for s in re.findall(r"\bstep=(\d+)", logs)]
    assert sorted(steps) == list(range(1, stats["global_step"] + 1))  # type: ignore[index]


@pytest.mark.parametrize("backup", [True, False])
def test_killed_worker_never_hangs_the_others(local_cluster, tmp_path: Path, backup: bool) -> None:  # type: ignore[no-untyped-def]
    handle = local_cluster(2, 3)
    config, path = write_config(
        tmp_path, train=(str(A9A),), num_features=124, batch_size=64, epochs=3, num_ps=2, num_workers=3,
        mode="sync", replicas_to_aggregate=2 if backup else 3, sync_timeout=3.0, on_timeout="fail", log_every=10,
        faults=FaultInjection(step_delay={1: 0.02}),
    )
    procs = [handle.start("worker", i, "--config", str(path), "--result", str(handle.workdir / f"r{i}.json"))
             for i in range(3)]
    deadline = time.monotonic() + 60
    while "step=10 " not in "".join(handle.log("worker", i) for i in range(3)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(p.poll() is None for p in procs), "the run must still be going when worker 1 is killed"
    handle.kill("worker", 1, signal.SIGKILL)
    killed_at = time.monotonic()
    codes = [procs[i].wait(timeout=120) for i in (0, 2)]
    if backup:
        assert codes == [0, 0], handle.log("worker", 0)[-2000:]
    else:
        assert codes != [0, 0]
        assert time.monotonic() - killed_at < 3.0 + 30
        failed = handle.log("worker", 0) + handle.log("worker", 2)
        assert "timed out after 3.0 s" in failed and "missing: /job:worker/task:1" in failed, failed[-3000:]


def test_ssp_no_worker_runs_more_than_k_ahead(local_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = small_a9a(tmp_path)
    handle = local_cluster(1, 3)
    config, path = write_config(tmp_path, train=(str(data),), num_features=124, batch_size=64, epochs=1, num_ps=1,
                                num_workers=3, mode="ssp", staleness=2, log_every=1,
                                faults=FaultInjection(step_delay={1: 0.05}))
    run_workers(handle, path, 3)
    pairs = []
    for i in range(3):
        pairs += [(int(c), int(m)) for c, m in re.findall(r"clock=(\d+) min_clock=(\d+)", handle.log("worker", i))]
    assert len(pairs) >= 40
    assert max(c - m for c, m in pairs) <= 2
    assert max(c - m for c, m in pairs) == 2  # the fast workers did run ahead, up to the bound
    stats = pull_model(handle, config)["stats"]
    assert sum(stats["staleness_histogram"].values()) == stats["global_step"]  # type: ignore[index]
