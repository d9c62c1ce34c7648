"""Chief duties end to end: init once, sharded checkpoints, restore anywhere, crash during save, kill and resume."""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path

import numpy as np
import pytest
from support import A9A, A9A_T, TOKEN, run_cli

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.variables import read_variables
from psflow.data import read_all
from psflow.ps.client import ParameterClient
from psflow.rpc.api import ConnectConfig
from psflow.train.build import build_model
from psflow.train.chief import join_cluster
from psflow.train.config import TrainConfig
from psflow.train.evaluation import evaluate
from psflow.train.faults import FaultInjection, task_config_json
from psflow.train.step import TrainStep

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _config(**kw: object) -> TrainConfig:
    base = dict(train=(str(A9A),), eval=(str(A9A_T),), num_features=124, optimizer="adagrad", batch_size=512,
                num_ps=2, num_workers=2, log_every=10, connect_timeout=30.0)
    base.update(kw)
    return TrainConfig.flat(**base)  # type: ignore[arg-type]


def _client(config: TrainConfig, handle, name: str = "/job:worker/task:0") -> ParameterClient:  # type: ignore[no-untyped-def]
    _, variables = build_model(config, handle.cluster)
    client = ParameterClient(handle.cluster, variables.placements(), client_name=name,
                             config=ConnectConfig(connect_timeout=30, token=TOKEN))
    client.connect()
    return client


def _train_in_process(client: ParameterClient, config: TrainConfig, steps: int) -> None:
    model, _ = build_model(config, client.cluster)
    batch = read_all([str(A9A)], "libsvm")
    step = TrainStep(model, client)
    for k in range(steps):
        lo = (k * 256) % 30000
        step(batch.slice(lo, lo + 256))


@pytest.mark.parametrize("transport", ["local", "rpc"])
def test_restore_onto_other_ps_counts_and_partitions_is_exact(local_cluster, tmp_path: Path, transport: str) -> None:  # type: ignore[no-untyped-def]
    config = _config(partitions=4, optimizer="adam")
    ckpt = tmp_path / "ckpt"
    from psflow.checkpoint.save import CheckpointManager

    source = local_cluster(2)
    client = _client(config, source)
    assert join_cluster(client, config.optimizer_spec(), chief=True, checkpoint_dir=str(ckpt)).created
    _train_in_process(client, config, 12)
    saved = CheckpointManager(str(ckpt), transport=transport).save(client, optimizer=config.optimizer_spec().to_json())
    client.shutdown_servers()
    client.close()
    want = read_variables(saved.path, slots=True)
    assert saved.global_step == 12 and read_manifest(saved.path).global_step == 12
    assert {"weights:m", "weights:v", "weights:beta1_power", "bias:v"} <= set(want)
    for num_ps, partitions, placement in [(1, 1, "round-robin"), (3, 3, "greedy"), (3, 4, "round-robin")]:
        target_config = config.with_(num_ps=num_ps, partitions=partitions, placement=placement)
        target = local_cluster(num_ps)
        chief = _client(target_config, target)
        result = join_cluster(chief, target_config.optimizer_spec(), chief=True, checkpoint_dir=str(ckpt))
        assert result.restored == saved.path and result.global_step == 12
        again = CheckpointManager(str(tmp_path / f"again-{num_ps}-{partitions}")).save(chief)
        got = read_variables(again.path, slots=True)
        assert set(got) == set(want)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name} after restore on {num_ps} ps")
        # A non-chief joins without initializing anything.
        other = _client(target_config, target, "/job:worker/task:1")
        assert join_cluster(other, target_config.optimizer_spec(), chief=False).created is False
        assert [chief.stats(i)["init_count"] for i in range(num_ps)] == [1] * num_ps
        chief.shutdown_servers()
        chief.close()
        other.close()


