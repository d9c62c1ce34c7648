"""Every ps task came back empty: lost within this run, or a new run's resume (guarantee 2), without sockets.

ps services in this process with ps task 0's global_step journal in a file; every ps task "dies" (fresh
services behind the same channels, ps task 0 reading the same journal). Within the run that wrote the newest
checkpoint the restore goes on past the last step value the journal holds (on another boot: its fsync'd
bound), so no step value is handed out twice; a new run
resuming the same checkpoint starts at the checkpoint's step (an ordinary resume never jumps).
tests/integration/test_in_graph_ps_all_lost.py runs it with ``psflow train --replication in-graph``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import numpy as np
import pytest

from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointManager
from psflow.cluster import ClusterSpec
from psflow.gradients import DenseGradient
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps import global_step
from psflow.ps.client import ParameterClient
from psflow.ps.global_step import StepJournal
from psflow.ps.service import ParameterService
from psflow.rpc.api import Handler, Reply
from psflow.rpc.framing import Frame
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.chief import join_cluster
from psflow.train.recovery import ClusterRecovery
from psflow.train.state_loss import ps_states
from psflow.train.within_run import lost_within_run

pytestmark = pytest.mark.timeout(60)

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})
SGD = OptimizerSpec("sgd", {"learning_rate": 0.5})
BLOCK = 10  # step values ps task 0 reserves per journal write


def _services(journal: Path | None) -> list[ParameterService]:
    """Both ps tasks, new processes: ps task 0 reads ``journal`` (None: it has none)."""
    step_journal = StepJournal(str(journal), block=BLOCK) if journal is not None else None
    return [ParameterService(0, holds_global_step=True, step_journal=step_journal),
            ParameterService(1, holds_global_step=False)]


def _client(services: list[ParameterService]) -> ParameterClient:
    vs = VariableSet(replica_device_setter(cluster=CLUSTER))
    vs.get_variable("weights", (8, 2))  # ps task 0
    vs.get_variable("bias", (2,))       # ps task 1
    channels = {i: InProcessChannel(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)}
    return ParameterClient(CLUSTER, vs.placements(), client_name="in-graph client", channels=channels)


def _push(client: ParameterClient) -> int:
    return client.push_detailed({"weights": DenseGradient(np.ones((8, 2), np.float32)),
                                 "bias": DenseGradient(np.ones(2, np.float32))},
                                generation=client.ps_stats().generation).step


def _run_then_lose_every_ps_task(tmp_path: Path, journal: Path | None,
                                 reboot: pytest.MonkeyPatch | Literal[False] = False) -> tuple[str, ParameterClient]:
    """Run ``run-a``: 3 steps, a checkpoint at step 3, 4 more steps (7 handed out), then every ps task dies (and,
    with ``reboot``, the machine restarted: another boot id). Returns the checkpoint directory and a client of the
    restarted, empty cluster."""
    ckpt = str(tmp_path / "ckpt")
    client = _client(_services(journal))
    join_cluster(client, SGD, chief=True, checkpoint_dir=ckpt)
    assert [_push(client) for _ in range(3)] == [1, 2, 3]
    CheckpointManager(ckpt, run_id="run-a").save(client)
    assert [_push(client) for _ in range(4)] == [4, 5, 6, 7]
    if reboot:
        reboot.setattr(global_step, "_boot_id", lambda: b"another-boot")
    return ckpt, _client(_services(journal))


@pytest.mark.parametrize("boot", ["same", "another"])
def test_a_restart_within_the_run_goes_on_past_every_step_value_handed_out(tmp_path: Path, boot: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """On the same boot ps task 0's journal holds the last value handed out (7), after a reboot only its fsync'd
    bound (10): either way the restore goes on past step 7."""
    journal = tmp_path / "state" / "global_step.json"
    ckpt, client = _run_then_lose_every_ps_task(tmp_path, journal, reboot=(boot == "another") and monkeypatch)
    floor = 7 if boot == "same" else BLOCK  # steps 1-7 were handed out under bound 10
    states = ps_states(client)
    assert not any(s is not None and s.ready for s in states.values())
    assert states[0] is not None and states[0].step_floor == floor
    assert lost_within_run(ckpt, "run-a", states, client.step_task)
    ClusterRecovery(client, SGD, checkpoint_dir=ckpt, leader=lambda: None, timeout=30.0).restore(None, states)
    assert client.global_step() == floor
    assert _push(client) == floor + 1  # never one of 4-7 again


def test_a_chief_restarted_within_the_run_joins_at_a_new_generation_past_every_step_value(tmp_path: Path) -> None:
    """The chief's join after every ps task died with it (none kept its state): it restored at generation 0 and the
    checkpoint's step, so steps 4-7 were handed out again and a worker still at generation 0 was admitted."""
    ckpt, client = _run_then_lose_every_ps_task(tmp_path, tmp_path / "state" / "global_step.json")
    result = join_cluster(client, SGD, chief=True, checkpoint_dir=ckpt, run="run-a")
    assert result.restored is not None and result.generation is not None and result.generation > 0
    assert result.global_step == 7 and _push(client) == 8


