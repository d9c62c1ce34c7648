"""The checkpoint ledger (``CheckpointStatus`` of the shard holding global_step) replicated with shard 0
(psflow/ps/replication/save_ledger.py): a save's outcome the primary counts is in its backups' ledger before the
chief hears the reply, so a promoted backup serves the same counts, newest checkpoint and failed-save streak
(before, its ledger was empty: metrics.json miscounted the run's checkpoints and ``--max-failed-saves`` forgot a
streak); a rebuilt member's snapshot carries the ledger; a member that is not the primary changes nothing and
names the primary. In-process members (tests/replica_shard.py), no sockets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from replica_shard import PRIMARY, InProcessShard, backup, layout

from psflow.ps.protocol import CheckpointStatusRequest, SaveOutcome
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import DeadlineExceededError, FailedPreconditionError
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(60)


def report(shard: InProcessShard, member: str, request: CheckpointStatusRequest) -> dict[str, Any]:
    return dict(shard.call(member, CheckpointStatusRequest.METHOD, request.to_frame()).meta)


def saved(step: int) -> CheckpointStatusRequest:
    return CheckpointStatusRequest(outcome=SaveOutcome(True, step, path=f"/ckpt/ckpt-{step}", writer="chief"))


def failed(step: int) -> CheckpointStatusRequest:
    return CheckpointStatusRequest(outcome=SaveOutcome(False, step, error="OSError: disk full", writer="chief"))


def ledger(shard: InProcessShard, member: str) -> dict[str, Any]:
    """``member``'s ledger as it serves it (a read: no outcome, no lineage)."""
    return dict(shard.call(member, CheckpointStatusRequest.METHOD, Frame({})).meta)


@pytest.fixture
def shard(make_shard: Callable[..., InProcessShard]) -> InProcessShard:
    made = make_shard(backups=1)
    made.start()
    made.wait_view()
    made.register(layout(SyncConfig()))
    return made


def _history(shard: InProcessShard) -> None:
    """The chief's lineage, two saves, then two failed saves in a row."""
    report(shard, PRIMARY, CheckpointStatusRequest(lineage_if_unset="run-a"))
    for request in (saved(100), saved(200), failed(300), failed(400)):
        report(shard, PRIMARY, request)


def test_a_counted_save_is_in_the_backups_ledger_before_the_reply(shard: InProcessShard) -> None:
    _history(shard)
    mine = ledger(shard, PRIMARY)
    assert (mine["lineage"], mine["saved"], mine["failed"], mine["failed_in_a_row"]) == ("run-a", 2, 2, 2), mine
    assert (mine["last_saved_step"], mine["last_saved_path"]) == (200, "/ckpt/ckpt-200")
    assert shard.services[backup(0)].saves.status().as_dict() == mine


def test_a_promoted_backup_serves_the_same_ledger_and_goes_on_counting(shard: InProcessShard) -> None:
    _history(shard)
    before = ledger(shard, PRIMARY)
    shard.cut.add(PRIMARY)  # the primary dies; a client promotes the backup
    shard.promote(backup(0), 1)
    assert ledger(shard, backup(0)) == before
    after = report(shard, backup(0), failed(500))  # the streak goes on: --max-failed-saves sees 3 in a row
    assert (after["saved"], after["failed"], after["failed_in_a_row"]) == (2, 3, 3), after
    assert [f["seq"] for f in after["failures"]] == [1, 2, 3]
    after = report(shard, backup(0), saved(600))
    assert (after["saved"], after["failed_in_a_row"], after["last_saved_step"]) == (3, 0, 600), after


def test_a_rebuilt_members_snapshot_carries_the_ledger(shard: InProcessShard) -> None:
    _history(shard)
    shard.add(backup(0))  # a new process of the backup: empty, it rebuilds from the primary's snapshot
    assert shard.services[backup(0)].saves.status().saved == 0
    shard.start(backup(0))
    shard.wait_view()
    assert shard.services[backup(0)].saves.status().as_dict() == ledger(shard, PRIMARY)


def test_a_member_that_is_not_the_primary_changes_nothing_and_names_the_primary(shard: InProcessShard) -> None:
    with pytest.raises(FailedPreconditionError, match=f"not the primary.*{PRIMARY}"):
        report(shard, backup(0), CheckpointStatusRequest(lineage_if_unset="run-b"))
    _history(shard)
    with pytest.raises(FailedPreconditionError, match=f"not the primary.*{PRIMARY}"):
        report(shard, backup(0), saved(500))
    assert shard.services[backup(0)].saves.status().as_dict() == ledger(shard, PRIMARY)
    assert ledger(shard, PRIMARY)["saved"] == 2  # nothing reached the primary either
    # Reads are served by any member: a lineage already set is one.
    assert report(shard, backup(0), CheckpointStatusRequest(lineage_if_unset="run-b"))["lineage"] == "run-a"


def test_a_lineage_already_set_records_no_entry(shard: InProcessShard) -> None:
    """Every save asks the lineage (``lineage_if_unset``): once it is set, the call changes nothing and is not
    replicated (no entry to wait for)."""
    report(shard, PRIMARY, CheckpointStatusRequest(lineage_if_unset="run-a"))
    forwarder = shard.replicas[PRIMARY].forwarder
    assert forwarder is not None
    seq = forwarder.last_seq
    assert report(shard, PRIMARY, CheckpointStatusRequest(lineage_if_unset="run-b"))["lineage"] == "run-a"
    assert forwarder.last_seq == seq


def test_a_report_resent_to_the_promoted_backup_is_counted_once(shard: InProcessShard) -> None:
    """The primary counts a report and its backups hold it, then it dies before its reply reaches the chief: the
    chief's client resends the same report (same id) to the promoted backup, which counts it once."""
    report_ = CheckpointStatusRequest(outcome=SaveOutcome(True, 100, path="/ckpt/ckpt-100", writer="chief",
                                                          report_id="chief/1/7"))
    shard.lost_replies[(PRIMARY, CheckpointStatusRequest.METHOD)] = 1
    with pytest.raises(DeadlineExceededError):
        report(shard, PRIMARY, report_)
    assert ledger(shard, PRIMARY)["saved"] == 1
    shard.cut.add(PRIMARY)
    shard.promote(backup(0), 1)
    assert report(shard, backup(0), report_)["saved"] == 1  # the resend
    other = CheckpointStatusRequest(outcome=SaveOutcome(True, 200, path="/ckpt/ckpt-200", writer="chief",
                                                        report_id="chief/1/8"))
    assert report(shard, backup(0), other)["saved"] == 2
    unnamed = CheckpointStatusRequest(outcome=SaveOutcome(False, 300, error="disk full", writer="older chief"))
    assert [report(shard, backup(0), unnamed)["failed"] for _ in range(2)] == [1, 2]  # no id: each counted
