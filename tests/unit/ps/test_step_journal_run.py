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
from psflow.ps.service import ParameterService
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