def test_a_new_run_resuming_the_checkpoint_starts_at_its_step(tmp_path: Path) -> None:
    ckpt, client = _run_then_lose_every_ps_task(tmp_path, tmp_path / "state" / "global_step.json")
    assert not lost_within_run(ckpt, "run-b", ps_states(client), client.step_task)  # another run's checkpoint
    result = join_cluster(client, SGD, chief=True, checkpoint_dir=ckpt, run="run-b")  # what that run's chief then does
    assert result.restored is not None and result.global_step == 3 and result.generation == 0
    assert _push(client) == 4


def test_without_a_journal_or_a_checkpoint_nothing_says_the_run_lost_its_state(tmp_path: Path) -> None:
    ckpt, client = _run_then_lose_every_ps_task(tmp_path, None)
    states = ps_states(client)
    assert states[0] is not None and not states[0].step_floor
    assert not lost_within_run(ckpt, "run-a", states, client.step_task)
    assert not lost_within_run(None, "run-a", states, client.step_task)
    assert not lost_within_run(str(tmp_path / "empty"), "run-a", states, client.step_task)


def _with_push_counts(ckpt: str, counts: list[int]) -> None:
    """Gives the newest checkpoint's shard records a replicated shard's ``pushes_applied`` (these services are not
    replicated, so their checkpoints carry none)."""
    latest = latest_checkpoint(ckpt)
    assert latest is not None
    path = Path(latest) / "manifest.json"
    manifest = json.loads(path.read_text())
    for record, n in zip(manifest["shards"], counts, strict=True):
        record["pushes_applied"] = n
    path.write_text(json.dumps(manifest))


def _load_shard_counts(client: ParameterClient) -> list[int | None]:
    """Records the ``pushes_applied`` each LoadShard to ``client``'s ps tasks carries (in the list returned)."""
    sent: list[int | None] = []
    for channel in client.channels.values():
        assert isinstance(channel, InProcessChannel)
        handler = channel._handlers["LoadShard"]

        def load(frame: Frame, handler: Handler = handler) -> Reply:
            sent.append(frame.meta.get("pushes_applied"))
            return handler(frame)

        channel._handlers["LoadShard"] = load
    return sent


@pytest.mark.parametrize("run, counts", [("run-a", [3, 3]), ("run-b", [None, None])])
def test_a_restore_takes_the_checkpoints_push_counts_only_from_a_checkpoint_of_this_run(
        tmp_path: Path, run: str, counts: list[int | None]) -> None:
    # Run B resumed run A's checkpoint (counts from 0), then lost every replica of a shard before saving its own:
    # restored from A's checkpoint, its shards must not take A's pushes_applied (updates_lost would be off by it).
    ckpt, client = _run_then_lose_every_ps_task(tmp_path, tmp_path / "state" / "global_step.json")
    _with_push_counts(ckpt, [3, 3])
    sent = _load_shard_counts(client)
    ClusterRecovery(client, SGD, checkpoint_dir=ckpt, leader=lambda: None, timeout=30.0,
                    run=run).restore(None, ps_states(client))
    assert sent == counts


def _lose_every_ps_task(journal: Path) -> ParameterClient:
    """Every ps task dies: a client of the restarted, empty cluster (ps task 0 reading ``journal``)."""
    return _client(_services(journal))


