"""A replicated shard's ``SaveShard`` is served by a member holding its state only, the primary or a backup of its
view (psflow/ps/replication/control_calls.py).

Seen in a real run (``--ps 2 --workers 2 --ps-replicas 1 --chaos kill:ps:1@step=<the last step>``): ps:1 was
killed, ps_backup:1 promoted, and the restarted ps:1 -- empty, rebuilding from the new primary -- answered the
chief's final ``SaveShard`` from its own state: an empty shard file, a failed final save, the client restarted
and rolled back to an older checkpoint although the promoted backup held every acknowledged update. A member
without the shard's state (joining, deposed) now refuses with FAILED_PRECONDITION naming the primary it knows,
which the client's router follows (psflow/ps/failover.py): the save lands on the primary and holds its values.
In-process members (tests/replica_shard.py), no sockets.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from failed_over_shard import BACKUP, failed_over, numbered_push, routed_client, trained
from replica_shard import PRIMARY, InProcessShard, layout
from safetensors.numpy import load, load_file

from psflow.checkpoint.ledger import checkpoint_status
from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.save import CheckpointManager
from psflow.ps.protocol import (
    BeginRestoreRequest,
    CheckpointStatusRequest,
    JoinRequest,
    SaveOutcome,
    SaveShardReply,
    SaveShardRequest,
    SetReadyRequest,
)
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import FailedPreconditionError
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(60)

def _save(shard: InProcessShard, member: str) -> SaveShardReply:
    return SaveShardReply.from_frame(shard.call(member, SaveShardRequest.METHOD,
                                                SaveShardRequest(None, 0, 1).to_frame()))


def test_a_restarted_member_rebuilding_refuses_saveshard_naming_the_primary(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard, joined = failed_over(make_shard)
    assert shard.replicas[PRIMARY].view.view.role == "joining"
    with pytest.raises(FailedPreconditionError, match=r"not the primary of shard 0 \(joining\)"):
        _save(shard, PRIMARY)  # before: an empty shard (global_step 0)
    assert _save(shard, BACKUP).global_step == 5  # the primary's save holds every acknowledged push
    joined.set()


def test_a_backup_in_the_view_serves_saveshard_from_every_entry_it_acknowledged(
        make_shard: Callable[..., InProcessShard]) -> None:
    """A backup of the view holds every acknowledged push (what bit-for-bit checks of a backup read); only a member
    without the shard's state (joining, deposed) refuses."""
    shard, joined = failed_over(make_shard)
    joined.set()
    shard.wait_view(BACKUP, (PRIMARY,))  # ps:0 rebuilt: a backup holding every acknowledged push
    assert _save(shard, PRIMARY).global_step == _save(shard, BACKUP).global_step == 5


def test_a_shard_save_through_the_client_is_answered_by_the_primary(
        make_shard: Callable[..., InProcessShard]) -> None:
    """The chief's SaveShard (psflow/checkpoint/save.py: ``client.call_async``, the first call to that shard
    since the kill) is refused at the restarted ps:0 and resent to ps_backup:0."""
    shard, joined = failed_over(make_shard)
    client = routed_client(shard)
    try:
        reply = SaveShardReply.from_frame(client.call(0, SaveShardRequest(None, 0, 1)))
        assert reply.global_step == 5, reply.global_step  # before: 0, the empty member's
        assert client.channels[0].task == BACKUP
    finally:
        joined.set()
        client.close()


def test_the_chiefs_save_follows_the_shard_to_its_primary_and_holds_its_values(
        make_shard: Callable[..., InProcessShard], tmp_path: Path) -> None:
    """A whole checkpoint after the failover holds the promoted primary's values (every acknowledged push),
    not an empty shard."""
    shard, joined = failed_over(make_shard)
    client = routed_client(shard)
    try:
        saved = CheckpointManager(str(tmp_path)).save(client)
    finally:
        joined.set()
        client.close()
    assert read_manifest(saved.path).global_step == 5
    want = _save(shard, BACKUP)  # the promoted primary's shard as it holds it now
    assert want.global_step == 5 and want.data is not None
    files = [p for p in Path(saved.path).iterdir() if p.name.startswith("shard-") and p.name.endswith(".safetensors")]
    assert len(files) == 1, files
    got, expected = load_file(str(files[0])), load(want.data.tobytes())
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        assert got[name].tobytes() == value.tobytes(), name


