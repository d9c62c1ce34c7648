"""A replicated shard 0's backup following a primary whose counter is below the backup's floor keeps that floor.

After every member of shard 0 was lost at once, each restarts with its journal's floor (:mod:`psflow.ps.global_step`)
and an empty counter: the fresh shard's primary (member 0, :mod:`psflow.ps.replication.startup`) sends its backups a
full snapshot at global_step 0 before any restore set the counter past the floor. A backup following that 0 must not
write 0 as its exact last value: restarted again on the same boot it would read 0 as its floor, and a restore (after
the other members were lost too) would hand the run's values out again.
"""

from __future__ import annotations

from pathlib import Path

from psflow.ps.global_step import GlobalStep, StepJournal
from psflow.ps.replication.dedup import DedupTable
from psflow.ps.replication.snapshot import full_entry, write_entry
from psflow.ps.service import ParameterService
from psflow.ps.step_clock import StepClock


def _handed_out(path: Path, run: str, count: int) -> None:
    """A member of shard 0 that handed out ``count`` values of run ``run``, then was killed (on this boot)."""
    step = GlobalStep(journal=StepJournal(str(path), block=10))
    step.claim(run)
    for _ in range(count):
        step.increment()


def test_following_a_restarted_primary_s_zero_keeps_the_floor_across_another_restart(tmp_path: Path) -> None:
    path = tmp_path / "global_step.json"
    _handed_out(path, "run-b", 25)
    backup = StepClock(holds_global_step=True, journal=StepJournal(str(path), block=10))
    assert backup.global_step is not None and backup.global_step.floor == 25
    backup.load_replica_state({"global_step": 0, "sync_step": 0, "heard": 0, "journal_run": "run-b"})
    assert backup.global_step.floor == 25
    restarted = GlobalStep(journal=StepJournal(str(path), block=10))  # killed again before the shard's restore
    assert (restarted.floor, restarted.floor_run) == (25, "run-b")


def test_a_fresh_primary_s_snapshot_keeps_the_backup_s_floor(tmp_path: Path) -> None:
    """The same through the snapshot a fresh shard's primary sends (full_entry, written by write_entry), with the
    primary's journal naming the run or naming none (its --state-dir lost)."""
    for primary_journal in (True, False):
        path = tmp_path / f"backup-{primary_journal}" / "global_step.json"
        _handed_out(path, "run-b", 25)
        primary_path = tmp_path / f"primary-{primary_journal}" / "global_step.json"
        if primary_journal:
            _handed_out(primary_path, "run-b", 20)
        primary = ParameterService(0, holds_global_step=True, step_journal=StepJournal(str(primary_path)))
        backup = ParameterService(0, holds_global_step=True, step_journal=StepJournal(str(path), block=10))
        write_entry(backup, DedupTable("b"), {}, full_entry(1, primary, DedupTable("p"), {}))
        assert backup.stats_reply().step_floor == 25
        restarted = ParameterService(0, holds_global_step=True, step_journal=StepJournal(str(path), block=10))
        assert (restarted.stats_reply().step_floor, restarted.stats_reply().step_run) == (25, "run-b")


def test_another_run_s_primary_still_starts_the_floor_over(tmp_path: Path) -> None:
    """A new run (another run claimed the primary's journal) is not held by the backup's floor of the earlier run:
    its journal restarts at its counter (85780f3), here 0, then covers the values the new run handed out."""
    path = tmp_path / "global_step.json"
    _handed_out(path, "run-a", 25)
    backup = StepClock(holds_global_step=True, journal=StepJournal(str(path), block=10))
    backup.load_replica_state({"global_step": 0, "sync_step": 0, "heard": 0, "journal_run": "run-b"})
    assert backup.global_step is not None and (backup.global_step.floor, backup.global_step.floor_run) == (0, "run-b")
    assert GlobalStep(journal=StepJournal(str(path), block=10)).floor == 0
    backup.load_replica_state({"global_step": 3, "sync_step": 3, "heard": 0, "journal_run": "run-b"})
    assert (GlobalStep(journal=StepJournal(str(path), block=10)).floor, backup.global_step.floor) == (3, 0)

