"""In-graph replication: the Session face and the worker's step allowlist; the client as the run's chief
(checkpoints, summaries, the restore at start, the last step's loss) and its recovery (issue 26, item 7): a
killed worker task, client, chief (the client) or ps task each end in a completed run from the newest
checkpoint, every record trained once, with the model of an undisturbed run.

Real ``psflow train`` runs on a9a (2 ps, 2 workers, batch 32, one epoch); every process is the launcher's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import A9A, A9A_T, run_cli
from test_recovery import A9A_RECORDS, check_run

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.variables import read_variables
from psflow.data import read_all
from psflow.rpc.api import ConnectConfig, InvalidArgumentError
from psflow.train.config import TrainConfig
from psflow.train.in_graph import BUILTIN_STEPS, Session
from psflow.train.summary import read_scalars
from psflow.train.worker import connect_client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_session_runs_named_steps_and_refuses_others(local_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    handle = local_cluster(1, 1)
    config = TrainConfig.flat(train=(str(A9A),), num_features=124, num_ps=1, num_workers=1, replication="in-graph")
    path = tmp_path / "config.json"
    path.write_text(config.to_json())
    handle.start("worker", 0, "--config", str(path))
    from psflow.train.build import build_model

    _, variables = build_model(config, handle.cluster)
    client = connect_client(config, handle.cluster, variables, "test client", handle.token)  # registers (chief)
    session = Session(f"grpc://{handle.cluster.task_address('worker', 0)}", task="/job:worker/task:0",
                      config=ConnectConfig(token=handle.token, connect_timeout=30))
    session.connect()
    batch = read_all([str(A9A)], "libsvm").slice(0, 32)
    reply, grads = session.run(BUILTIN_STEPS[0], batch, push=False)
    assert set(grads) == {"weights", "bias"} and np.asarray(reply.outputs["predictions"]).shape == (32,)
    assert client.global_step() == 0  # returned, not pushed
    reply, _ = session.run(BUILTIN_STEPS[0], batch, push=True)
    assert reply.step == 1 and client.global_step() == 1
    for bad in ("os:system", "psflow.train.in_graph:average_gradients"):
        with pytest.raises(InvalidArgumentError, match="is not allowed on this worker"):
            session.run(bad, batch, push=True)
    assert client.global_step() == 1
    session.close()
    client.close()


def train(out: Path, mode: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """``psflow train --replication in-graph`` on a9a: 2 ps, 2 workers, batch 32, one epoch, checkpoints
    every 250 steps in ``out/ckpt``, the eval on a9a.t."""
    return run_cli("train", "--train", str(A9A), "--eval", str(A9A_T), "--num-features", "124", "--replication",
                   "in-graph", "--mode", mode, "--ps", "2", "--workers", "2", "--batch-size", "32", "--epochs", "1",
                   "--output", str(out), "--checkpoint-dir", str(out / "ckpt"), "--save-checkpoints-steps", "250",
                   "--quiet", *extra, timeout=150)


def client_steps(out: Path) -> list[tuple[int, str]]:
    """Every ``step=S loss=L`` the client logged, in order."""
    text = (out / "logs" / "client-0.log").read_text()
    return [(int(s), loss) for s, loss in re.findall(r"in-graph client: step=(\d+) loss=(\S+)", text)]


_UNDISTURBED: dict[str, Path] = {}


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``undisturbed(mode)``: the run directory of an undisturbed run in ``mode`` (made once per module)."""
    def run(mode: str) -> Path:
        if mode not in _UNDISTURBED:
            out = tmp_path_factory.mktemp(f"undisturbed-{mode}")
            r = train(out, mode, "--log-every", "1")
            assert r.returncode == 0, r.stderr[-3000:]
            _UNDISTURBED[mode] = out
        return _UNDISTURBED[mode]

    return run