def test_a_restarted_member_rebuilding_refuses_a_ledger_read_and_the_client_reads_the_primarys(
        make_shard: Callable[..., InProcessShard]) -> None:
    """``CheckpointStatus`` (the checkpoint ledger: saves done and failed, the newest checkpoint; the launcher's
    counts and ``--max-failed-saves`` read it) read at the restarted ps:0 before it holds the shard's state
    answered its own empty ledger (the launcher took that for a restart of the ledger's task and counted its
    saves twice once the route came back); it now refuses, and the client reads the promoted primary's."""
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    for step in (100, 200):
        outcome = SaveOutcome(True, step, path=f"/ckpt/ckpt-{step}", writer="chief")
        shard.call(PRIMARY, CheckpointStatusRequest.METHOD, CheckpointStatusRequest(outcome=outcome).to_frame())
    shard.cut.add(PRIMARY)
    assert shard.promote(BACKUP, 1).epoch == 2
    joined = threading.Event()
    shard.held_requests[(BACKUP, JoinRequest.METHOD)] = joined
    shard.add(PRIMARY)
    shard.cut.discard(PRIMARY)
    shard.start(PRIMARY)
    shard.wait(lambda: shard.holding > 0, "the restarted ps:0's Join held at the new primary")
    client = routed_client(shard)
    try:
        with pytest.raises(FailedPreconditionError, match=r"not the primary of shard 0 \(joining\)"):
            shard.call(PRIMARY, CheckpointStatusRequest.METHOD, Frame({}))  # before: saved 0, no newest checkpoint
        status = checkpoint_status(client)
        assert (status["saved"], status["last_saved_step"]) == (2, 200), status
    finally:
        joined.set()
        client.close()
    shard.wait_view(BACKUP, (PRIMARY,))
    assert dict(shard.call(PRIMARY, CheckpointStatusRequest.METHOD, Frame({})).meta)["saved"] == 2  # a backup: read


def test_a_primary_deposed_and_rebuilt_while_its_save_was_written_refuses_that_save(
        make_shard: Callable[..., InProcessShard]) -> None:
    """A save whose snapshot the primary took before a client promoted its backup over it (it could not reach
    it): a slow write outlasts the deposal, which the member learns within a second (watch_view), and its rebuild
    from the new primary (a Join, milliseconds), which clears the deposal. The snapshot lacks what the new primary
    applied since: refused, as a save whose member is deposed when it ends, not answered as the shard's."""
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    for i in range(1, 6):
        shard.push(PRIMARY, numbered_push(i))
    checkpoints = shard.services[PRIMARY]._checkpoints
    snapshot, snapped, written = checkpoints._save_shard, threading.Event(), threading.Event()

    def slow_write(path: str | None, since: dict[str, object] | None) -> SaveShardReply:
        reply = snapshot(path, since)
        snapped.set()
        written.wait(30.0)  # a big shard's write
        return reply

    checkpoints._save_shard = slow_write  # type: ignore[method-assign]
    outcome: list[SaveShardReply | Exception] = []

    def save() -> None:
        try:
            outcome.append(_save(shard, PRIMARY))
        except Exception as e:
            outcome.append(e)

    saving = threading.Thread(target=save, daemon=True)
    saving.start()
    assert snapped.wait(10.0)
    shard.cut.add(PRIMARY)  # a client cannot reach it: it promotes the backup
    assert shard.promote(BACKUP, 1).epoch == 2
    shard.push(BACKUP, numbered_push(6))
    shard.cut.discard(PRIMARY)
    old = shard.replicas[PRIMARY]
    shard.wait(lambda: old.deposal.by is None and old.view.view.primary == BACKUP,
               "ps:0 deposed (watch_view) and rebuilding from ps_backup:0")
    written.set()
    saving.join(30.0)
    assert len(outcome) == 1 and isinstance(outcome[0], FailedPreconditionError), outcome  # before: global_step 5


def test_a_backup_and_a_promoted_backup_name_the_primarys_generation_and_readiness(
        make_shard: Callable[..., InProcessShard]) -> None:
    """A save's shards are compared by restore generation and readiness (psflow/checkpoint/save_manifest.py): a
    replicated shard's SaveShard answered by a backup of the view, or by the backup promoted after the primary
    died, names the primary's (BeginRestore and SetReady are replicated), not the generation 0 it started at;
    else every save after a failover would fail."""
    shard = trained(make_shard, ready=True)
    shard.call(PRIMARY, BeginRestoreRequest.METHOD, BeginRestoreRequest(7).to_frame())
    shard.call(PRIMARY, SetReadyRequest.METHOD, SetReadyRequest("the chief", 7, 5).to_frame())
    assert [(r.generation, r.ready) for r in (_save(shard, m) for m in (PRIMARY, BACKUP))] == [(7, True)] * 2
    shard.cut.add(PRIMARY)  # killed
    assert shard.promote(BACKUP, 1).epoch == 2
    promoted = _save(shard, BACKUP)
    assert (promoted.generation, promoted.ready, promoted.global_step) == (7, True, 5)
    shard.add(PRIMARY)  # restarted empty, rebuilt from the new primary
    shard.cut.discard(PRIMARY)
    shard.start(PRIMARY)
    shard.wait_view(BACKUP, (PRIMARY,))
    rebuilt = _save(shard, PRIMARY)
    assert (rebuilt.generation, rebuilt.ready, rebuilt.global_step) == (7, True, 5)
