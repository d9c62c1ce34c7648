"""A ps task that lost its variables with no checkpoint stops the run (issue 25, item 2), without sockets:
ps services in this process, a "restart" is a fresh service behind the same channel."""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pytest
from two_ps_in_process import SGD, restart_ps, train_a_step, two_ps_cluster

from psflow.checkpoint.save import CheckpointManager
from psflow.coord import Lease
from psflow.launch.resilience import ResilienceConfig, with_recovery_checkpoints
from psflow.launch.supervisor import STATE_LOST_EXIT_CODE, RestartConfig, decide
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.chief import join_cluster
from psflow.train.config import TrainConfig
from psflow.train.recovery import ClusterRecovery
from psflow.train.state_loss import StateLostError


def test_the_chief_never_initializes_an_empty_ps_task_beside_trained_ones() -> None:
    client, services = two_ps_cluster()
    assert join_cluster(client, SGD, chief=True).created
    train_a_step(client)
    trained = client.pull({"weights": None})["weights"].copy()
    fresh = restart_ps(client, services, 1)
    with pytest.raises(StateLostError) as e:  # the chief's process restarted too: it joins again
        join_cluster(client, SGD, chief=True)
    assert str(e.value) == (
        "/job:ps/task:1 restarted with no checkpoint to restore from (the run has no --checkpoint-dir): its variables "
        "(bias) would be fresh beside trained ones on /job:ps/task:0; rerun with --checkpoint-dir")
    assert not fresh.registered and not fresh.ready   # nothing was created there
    assert np.array_equal(client.pull({"weights": None})["weights"], trained)  # nor changed on ps task 0


def test_with_a_checkpoint_directory_that_has_none_yet_the_message_says_so(tmp_path: Path) -> None:
    client, services = two_ps_cluster()
    join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path))
    restart_ps(client, services, 0)  # ps task 0 (global_step) this time: ps task 1 keeps its variables
    with pytest.raises(StateLostError, match=rf"^/job:ps/task:0 restarted with no checkpoint to restore from \(none "
                                             rf"in --checkpoint-dir {tmp_path} yet\): its variables \(weights\) would "
                                             r"be fresh beside trained ones on /job:ps/task:1; rerun"):
        join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path))


def test_a_chief_that_died_while_initializing_initializes_again() -> None:
    """ps task 0 registered but not ready (the chief died before the others were created): no loss."""
    client, services = two_ps_cluster()
    client.channels[0].call("Register", {"layout": [p.to_json() for p in client.layout.values()],
                                         "optimizer": SGD.to_json(), "client": "dead chief", "chief": True,
                                         "defer_ready": True})
    assert services[0].registered and not services[0].ready and not services[1].registered
    assert join_cluster(client, SGD, chief=True).created
    assert all(s.ready for s in services)


def test_the_chief_marks_ps_task_0_ready_last() -> None:
    """A ready ps task 0 means every task was initialized (non-chiefs ask it first)."""
    client, services = two_ps_cluster()
    order: list[int] = []
    for i, service in enumerate(services):
        handlers = dict(service.handlers())
        set_ready = handlers["SetReady"]
        handlers["SetReady"] = lambda frame, i=i, set_ready=set_ready: (order.append(i), set_ready(frame))[1]
        client.channels[i] = InProcessChannel(f"/job:ps/task:{i}", handlers)
    join_cluster(client, SGD, chief=True)
    assert order == [1, 0]


def _lease() -> Lease:
    return Lease("chief", "/job:worker/task:0", "/job:worker/task:0#1", 7, 10.0, time.monotonic() + 10.0)


def test_every_worker_stops_at_once_when_the_run_has_no_checkpoint_directory() -> None:
    client, services = two_ps_cluster()
    join_cluster(client, SGD, chief=True)
    train_a_step(client)
    restart_ps(client, services, 1)
    recovery = ClusterRecovery(client, SGD, checkpoint_dir=None, leader=lambda: None, timeout=600.0)
    assert recovery.needed()
    started = time.monotonic()
    with pytest.raises(StateLostError, match=r"^/job:ps/task:1 restarted .*beside trained ones on /job:ps/task:0"):
        recovery.wait()   # not a chief, and no 600 s wait for one: no checkpoint can exist
    assert time.monotonic() - started < 60
    assert not services[1].registered


def test_the_chief_restoring_with_no_checkpoint_yet_stops_the_run(tmp_path: Path) -> None:
    client, services = two_ps_cluster()
    join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path))
    train_a_step(client)
    restart_ps(client, services, 1)
    recovery = ClusterRecovery(client, SGD, checkpoint_dir=str(tmp_path), leader=_lease, timeout=600.0)
    with pytest.raises(StateLostError, match=r"\(none in --checkpoint-dir .* yet\)"):
        recovery.wait()
    assert not services[1].registered


def test_the_chief_restores_every_task_when_there_is_a_checkpoint(tmp_path: Path) -> None:
    """The guard does not get in the way of a restore."""
    client, services = two_ps_cluster()
    join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path))
    CheckpointManager(str(tmp_path)).save(client)
    saved = client.pull({"bias": None})["bias"].copy()
    train_a_step(client)
    restart_ps(client, services, 1)
    recovery = ClusterRecovery(client, SGD, checkpoint_dir=str(tmp_path), leader=_lease, timeout=60.0)
    restored, _ = recovery.wait()
    assert restored and services[1].ready and np.array_equal(client.pull({"bias": None})["bias"], saved)


def test_a_task_that_found_the_state_lost_is_never_restarted() -> None:
    policy = RestartConfig("on-failure", max_restarts=5)
    assert decide(policy, 1, 0).restart
    decision = decide(policy, STATE_LOST_EXIT_CODE, 0)
    assert not decision.restart and "no checkpoint" in decision.reason


def test_a_restart_policy_gives_a_run_without_checkpoint_dir_one_in_its_run_directory(tmp_path: Path) -> None:
    config = TrainConfig.flat(train=("x",))
    on_failure = ResilienceConfig(restart=RestartConfig("on-failure"))
    out = io.StringIO()
    got = with_recovery_checkpoints(config, on_failure, str(tmp_path / "run"), out=out)
    assert got.checkpoint.dir == str(tmp_path / "run" / "checkpoints")
    assert out.getvalue() == (f"psflow: --restart-policy on-failure without --checkpoint-dir: checkpoints go to "
                              f"{tmp_path / 'run' / 'checkpoints'}, so a ps task that dies is restored from the newest\n")
    assert with_recovery_checkpoints(config, ResilienceConfig(), str(tmp_path), out=out) is config   # never
    mine = TrainConfig.flat(train=("x",), checkpoint_dir="mine")
    assert with_recovery_checkpoints(mine, on_failure, str(tmp_path), out=out) is mine