def test_the_client_checkpoints_writes_the_chiefs_summaries_and_reports_the_last_steps_loss(
        undisturbed: Any, tmp_path: Path) -> None:
    out = undisturbed("async")
    metrics = json.loads((out / "metrics.json").read_text())
    # Async: one step per worker's slice, every record once.
    assert metrics["global_step"] == 2 * 509 and metrics["ps"][0]["examples"] == A9A_RECORDS, metrics
    assert metrics["eval_not_done"] == [] == metrics["client"][0]["eval_not_done"], metrics  # every evaluation made
    # Checkpoints at the cadence asked, the last one final, at the last step, after every record.
    pointer = json.loads((out / "ckpt" / "checkpoint").read_text())
    # ckpt-0 is kept as the full checkpoint the five newest (increments: --full-checkpoint-every 10) build on.
    assert pointer["all"] == ["ckpt-000000000", "ckpt-000000250", "ckpt-000000500", "ckpt-000000750",
                              "ckpt-000001000", "ckpt-000001018"], pointer
    final = read_manifest(str(out / "ckpt" / "ckpt-000001018"))
    assert final.final and final.global_step == 1018 and final.examples == A9A_RECORDS
    assert set(final.reader_positions) == {"in-graph client"}, final.reader_positions
    middle = read_manifest(str(out / "ckpt" / "ckpt-000000500"))
    assert middle.examples == 250 * 64  # a checkpoint holds whole batches: 250 batches of 64 for steps 1-500
    # The chief's summaries.
    (run_dir,) = (out / "summaries").iterdir()
    scalars = read_scalars(str(run_dir))
    for tag in ("train/loss", "train/loss_ema", "train/examples_per_sec", "learning_rate", "ps/1/pushes_per_sec"):
        assert scalars.get(tag), (tag, sorted(scalars))
    # The final loss is the last step's, as the client logged it (--log-every 1: every step).
    logged = client_steps(out)
    assert [s for s, _ in logged] == list(range(1, 1019))
    assert f"{metrics['last_step_loss']:.4f}" == logged[-1][1]
    assert scalars["train/loss"][-1][0] == 1018 and f"{scalars['train/loss'][-1][1]:.4f}" == logged[-1][1]
    # The worker tasks were told the run is over (Shutdown) and exited 0, rather than waited for and then
    # stopped by SIGTERM, as the ps tasks are.
    for i in range(2):
        log = (out / "logs" / f"worker-{i}.log").read_text()
        assert "SIGTERM" not in log and f"/job:worker/task:{i}: stopped" in log, log[-2000:]

    # A second run on a copy of the checkpoints, two epochs: the client restores the newest at start and
    # trains the second epoch only.
    ckpt = tmp_path / "run" / "ckpt"
    shutil.copytree(out / "ckpt", ckpt)
    r = train(tmp_path / "run", "async", "--epochs", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    client_log = (tmp_path / "run" / "logs" / "client-0.log").read_text()
    assert re.search(r"in-graph client: restored checkpoint \S+ckpt-000001018 at step 1018", client_log), client_log
    resumed = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert resumed["ps"][0]["examples"] == 2 * A9A_RECORDS and resumed["global_step"] == 2 * 1018, resumed
    assert resumed["client"][0]["examples"] == A9A_RECORDS


#: (mode, --chaos target, the task killed, the step): after the checkpoint at 250 or 500.
KILLS = {"worker": ("async", "worker:1", "/job:worker/task:1", 600),
         "client": ("async", "client:0", "/job:client/task:0", 600),
         "chief": ("sync", "chief", "/job:client/task:0", 300),
         "ps": ("async", "ps:1", "/job:ps/task:1", 600)}


@pytest.mark.parametrize("victim", sorted(KILLS))
def test_a_killed_task_ends_in_a_completed_run_with_the_undisturbed_model(victim: str, undisturbed: Any,
                                                                        tmp_path: Path) -> None:
    mode, target, task, step = KILLS[victim]
    baseline = undisturbed(mode)
    out = tmp_path / "run"
    r = train(out, mode, "--log-every", "10", "--restart-policy", "on-failure", "--chaos", f"kill:{target}@step={step}")
    assert r.returncode == 0, r.stderr[-3000:]
    base_metrics = json.loads((baseline / "metrics.json").read_text())
    metrics = check_run(out, base_metrics["eval"]["auc"], logs="client-*.log", epochs=1)  # exactly-once, as between-graph
    (fault,) = metrics["faults"]
    assert fault["task"] == task and fault["signal"] == "SIGKILL" and fault["recovery_seconds"] is not None, fault
    # A dead ps task makes the client fail; its restart restores the cluster.
    restarted = [task] if victim != "ps" else [task, "/job:client/task:0"]
    assert [(e["task"], e["restarted"]) for e in metrics["restarts"]] == [(t, True) for t in restarted], \
        metrics["restarts"]
    log = (out / "logs" / "client-0.log").read_text()
    if task == "/job:worker/task:1":
        # The client waited for the restarted worker and ran its slice again; nothing was redone.
        assert "/job:worker/task:1 ran the slice again" in log, log[-3000:]
        assert metrics["global_step"] == base_metrics["global_step"]
    else:
        # The restarted client restored the newest checkpoint onto every ps task and went on from there.
        restored = re.findall(r"restored checkpoint \S+ckpt-(\d+) \(step (\d+)\) onto every ps task", log)
        assert len(restored) == 1 and int(restored[0][1]) < fault["at_step"], restored
        assert metrics["client"][0]["restored"].endswith(f"ckpt-{restored[0][0]}"), metrics["client"]
        # Its process trained the records after the checkpoint's (32 examples a step in async mode, 64 in sync).
        per_step = 64 if mode == "sync" else 32
        assert metrics["client"][0]["examples"] == A9A_RECORDS - int(restored[0][1]) * per_step, metrics["client"]
    # Every record was trained once, in the order of the undisturbed run: the same model.
    ours = read_variables(latest_checkpoint(str(out / "ckpt")) or "")
    theirs = read_variables(latest_checkpoint(str(baseline / "ckpt")) or "")
    for name, value in theirs.items():
        np.testing.assert_allclose(ours[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