def test_initialization_happens_once_whatever_the_start_order(local_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = _config(num_workers=4, epochs=1)
    cfg = tmp_path / "config.json"
    cfg.write_text(config.to_json())
    handle = local_cluster(2, 4)
    order = [3, 1, 2]
    random.Random(7).shuffle(order)
    for i in order:  # the non-chiefs first: they must wait for the chief, not initialize
        handle.start("worker", i, "--config", str(cfg), "--result", str(tmp_path / f"r{i}.json"))
    time.sleep(1.0)  # the test (not a worker) waits, so the non-chiefs are already polling
    handle.start("worker", 0, "--config", str(cfg), "--result", str(tmp_path / "r0.json"))
    for i in range(4):
        assert handle.procs[("worker", i)].wait(timeout=120) == 0, handle.logs()
    client = _client(config, handle, "test")
    assert [client.stats(i)["init_count"] for i in (0, 1)] == [1, 1]
    client.close()


def test_crash_during_save_leaves_previous_checkpoint_restorable(tmp_path: Path) -> None:
    ckpt, common = tmp_path / "ckpt", ["--train", str(A9A), "--num-features", "124", "--ps", "2", "--workers", "1",
                                        "--quiet", "--optimizer", "adagrad"]
    r = run_cli("train", *common, "--max-steps", "10", "--checkpoint-dir", str(ckpt), "--output", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr[-2000:]
    first = latest_checkpoint(str(ckpt))
    assert first is not None
    before = read_variables(first, slots=True)
    for phase in ("shards_written", "manifest_written"):
        r = run_cli("train", *common, "--max-steps", "30", "--save-checkpoints-steps", "5", "--checkpoint-dir",
                     str(ckpt), "--fault-point", phase, "--output", str(tmp_path / phase))
        assert r.returncode != 0 and "exited with code 75" in r.stderr, r.stderr[-2000:]
        assert latest_checkpoint(str(ckpt)) == first  # the pointer still names the previous checkpoint
        after = read_variables(first, slots=True)
        for name in before:
            np.testing.assert_array_equal(after[name], before[name])
        # the first run's initial (step 0) and final checkpoints, and the interrupted one beside them, never restored
        assert len(list(ckpt.glob("ckpt-*"))) == 3
    r = run_cli("train", *common, "--max-steps", "20", "--checkpoint-dir", str(ckpt), "--output", str(tmp_path / "c"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"restored checkpoint {first} at step 10" in (tmp_path / "c" / "logs" / "worker-0.log").read_text()
    assert read_manifest(latest_checkpoint(str(ckpt)) or "").global_step >= 20


def test_kill_whole_cluster_then_resume_matches_uninterrupted_run(local_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    common = ["--train", str(A9A), "--eval", str(A9A_T), "--num-features", "124", "--ps", "2", "--workers", "2",
              "--epochs", "2", "--quiet"]
    r = run_cli("train", *common, "--output", str(tmp_path / "whole"))
    assert r.returncode == 0, r.stderr[-2000:]
    whole = json.loads((tmp_path / "whole" / "metrics.json").read_text())
    ckpt = tmp_path / "ckpt"
    slow = _config(epochs=2, optimizer="ftrl", checkpoint_dir=str(ckpt), save_checkpoints_steps=15)
    cfg = tmp_path / "slow.json"
    cfg.write_text(task_config_json(slow, FaultInjection(step_delay={0: 0.03, 1: 0.03})))
    handle = local_cluster(2, 2)
    for i in range(2):
        handle.start("worker", i, "--config", str(cfg), "--result", str(tmp_path / f"r{i}.json"))
    deadline = time.monotonic() + 60
    while (latest_checkpoint(str(ckpt)) is None or read_manifest(latest_checkpoint(str(ckpt)) or "").global_step < 40):
        assert time.monotonic() < deadline, handle.log("worker", 0)
        time.sleep(0.05)
    for job, index in list(handle.procs):
        handle.kill(job, index)  # SIGKILL: the whole cluster dies at once
    saved = latest_checkpoint(str(ckpt)) or ""
    step = read_manifest(saved).global_step
    assert 40 <= step < whole["global_step"]
    resumed_config = slow  # the same settings, without the slowing
    cfg.write_text(task_config_json(resumed_config))
    handle2 = local_cluster(2, 2)
    for i in range(2):
        handle2.start("worker", i, "--config", str(cfg), "--result", str(tmp_path / f"s{i}.json"))
    for i in range(2):
        assert handle2.procs[("worker", i)].wait(timeout=120) == 0, handle2.log("worker", i)
    assert re.search(rf"restored checkpoint {re.escape(saved)} at step {step}\b", handle2.log("worker", 0))
    client = _client(resumed_config, handle2, "test")
    model, _ = build_model(resumed_config, handle2.cluster)
    metrics = evaluate(model, client, read_all([str(A9A_T)], "libsvm"))
    # Each worker's data resumed where the checkpoint recorded it: the same number of steps in all.
    assert abs(client.global_step() - whole["global_step"]) <= 2
    assert abs(metrics["auc"] - whole["eval"]["auc"]) <= 0.002, (metrics, whole["eval"])
    client.close()
