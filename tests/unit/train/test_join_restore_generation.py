"""A restarted chief's join when ps task 0 came back empty and the run has a checkpoint (psflow.train.chief), in-process.

Its join restored the checkpoint and made the tasks ready with no new generation: a worker still training saw the
cluster settled at its old generation and failed, or had its next push admitted over a model rewound to the
checkpoint (its records since then lost, with no error). Within the run (a ps task kept its state), the join now
restores at a new generation as after any ps death; with no lease while there is an election, it leaves the restore
to the lease holder. A resumed run on a fresh cluster still restores at generation 0 and the checkpoint's step.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from two_ps_in_process import SGD, restart_ps, train_a_step, two_ps_cluster

from psflow.checkpoint.save import CheckpointManager
from psflow.gradients import DenseGradient
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import BeginRestoreRequest
from psflow.ps.service import ParameterService
from psflow.rpc.api import RpcError
from psflow.train.chief import join_cluster
from psflow.train.recovery import ClusterRecovery
from psflow.train.state_loss import ps_states

pytestmark = pytest.mark.timeout(60)


def _trained_past_a_checkpoint(tmp_path: Path) -> tuple[ParameterClient, list[ParameterService], np.ndarray]:
    """A cluster trained a step, checkpointed (its weights returned), then trained two more steps."""
    client, services = two_ps_cluster()
    join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path))
    train_a_step(client)
    CheckpointManager(str(tmp_path)).save(client)
    saved = client.pull({"weights": None})["weights"].copy()
    train_a_step(client)
    train_a_step(client)
    return client, services, saved


def _push_at(client: ParameterClient, generation: int) -> None:
    client.push({"weights": DenseGradient(np.ones((8, 2), np.float32)), "bias": DenseGradient(np.ones(2, np.float32))},
                generation=generation)


def test_within_the_run_the_join_restores_at_a_new_generation(tmp_path: Path) -> None:
    client, services, saved = _trained_past_a_checkpoint(tmp_path)
    restart_ps(client, services, 0)  # the chief and ps task 0 died together; ps task 1 kept its state
    joined = join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path))
    assert joined.restored is not None and not joined.restore_pending
    assert joined.generation is not None and joined.generation > 0
    assert {s.generation for s in ps_states(client).values() if s is not None} == {joined.generation}
    assert all(s.ready for s in services) and np.array_equal(client.pull({"weights": None})["weights"], saved)
    with pytest.raises(RpcError):  # a worker still at the old generation is refused, so it waits and is rewound
        _push_at(client, 0)
    _push_at(client, joined.generation)


def test_with_no_lease_the_join_leaves_the_restore_to_the_holder(tmp_path: Path) -> None:
    client, services, saved = _trained_past_a_checkpoint(tmp_path)
    restart_ps(client, services, 0)
    joined = join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path), leader=lambda: None, run="r")
    assert joined.restore_pending and joined.restored is None and joined.generation is None
    assert not services[0].ready  # nothing restored: the holder's restore reads ps task 0 not ready
    ClusterRecovery(client, SGD, checkpoint_dir=str(tmp_path), leader=lambda: None, timeout=30.0).restore(
        None, ps_states(client))  # the lease holder's (another worker's) restore
    chief = ClusterRecovery(client, SGD, checkpoint_dir=str(tmp_path), leader=lambda: None, timeout=30.0,
                            generation=joined.generation)
    chief.await_restore(None)  # the chief waits like a worker: the first settled generation is a restore
    assert chief.generation is not None and chief.generation > 0 and chief.restores == 0
    assert np.array_equal(client.pull({"weights": None})["weights"], saved)


def test_a_resumed_run_on_a_fresh_cluster_restores_at_generation_0_and_the_checkpoints_step(tmp_path: Path) -> None:
    client, services, saved = _trained_past_a_checkpoint(tmp_path)
    restart_ps(client, services, 0)
    restart_ps(client, services, 1)  # every task fresh, no journal: a new run resuming the checkpoint
    joined = join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path), run="another run")
    assert joined.restored is not None and joined.generation == 0 and joined.global_step == 1
    assert all(s.ready for s in services) and np.array_equal(client.pull({"weights": None})["weights"], saved)


def test_a_join_meeting_a_restore_in_progress_waits_for_it(tmp_path: Path) -> None:
    """A surviving worker's restore has begun (BeginRestore) when the restarted chief registers: its Register creates
    nothing there, and it neither restores nor reads the tasks as ready, but waits for that restore."""
    client, services, saved = _trained_past_a_checkpoint(tmp_path)
    restart_ps(client, services, 0)
    holder = ClusterRecovery(client, SGD, checkpoint_dir=str(tmp_path), leader=lambda: None, timeout=30.0)
    client.register(SGD, chief=True, defer_ready=True)
    for task in client.channels:  # the holder's restore, begun
        client.call(task, BeginRestoreRequest(1))
    joined = join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path))
    assert joined.restore_pending and joined.restored is None and not any(s.ready for s in services)
    holder.restore(None, ps_states(client))  # its restore, done (again, at a newer generation)
    chief = ClusterRecovery(client, SGD, checkpoint_dir=str(tmp_path), leader=lambda: None, timeout=30.0,
                            generation=joined.generation)
    chief.await_restore(None)
    assert chief.generation is not None and chief.generation > 0
    assert np.array_equal(client.pull({"weights": None})["weights"], saved)


def test_a_holders_restore_begun_during_a_resumed_joins_restore_is_left_to_finish(tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The join took the cluster for a fresh one (a resumed run: generation 0), and a lease holder's BeginRestore came
    between its Register and its SetReady: the join's SetReady (no generation) is refused, and it waits for that
    restore instead of opening the tasks in the middle of it (or failing the chief with the refusal)."""
    import psflow.train.chief as chief_module
    client, services, saved = _trained_past_a_checkpoint(tmp_path)
    restart_ps(client, services, 0)
    restart_ps(client, services, 1)
    real_restore = chief_module.restore

    def restore_then_the_holder_begins(*args, **kwargs):  # type: ignore[no-untyped-def]
        manifest = real_restore(*args, **kwargs)
        for task in client.channels:
            client.call(task, BeginRestoreRequest(5))
        return manifest
    monkeypatch.setattr(chief_module, "restore", restore_then_the_holder_begins)
    joined = join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path), run="another run")
    assert joined.restore_pending and joined.restored is None and not any(s.ready for s in services)


def test_a_holders_restore_begun_before_a_resumed_joins_loads_keeps_what_it_holds(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """As above, the holder's BeginRestore before the join's LoadShards: they carried no generation and overwrote the
    holder's restore (global_step set back to the checkpoint's under steps handed out since); now they carry
    generation 0 and are refused, nothing changed, and the join waits for that restore."""
    import psflow.train.chief as chief_module
    client, services, saved = _trained_past_a_checkpoint(tmp_path)
    restart_ps(client, services, 0)
    restart_ps(client, services, 1)
    real_restore = chief_module.restore

    def the_holder_begins_then_restore(*args, **kwargs):  # type: ignore[no-untyped-def]
        for task in client.channels:
            client.call(task, BeginRestoreRequest(5))
        return real_restore(*args, **kwargs)
    monkeypatch.setattr(chief_module, "restore", the_holder_begins_then_restore)
    before = [client.ps_stats(t).global_step for t in client.channels]
    joined = join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path), run="another run")
    assert joined.restore_pending and joined.restored is None and not any(s.ready for s in services)
    assert [client.ps_stats(t).global_step for t in client.channels] == before
