"""A fresh shard 0 after every member was lost at once takes the highest global_step floor its members' journals
hold for its run (:func:`psflow.ps.replication.startup.find_place`, :meth:`psflow.ps.global_step.GlobalStep.adopt`).

Member 0 becomes primary of a fresh shard when no member has state. Its floor (``Stats`` ``step_floor``, the floor
``BeginRestore`` replies, from which a restore at a new generation starts global_step) was only its own journal's:
ps:0 killed at 700, ps_backup:0 promoted and handing out up to 800, then killed before ps:0 rejoined: both restarted,
ps:0 primary with floor 700, and a restore within the run handed 701-800 out again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from journaled_shard import JournaledShard, handed_out, reread
from replica_shard import PRIMARY, backup, layout

from psflow.ps.protocol import BeginRestoreReply, BeginRestoreRequest
from psflow.ps.replication import startup
from psflow.ps.sync import SyncConfig

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def journaled(tmp_path: Path) -> Iterator[JournaledShard]:
    shard = JournaledShard(tmp_path)
    yield shard
    shard.stop()


def test_the_fresh_primary_takes_its_backup_s_higher_floor_of_the_same_run(journaled: JournaledShard) -> None:
    handed_out(journaled.journal(PRIMARY), "run-a", 700)
    handed_out(journaled.journal(backup(0)), "run-a", 800)  # promoted, handed out 701-800, then lost too
    assert journaled.restart_all() == (800, "run-a")
    frame = journaled.call(PRIMARY, BeginRestoreRequest.METHOD, BeginRestoreRequest(1).to_frame())
    assert BeginRestoreReply.from_frame(frame).step_floor == 800
    assert reread(journaled.journal(PRIMARY)) == (800, "run-a"), "the raised floor is in the primary's journal"


def test_another_run_s_journal_does_not_raise_the_floor(journaled: JournaledShard) -> None:
    """The backup's --state-dir was reused from another run: its floor is not this run's to go past."""
    handed_out(journaled.journal(PRIMARY), "run-a", 700)
    handed_out(journaled.journal(backup(0)), "run-z", 5000)
    assert journaled.restart_all() == (700, "run-a")


def test_a_primary_whose_journal_was_lost_takes_the_backup_s_floor_and_run(journaled: JournaledShard) -> None:
    """ps:0's --state-dir is gone (a new machine): its journal holds nothing, the backup's is the shard's."""
    handed_out(journaled.journal(backup(0)), "run-a", 800)
    assert journaled.restart_all() == (800, "run-a")


def test_a_lower_floor_of_the_same_run_keeps_the_primary_s(journaled: JournaledShard) -> None:
    handed_out(journaled.journal(PRIMARY), "run-a", 800)
    handed_out(journaled.journal(backup(0)), "run-a", 700)
    assert journaled.restart_all() == (800, "run-a")


def test_a_member_back_after_the_fresh_shard_started_raises_the_floor_before_any_value(
        journaled: JournaledShard, monkeypatch: pytest.MonkeyPatch) -> None:
    """ps_backup:0 unreachable while ps:0 waited for it (startup._FRESH_WAIT): ps:0 started the fresh shard with its
    own floor; once ps_backup:0 answers, the primary, its counter still at 0 (no restore yet), takes its floor."""
    monkeypatch.setattr(startup, "_FRESH_WAIT", 0.3)
    handed_out(journaled.journal(PRIMARY), "run-a", 700)
    handed_out(journaled.journal(backup(0)), "run-a", 800)
    for member in journaled.members:
        journaled.add(member)
    journaled.cut.add(backup(0))
    journaled.start()
    primary = journaled.services[PRIMARY]
    journaled.wait(lambda: journaled.replicas[PRIMARY].view.view.role == "primary", "ps:0 primary of a fresh shard")
    assert primary.stats_reply().step_floor == 700
    journaled.cut.discard(backup(0))
    journaled.wait(lambda: primary.stats_reply().step_floor == 800, "the primary's floor raised to ps_backup:0's")


def test_a_primary_that_handed_values_out_keeps_its_floor(journaled: JournaledShard,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Past its counter's first move (a restore or a push) a member coming back no longer moves the floor: the
    restore that read it is done (docs/replication.md, what still loses data)."""
    monkeypatch.setattr(startup, "_FRESH_WAIT", 0.3)
    handed_out(journaled.journal(PRIMARY), "run-a", 700)
    handed_out(journaled.journal(backup(0)), "run-a", 800)
    for member in journaled.members:
        journaled.add(member)
    journaled.cut.add(backup(0))
    journaled.start()
    primary = journaled.services[PRIMARY]
    journaled.wait(lambda: journaled.replicas[PRIMARY].view.view.role == "primary", "ps:0 primary of a fresh shard")
    assert primary.global_step is not None
    primary.global_step.set(750)  # a restore at the checkpoint's step (or pushes) moved the counter
    journaled.cut.discard(backup(0))
    status = journaled.status(backup(0))
    assert (status.step_floor, status.step_run) == (800, "run-a")
    startup.adopt_floors(journaled.replicas[PRIMARY], [status], late=True)  # as its watch does each second
    assert primary.stats_reply().step_floor == 700


def test_an_older_run_s_floor_taken_by_an_empty_journal_starts_over_at_a_new_run_s_register(
        journaled: JournaledShard) -> None:
    """ps:0's --state-dir lost, ps_backup:0's reused from an earlier run: the fresh primary takes that run's floor
    (a journal that is empty takes the highest), and a new run's Register starts it over at the counter (its values
    are not the new run's to go past): the new run starts at step 1, not past the earlier run's 5000."""
    handed_out(journaled.journal(backup(0)), "run-old", 5000)
    assert journaled.restart_all() == (5000, "run-old")
    journaled.register(dataclasses.replace(layout(SyncConfig()), run="run-new"))
    stats = journaled.services[PRIMARY].stats_reply()
    assert (stats.step_floor, stats.step_run) == (0, "run-new")
    copy = journaled.services[backup(0)].global_step
    assert copy is not None and (copy.run, copy.value) == ("run-new", 0)
    assert reread(journaled.journal(PRIMARY)) == (0, "run-new"), "the primary's journal starts over too"


def test_a_primary_whose_journal_names_an_older_run_takes_the_heard_floor_at_that_run_s_register(
        journaled: JournaledShard) -> None:
    """ps:0 was down through the whole of run-a's primary's time (its journal still names run-z, an earlier run on
    the same --state-dir); ps_backup:0 handed out run-a's values up to 800; both lost, restarted. The fresh primary
    cannot tell which run is current, so it keeps run-z's floor; run-a's chief's Register (before its restore's
    BeginRestore reads the floor) must then start run-a at the floor heard for run-a, not at the counter (0)."""
    handed_out(journaled.journal(PRIMARY), "run-z", 300)
    handed_out(journaled.journal(backup(0)), "run-a", 800)
    assert journaled.restart_all() == (300, "run-z")
    journaled.register(dataclasses.replace(layout(SyncConfig()), run="run-a"))
    frame = journaled.call(PRIMARY, BeginRestoreRequest.METHOD, BeginRestoreRequest(1).to_frame())
    assert BeginRestoreReply.from_frame(frame).step_floor == 800
    assert reread(journaled.journal(PRIMARY)) == (800, "run-a"), "the floor is in the primary's journal"
