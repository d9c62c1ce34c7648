"""global_step's journal names the run whose values it bounds (:meth:`GlobalStep.claim`, the chief's Register).

A chief restarted with every ps task tells by it that the values handed out since the newest checkpoint were its own
run's, though that checkpoint is an earlier run's (a resumed run: :mod:`psflow.train.within_run`); a journal of
another run, or one written before runs were named, never says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps import protocol as p
from psflow.ps.global_step import GlobalStep, StepJournal, StepJournalError
from psflow.ps.replication.dedup import DedupTable
from psflow.ps.replication.snapshot import registration_entry, write_entry
from psflow.ps.service import ParameterService
from psflow.ps.step_clock import StepClock
from psflow.ps.sync import SyncConfig
from psflow.rpc.framing import Frame


def _journal(tmp_path: Path) -> StepJournal:
    return StepJournal(str(tmp_path / "global_step.json"), block=10)


def test_the_run_that_claimed_the_journal_is_the_floor_s_run_after_a_restart(tmp_path: Path) -> None:
    first = GlobalStep(journal=_journal(tmp_path))
    assert first.floor_run is None  # no file yet
    first.claim("run-a")
    assert [first.increment() for _ in range(5)] == [1, 2, 3, 4, 5]
    assert json.loads((tmp_path / "global_step.json").read_text()) == {"bound": 10, "run": "run-a"}
    second = GlobalStep(journal=_journal(tmp_path))  # the process killed, restarted on this boot
    assert (second.floor, second.floor_run) == (5, "run-a")


def test_a_claim_by_the_same_run_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = GlobalStep(journal=_journal(tmp_path))
    first.claim("run-a")
    first.increment()
    journal = _journal(tmp_path)
    step = GlobalStep(journal=journal)
    monkeypatch.setattr(journal, "record", lambda *a: pytest.fail(f"recorded {a}"))
    step.claim("run-a")
    assert (step.floor, step.floor_run) == (1, "run-a")


def test_another_run_claiming_the_journal_starts_it_over_at_the_counter(tmp_path: Path) -> None:
    """A new run reusing the state directory: the earlier run's values (25, bound 30) are not its own to go past,
    and a restart before it handed out any value finds the new run's floor (0), not the earlier run's."""
    first = GlobalStep(journal=_journal(tmp_path))
    first.claim("run-a")
    for _ in range(25):
        first.increment()
    second = GlobalStep(journal=_journal(tmp_path))
    assert (second.floor, second.floor_run) == (25, "run-a")
    second.claim("run-b")
    assert (second.floor, second.floor_run) == (0, "run-b")  # what BeginRestore replies from now on
    assert json.loads((tmp_path / "global_step.json").read_text()) == {"bound": 0, "run": "run-b"}
    third = GlobalStep(journal=_journal(tmp_path))  # died before the run's restore and its first value
    assert (third.floor, third.floor_run) == (0, "run-b")
    third.set(3)  # the restore of run A's checkpoint at step 3
    assert [third.increment() for _ in range(3)] == [4, 5, 6]
    fourth = GlobalStep(journal=_journal(tmp_path))
    assert (fourth.floor, fourth.floor_run) == (6, "run-b")


def test_an_old_journal_names_no_run_and_keeps_its_bound_when_claimed(tmp_path: Path) -> None:
    """A journal written before runs were named (``{"bound": N}``) may be this run's: its bound stays."""
    (tmp_path / "global_step.json").write_text(json.dumps({"bound": 40}))
    step = GlobalStep(journal=_journal(tmp_path))
    assert (step.floor, step.floor_run) == (40, None)
    step.claim("run-a")
    assert json.loads((tmp_path / "global_step.json").read_text()) == {"bound": 40, "run": "run-a"}
    assert GlobalStep(journal=_journal(tmp_path)).floor == 40


