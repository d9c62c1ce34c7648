"""A backup dropped from its shard's view rejoins it (issue 28), in process.

After every replica of shard 0 was lost at once, both processes restarted: the ps task started a fresh shard
with the restarted backup in its view, and a worker whose channel still held the dead backup's refused
connection asked the primary to drop it (``DropBackup``) an instant later. The backup, alive and holding the
primary's snapshot, took itself for a member of the view and was never sent an entry again: the shard ran
unreplicated for the rest of the run (``backups: []`` at epoch 2 in metrics.json). A backup now checks that its
primary still counts it (:func:`psflow.ps.replication.startup.watch_view`) and rebuilds from it (Join) when not.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, backup, layout

from psflow.ps.protocol import DropBackupRequest, ReplicateRequest
from psflow.ps.replication import member
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import FailedPreconditionError

pytestmark = pytest.mark.timeout(60)


def test_a_backup_the_primary_dropped_while_it_was_alive_joins_the_view_again(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = make_shard()
    shard.start()
    shard.start(backup(0))
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    dropped = DropBackupRequest(0, 1, backup(0), WORKERS[0])
    shard.cut.add(backup(0))  # the primary cannot reach it either when it drops it (view_checks.refuse_drop)
    shard.call(PRIMARY, DropBackupRequest.METHOD, dropped.to_frame())
    shard.cut.discard(backup(0))
    assert shard.status(PRIMARY).backups == () and shard.status(PRIMARY).epoch == 2
    shard.wait(lambda: shard.status(PRIMARY).backups == (backup(0),), "the dropped backup back in the view")
    status = shard.status(backup(0))
    assert (status.role, status.epoch, status.primary, status.has_state) == ("backup", 2, PRIMARY, True)


def _restarted_backup_joining(make_shard: Callable[..., InProcessShard]) -> tuple[InProcessShard, threading.Event]:
    """A shard whose backup was restarted: its Join served (out of the view's backups, not waited for), the
    snapshot its Join's sender sends held up until the returned event is set."""
    shard = make_shard()
    shard.start()
    shard.start(backup(0))
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    held = shard.held_requests[(backup(0), ReplicateRequest.METHOD)] = threading.Event()
    shard.add(backup(0))  # its restarted process Joins; the snapshot its Join's sender sends is held up
    shard.start(backup(0))
    shard.wait(lambda: shard.holding >= 1 and shard.status(PRIMARY).backups == (),
               "the restarted backup's Join served (out of the backups: not waited for), its snapshot held up")
    del shard.held_requests[(backup(0), ReplicateRequest.METHOD)]
    return shard, held


def test_a_drop_that_comes_while_the_restarted_backup_joins_leaves_its_join_to_finish(
        make_shard: Callable[..., InProcessShard]) -> None:
    """Both members restarted (every replica of shard 0 lost): a worker still holding the dead backup's refused
    connection saw the view of epoch 1 with the backup in it and asked the primary to drop it, while the restarted
    backup's Join was being served (out of the view's backups until it catches up, at the same epoch). The primary
    asked nothing (the member was no backup of its view), went to epoch 2 and stopped the Join's sender: the member,
    alive and joining, got nothing more, and no check brings a joining member back (startup.watch_view rebuilds a
    backup), so the shard ran unreplicated to the end (tests/integration/test_replicated_training.py's
    every-replica-lost run, 1 in 14: shard 0's view at the end without ps_backup:0)."""
    shard, held = _restarted_backup_joining(make_shard)
    assert shard.status(PRIMARY).epoch == 1
    dropped = DropBackupRequest(0, 1, backup(0), WORKERS[0])  # the view of epoch 1 that the worker read before
    try:
        shard.call(PRIMARY, DropBackupRequest.METHOD, dropped.to_frame())
    except FailedPreconditionError:
        pass  # refused (the member answers): as good
    held.set()
    shard.wait(lambda: shard.status(PRIMARY).backups == (backup(0),), "the joining backup in the view")
    # the entry that tells it the view follows the primary's change
    shard.wait(lambda: shard.status(backup(0)).role == "backup", "the member a backup")
    status, primary = shard.status(backup(0)), shard.status(PRIMARY)
    assert (status.primary, status.has_state, status.epoch) == (PRIMARY, True, primary.epoch)


def test_a_joining_member_that_catches_up_while_a_drop_is_checked_is_not_dropped_unasked(
        make_shard: Callable[..., InProcessShard], monkeypatch: pytest.MonkeyPatch) -> None:
    """A DropBackup naming the restarted backup while its Join is served: the primary's refuse_drop reads the
    view (the member joining, out of the backups: nothing to ask) and, before ViewState.drop_backup took its lock,
    the member caught up and entered the backups. The drop then took it out again unasked and stopped its sender
    before the entry telling it the view reached it: the member stayed 'joining' for good (startup.watch_view
    looks after a backup only) and the shard ran unreplicated."""
    shard, held = _restarted_backup_joining(make_shard)
    checked = member.refuse_drop

    def check_then_catch_up(*args: Any) -> None:
        checked(*args)  # the member is no backup of the view read: nothing asked
        shard.cut.add(backup(0))  # the entry telling it the view (after its snapshot's) does not reach it yet
        held.set()  # its snapshot arrives, is acknowledged: it enters the view's backups
        shard.wait(lambda: backup(0) in shard.status(PRIMARY).backups, "the joining member in the backups")

    monkeypatch.setattr(member, "refuse_drop", check_then_catch_up)
    dropped = DropBackupRequest(0, 1, backup(0), WORKERS[0])  # the view of epoch 1 that the worker read before
    try:
        shard.call(PRIMARY, DropBackupRequest.METHOD, dropped.to_frame())
    except FailedPreconditionError:
        pass  # refused: as good
    shard.cut.discard(backup(0))
    shard.wait(lambda: shard.status(PRIMARY).backups == (backup(0),) and shard.status(backup(0)).role == "backup",
               "the member that caught up a backup of the view")
    status, primary = shard.status(backup(0)), shard.status(PRIMARY)
    assert (status.primary, status.has_state, status.epoch) == (PRIMARY, True, primary.epoch)


def test_a_primary_a_backup_was_promoted_over_while_it_was_alive_rejoins_as_its_backup(
        make_shard: Callable[..., InProcessShard]) -> None:
    # A client that could not reach the restarted (empty) primary promoted its backup; nothing told the primary,
    # which stayed primary at epoch 1 out of the new view: the shard ended the run at epoch 2 with no backup.
    shard = make_shard()
    shard.start()
    shard.start(backup(0))
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    shard.cut.add(PRIMARY)  # the backup cannot reach it either when it takes over (view_checks.refuse_promotion)
    assert shard.promote(backup(0), 1).backups == ()
    shard.cut.discard(PRIMARY)
    shard.wait(lambda: shard.status(backup(0)).backups == (PRIMARY,), "the old primary back in the view")
    status = shard.status(PRIMARY)
    assert (status.role, status.epoch, status.primary, status.has_state) == ("backup", 2, backup(0), True)


def test_a_view_change_against_a_member_that_answers_is_refused_so_one_epoch_never_has_two_primaries(
        make_shard: Callable[..., InProcessShard]) -> None:
    """Two clients acting on stale proofs from one epoch (one promoting the backup, the other dropping it at the
    primary) made two primaries at epoch 2, each acknowledging alone. The member a change names asks the other
    side first: a primary that answers is not promoted over, a backup that answers is not dropped."""
    shard = make_shard()
    shard.start()
    shard.start(backup(0))
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    with pytest.raises(FailedPreconditionError, match=f"not promoted: {PRIMARY} answers as shard 0's primary"):
        shard.promote(backup(0), 1)
    dropped = DropBackupRequest(0, 1, backup(0), WORKERS[0])
    with pytest.raises(FailedPreconditionError, match=f"{backup(0)} not dropped: {backup(0)} answers"):
        shard.call(PRIMARY, DropBackupRequest.METHOD, dropped.to_frame())
    primary, kept = shard.status(PRIMARY), shard.status(backup(0))
    assert (primary.role, primary.epoch, primary.backups) == ("primary", 1, (backup(0),))
    assert (kept.role, kept.epoch, kept.primary) == ("backup", 1, PRIMARY)
