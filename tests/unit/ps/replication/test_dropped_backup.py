"""A backup dropped from its shard's view rejoins it (issue 28), in process.

After every replica of shard 0 was lost at once, both processes restarted: the ps task started a fresh shard
with the restarted backup in its view, and a worker whose channel still held the dead backup's refused
connection asked the primary to drop it (``DropBackup``) an instant later. The backup, alive and holding the
primary's snapshot, took itself for a member of the view and was never sent an entry again: the shard ran
unreplicated for the rest of the run (``backups: []`` at epoch 2 in metrics.json). A backup now checks that its
primary still counts it (:func:`psflow.ps.replication.startup.watch_view`) and rebuilds from it (Join) when not.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, backup, layout

from psflow.ps.protocol import DropBackupRequest
from psflow.ps.sync import SyncConfig

pytestmark = pytest.mark.timeout(60)


def test_a_backup_the_primary_dropped_while_it_was_alive_joins_the_view_again(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = make_shard()
    shard.start()
    shard.start(backup(0))
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    dropped = DropBackupRequest(0, 1, backup(0), WORKERS[0])
    shard.call(PRIMARY, DropBackupRequest.METHOD, dropped.to_frame())
    assert shard.status(PRIMARY).backups == () and shard.status(PRIMARY).epoch == 2
    shard.wait(lambda: shard.status(PRIMARY).backups == (backup(0),), "the dropped backup back in the view")
    status = shard.status(backup(0))
    assert (status.role, status.epoch, status.primary, status.has_state) == ("backup", 2, PRIMARY, True)


def test_a_primary_a_backup_was_promoted_over_while_it_was_alive_rejoins_as_its_backup(
        make_shard: Callable[..., InProcessShard]) -> None:
    # A client that could not reach the restarted (empty) primary promoted its backup; nothing told the primary,
    # which stayed primary at epoch 1 out of the new view: the shard ended the run at epoch 2 with no backup.
    shard = make_shard()
    shard.start()
    shard.start(backup(0))
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    assert shard.promote(backup(0), 1).backups == ()
    shard.wait(lambda: shard.status(backup(0)).backups == (PRIMARY,), "the old primary back in the view")
    status = shard.status(PRIMARY)
    assert (status.role, status.epoch, status.primary, status.has_state) == ("backup", 2, backup(0), True)
