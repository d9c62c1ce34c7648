"""A chief duty's failure (logged, not raised: :class:`~psflow.train.leader_hooks.LeaderOnlyHook`) names the duty and
when it ran, not the wrapper it ran in.

A periodic evaluation that failed (a ps task restarting) was logged 'chief duty FinalEvalOnce skipped': the name of
the hook that keeps the final evaluation from running twice, for an evaluation that was neither final nor once.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from psflow.coord import Lease
from psflow.rpc.api import TaskUnavailableError
from psflow.train.final_eval import FinalEvalOnce
from psflow.train.hook_api import RunContext, RunValues, SessionRunHook
from psflow.train.hooks import EvalHook
from psflow.train.leader_hooks import LeaderOnlyHook

pytestmark = pytest.mark.timeout(60)


class _Leading:
    candidate = "/job:worker/task:0"

    def lease(self) -> Lease:
        return Lease("chief", self.candidate, "t#1", 1, 10.0, float("inf"))


def _unreachable() -> dict[str, float]:
    raise TaskUnavailableError("/job:ps/task:1: Stats: connection refused")


def test_a_failed_periodic_evaluation_is_named_as_one(caplog: pytest.LogCaptureFixture) -> None:
    hook = LeaderOnlyHook(FinalEvalOnce(EvalHook(_unreachable, every_steps=10)), _Leading())  # type: ignore[arg-type]
    session: Any = SimpleNamespace(client=None, global_step=0)
    caplog.set_level(logging.ERROR)
    hook.after_run(RunContext(session, 0), RunValues(10, 0.5, 1))
    line = caplog.records[-1].getMessage()
    assert "chief duty evaluation skipped after step 10" in line, line
    assert "FinalEvalOnce" not in line and "connection refused" in line, line


def test_a_duty_without_a_name_is_named_by_its_class(caplog: pytest.LogCaptureFixture) -> None:
    class Failing(SessionRunHook):
        def end(self, session: Any) -> None:
            raise TaskUnavailableError("gone")

    caplog.set_level(logging.ERROR)
    LeaderOnlyHook(Failing(), _Leading()).end(SimpleNamespace())  # type: ignore[arg-type]
    assert "chief duty Failing skipped at the end: gone" in caplog.records[-1].getMessage()