@pytest.mark.parametrize("content", ['{"bound": 3, "run": 5}', '["bound"]'])
def test_a_damaged_run_is_refused_naming_the_file(tmp_path: Path, content: str) -> None:
    (tmp_path / "global_step.json").write_text(content)
    with pytest.raises(StepJournalError, match="global_step.json"):
        GlobalStep(journal=_journal(tmp_path))


def _register(run: str | None, *, chief: bool = True) -> Frame:
    vs = VariableSet(replica_device_setter(ps_tasks=1))
    vs.get_variable("w", (4,))
    return p.RegisterRequest(tuple(vs.placements()), OptimizerSpec("sgd", {"learning_rate": 0.1}), SyncConfig(), "/job:worker/task:0",
                             chief, True, 1, run).to_frame()


def test_the_chief_s_register_claims_the_journal_and_stats_name_the_floor_s_run(tmp_path: Path) -> None:
    journal = str(tmp_path / "global_step.json")
    service = ParameterService(0, holds_global_step=True, step_journal=StepJournal(journal))
    assert service.stats_reply().step_run is None
    service.handlers()["Register"](_register(None, chief=False))  # a worker's, naming no run: nothing recorded
    assert not Path(journal).exists()
    service.handlers()["Register"](_register("run-a"))
    assert json.loads(Path(journal).read_text())["run"] == "run-a"
    assert service.stats_reply().step_run is None  # the floor it read at its start named no run
    restarted = ParameterService(0, holds_global_step=True, step_journal=StepJournal(journal))
    reply = p.StatsReply.from_frame(Frame(restarted.stats_reply().to_frame().meta))
    assert reply.step_run == "run-a"


def test_register_and_stats_carry_the_run_and_omit_it_where_none() -> None:
    assert p.RegisterRequest.from_frame(_register("run-a")).run == "run-a"
    assert "step_run" not in _register(None).meta and p.RegisterRequest.from_frame(_register(None)).run is None
    stats = p.StatsReply("/job:ps/task:0", 7, 7, step_run="run-a")
    assert p.StatsReply.from_frame(stats.to_frame()).step_run == "run-a"
    assert p.StatsReply.from_frame(p.StatsReply("/job:ps/task:0").to_frame()).step_run is None


# ---- A replicated shard 0's backups: their journal names the run their primary hands values out for ----------------

def _run_a_journal(path: Path, *, value: int = 25) -> None:
    """What run A left in a ``--state-dir`` that run B reuses: a journal naming run A, its last value ``value``."""
    step = GlobalStep(journal=StepJournal(str(path), block=10))
    step.claim("run-a")
    for _ in range(value):
        step.increment()


def test_the_clock_s_replica_state_names_the_run_its_global_step_hands_values_out_for(tmp_path: Path) -> None:
    clock = StepClock(holds_global_step=True, journal=_journal(tmp_path))
    assert clock.global_step is not None and clock.replica_state()["journal_run"] is None
    clock.global_step.claim("run-b")
    assert clock.replica_state()["journal_run"] == "run-b"
    unjournaled = StepClock(holds_global_step=True)  # ps task 0 without --state-dir: its backups still learn the run
    assert unjournaled.global_step is not None
    unjournaled.global_step.claim("run-b")
    assert unjournaled.global_step.run == "run-b" and unjournaled.replica_state()["journal_run"] == "run-b"
    assert StepClock(holds_global_step=False).replica_state()["journal_run"] is None