def test_a_resumed_run_that_lost_every_ps_task_before_its_first_checkpoint_goes_on_past_its_own_values(
        tmp_path: Path) -> None:
    """Run B resumes run A's checkpoint (step 3) with the same ps state directory, hands out 4-6 and loses every ps
    task before a checkpoint of its own. The newest checkpoint is A's, so only the journal can say the values were
    B's: it names the run whose chief registered (before, the join restored at step 3 and generation 0 and handed
    out 4-6 again). A's journal, found by B's first join, does not make B go past A's values."""
    journal, ckpt = tmp_path / "state" / "global_step.json", str(tmp_path / "ckpt")
    client = _client(_services(journal))
    join_cluster(client, SGD, chief=True, checkpoint_dir=ckpt, run="run-a")
    assert [_push(client) for _ in range(3)] == [1, 2, 3]
    CheckpointManager(ckpt, run_id="run-a").save(client)
    assert [_push(client) for _ in range(4)] == [4, 5, 6, 7]  # run A ends (or dies) here
    client = _lose_every_ps_task(journal)
    states = ps_states(client)
    assert states[0] is not None and (states[0].step_floor, states[0].step_run) == (7, "run-a")
    assert not lost_within_run(ckpt, "run-b", states, client.step_task)  # A's values are not B's to go past
    result = join_cluster(client, SGD, chief=True, checkpoint_dir=ckpt, run="run-b")
    assert (result.global_step, result.generation) == (3, 0)
    assert [_push(client) for _ in range(3)] == [4, 5, 6]  # run B's own
    client = _lose_every_ps_task(journal)
    states = ps_states(client)
    assert states[0] is not None and (states[0].step_floor, states[0].step_run) == (6, "run-b")
    assert lost_within_run(ckpt, "run-b", states, client.step_task)
    assert not lost_within_run(ckpt, "run-c", states, client.step_task)  # a third run resuming A's checkpoint
    result = join_cluster(client, SGD, chief=True, checkpoint_dir=ckpt, run="run-b")
    assert result.restored is not None and result.generation is not None and result.generation > 0
    assert result.global_step == 6 and _push(client) == 7


def test_a_journal_written_before_runs_were_named_counts_only_with_a_checkpoint_of_this_run(tmp_path: Path) -> None:
    """An old journal (``{"bound": N}``, no run) names no run: as before, only a checkpoint of this run makes the
    loss one within the run."""
    journal = tmp_path / "state" / "global_step.json"
    ckpt, _ = _run_then_lose_every_ps_task(tmp_path, journal)
    journal.write_text(json.dumps({"bound": 9}))
    Path(StepJournal(str(journal)).live_path).unlink(missing_ok=True)  # (its exact last value: none)
    client = _lose_every_ps_task(journal)
    states = ps_states(client)
    assert states[0] is not None and (states[0].step_floor, states[0].step_run) == (9, None)
    assert lost_within_run(ckpt, "run-a", states, client.step_task)  # run A wrote the newest checkpoint
    assert not lost_within_run(ckpt, "run-b", states, client.step_task)


def test_a_new_run_reusing_another_runs_journal_restores_a_lost_ps_task_at_its_own_steps(tmp_path: Path) -> None:
    """``psflow server`` reusing ps task 0's ``--state-dir``: run A handed out 25 values; run B (its own checkpoint
    directory) saves at step 3, reaches 5 and loses ps task 1 only. The restore at a new generation goes on past the
    values B handed out (5), not past A's 25: B's claim made the journal B's, and the floor A's process left must not
    count either (before, BeginRestore replied A's floor and B skipped 6-25)."""
    journal = tmp_path / "state" / "global_step.json"
    client = _client(_services(journal))
    join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path / "ckpt-a"), run="run-a")
    assert [_push(client) for _ in range(25)][-1] == 25  # run A ends
    services = _services(journal)  # run B's ps tasks, ps task 0 on the same --state-dir
    client, ckpt = _client(services), str(tmp_path / "ckpt-b")
    join_cluster(client, SGD, chief=True, checkpoint_dir=ckpt, run="run-b")
    assert [_push(client) for _ in range(3)] == [1, 2, 3]
    CheckpointManager(ckpt, run_id="run-b").save(client)
    assert [_push(client) for _ in range(2)] == [4, 5]
    client = _client([services[0], ParameterService(1, holds_global_step=False)])  # ps task 1 restarted empty
    ClusterRecovery(client, SGD, checkpoint_dir=ckpt, leader=lambda: None, timeout=30.0,
                    run="run-b").restore(None, ps_states(client))
    assert client.ps_stats().global_step == 5
    assert _push(client) == 6