def test_a_backup_following_another_run_s_primary_names_its_run_and_starts_its_floor_over(tmp_path: Path) -> None:
    """A backup's --state-dir reused from run A (its journal names A, last value 25): following run B's primary,
    its journal names B and its bound and floor restart at its counter, as the primary's claim did. Before, the
    journal kept naming A with A's floor: promoted, its BeginRestore replied 25 (run B skipped A's values), and
    restarted after the whole shard was lost it named A (run B's restore did not count the loss as its own)."""
    path = tmp_path / "global_step.json"
    _run_a_journal(path)
    primary = StepClock(holds_global_step=True, journal=StepJournal(str(tmp_path / "primary.json"), block=10))
    assert primary.global_step is not None
    primary.global_step.claim("run-b")
    backup = StepClock(holds_global_step=True, journal=_journal(tmp_path))
    assert backup.global_step is not None and (backup.global_step.floor, backup.global_step.floor_run) == (25, "run-a")
    for _ in range(3):
        primary.advance_sync()  # (global_step's increment: ps task 0's sync count is global_step itself)
        backup.load_replica_state(primary.replica_state())
    assert json.loads(path.read_text()) == {"bound": 10, "run": "run-b"}  # restarted at 0, then a block
    assert (backup.global_step.value, backup.global_step.floor, backup.global_step.floor_run) == (3, 0, "run-b")
    restarted = GlobalStep(journal=_journal(tmp_path))  # the promoted backup lost with its shard, on this boot
    assert (restarted.floor, restarted.floor_run) == (3, "run-b")


def test_a_backup_s_journal_naming_no_run_keeps_its_bound_and_names_the_primary_s_run(tmp_path: Path) -> None:
    (tmp_path / "global_step.json").write_text(json.dumps({"bound": 40}))
    backup = StepClock(holds_global_step=True, journal=_journal(tmp_path))
    backup.load_replica_state({"global_step": 2, "sync_step": 2, "heard": None, "journal_run": "run-b"})
    assert json.loads((tmp_path / "global_step.json").read_text()) == {"bound": 40, "run": "run-b"}
    assert backup.global_step is not None and (backup.global_step.floor, backup.global_step.floor_run) == (40, None)


def test_an_entry_without_the_run_leaves_the_backup_s_journal_as_before(tmp_path: Path) -> None:
    """An entry of a primary that names no run (an older primary's, or one before any chief's Register): as before."""
    path = tmp_path / "global_step.json"
    _run_a_journal(path)
    backup = StepClock(holds_global_step=True, journal=_journal(tmp_path))
    backup.load_replica_state({"global_step": 31, "sync_step": 31, "heard": None})
    assert json.loads(path.read_text()) == {"bound": 40, "run": "run-a"}
    assert backup.global_step is not None and (backup.global_step.floor, backup.global_step.value) == (25, 31)


def test_the_chief_s_registration_entry_names_its_run_in_the_backup_s_journal(tmp_path: Path) -> None:
    """The entry the chief's Register records (psflow.ps.replication.register_call) holds the state after the
    Register's claim: the backup's journal (run A's) names run B from then on; promoted, it hands values out for B,
    and restarted on its journal (the whole shard lost) its Stats name B, so a restore counts the loss as B's."""
    backup_journal = tmp_path / "backup" / "global_step.json"
    _run_a_journal(backup_journal)
    primary = ParameterService(0, holds_global_step=True,
                               step_journal=StepJournal(str(tmp_path / "primary" / "global_step.json")))
    backup = ParameterService(0, holds_global_step=True, step_journal=StepJournal(str(backup_journal)))
    primary.handlers()["Register"](_register("run-b"))
    write_entry(backup, DedupTable("b"), {}, registration_entry(1, primary, DedupTable("p"), {}))
    assert json.loads(backup_journal.read_text())["run"] == "run-b"
    assert (backup.stats_reply().step_floor, backup.stats_reply().step_run) == (0, "run-b")
    assert backup.global_step is not None
    assert [backup.global_step.increment() for _ in range(4)] == [1, 2, 3, 4]  # promoted: it hands values out
    restarted = ParameterService(0, holds_global_step=True, step_journal=StepJournal(str(backup_journal)))
    reply = p.StatsReply.from_frame(Frame(restarted.stats_reply().to_frame().meta))
    assert (reply.step_floor, reply.step_run) == (4, "run-b")
