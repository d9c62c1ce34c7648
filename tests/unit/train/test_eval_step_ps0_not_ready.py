"""The evaluation at a session's end (EvalHook.end, FinalEvalOnce.end) is recorded at the cluster's global_step,
which it read from ps task 0. A ps task 0 restarted and not loaded yet (a restore follows) says global_step 0: the
run's final evaluation was then recorded at step 0, in the hook's history (metrics.json's ``eval``), the
``eval/<metric>`` summaries (TensorBoard drew the final point before every other) and the console line
(``eval step=0``). Now, where ps task 0 is not ready, the step is the last one the session knows, as the summary
hook's final point (tests/unit/train/test_summary_start_ps0_not_ready.py): ps task 0's global_step where it is ready.

Real in-process ps services (tests/two_ps_in_process.py), ps task 0 restarted empty behind the same channel; the
session's steps are real pushes; read back with TensorBoard's EventAccumulator."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from two_ps_in_process import SGD, restart_ps, train_a_step, two_ps_cluster

from psflow.ps.protocol import FinalEvalReply, FinalEvalRequest
from psflow.train.final_eval import FinalEvalOnce
from psflow.train.hook_api import RunContext, RunValues, SessionRunHook
from psflow.train.hooks import EvalHook
from psflow.train.session import MonitoredTrainingSession
from psflow.train.summary import SummaryWriter

pytestmark = pytest.mark.timeout(60)

WORKERS = ["/job:worker/task:0"]  # the client's (ps task 0 answers FinalEval: psflow.ps.run_end)
METRICS = {"auc": 0.75, "logloss": 0.5, "accuracy": 0.8, "examples": 10.0}


def _trained(tmp_path: Path, steps: int) -> tuple[Any, Any, SummaryWriter]:
    """A cluster initialized and ready, ``steps`` pushes made; (the session as the hooks see it, the ps services,
    a summary writer)."""
    client, services = two_ps_cluster(training_workers=WORKERS)
    with MonitoredTrainingSession(client, SGD, is_chief=True):
        pass
    for _ in range(steps):
        train_a_step(client)
    session = SimpleNamespace(client=client, join_result=None, global_step=client.global_step())
    return session, services, SummaryWriter(str(tmp_path / "summaries"))


def _told(hook: SessionRunHook, session: Any) -> None:
    """The hook hears of the session's step: one push, the session's global_step its step."""
    train_a_step(session.client)
    session.global_step = session.client.global_step()
    hook.after_run(RunContext(session=session, local_step=0), RunValues(step=session.global_step, loss=0.5, examples=1))


def _eval_steps(tmp_path: Path, writer: SummaryWriter) -> list[int]:
    writer.flush()
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = accumulator.EventAccumulator(str(tmp_path / "summaries"))
    acc.Reload()
    return [e.step for e in acc.Scalars("eval/auc")]


@pytest.mark.parametrize("once", [False, True], ids=["EvalHook", "FinalEvalOnce"])
def test_the_final_evaluation_beside_a_restarted_ps_task_0_is_at_the_sessions_step(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, once: bool) -> None:
    """Steps 1..5, a periodic evaluation at 4; ps task 0 restarted before the end (before: recorded at step 0)."""
    session, services, writer = _trained(tmp_path, 0)
    inner = EvalHook(lambda: dict(METRICS), every_steps=4, writer=writer)
    hook = FinalEvalOnce(inner) if once else inner
    hook.after_create_session(session)  # type: ignore[arg-type]
    for _ in range(5):
        _told(hook, session)
    restart_ps(session.client, services, 0, training_workers=WORKERS)
    assert session.client.global_step() == 0  # the restarted task's, not ready: a restore follows
    with caplog.at_level(logging.INFO, logger="psflow"):
        hook.end(session)  # type: ignore[arg-type]
    assert [step for step, _ in inner.history] == [4, 5]
    assert _eval_steps(tmp_path, writer) == [4, 5]
    assert "eval step=5 " in caplog.text and "eval step=0 " not in caplog.text, caplog.text
    if once:  # recorded on ps task 0 at that step: a worker ending after this one does not evaluate it again
        client = session.client
        record = FinalEvalReply.from_frame(client.call(client.step_task, FinalEvalRequest(client.client_name, 5)))
        assert (record.step, record.worker) == (5, client.client_name)
    writer.close()


@pytest.mark.parametrize("once", [False, True], ids=["EvalHook", "FinalEvalOnce"])
def test_the_final_evaluation_beside_a_restarted_ps_task_0_at_the_last_periodic_step_is_not_made_again(
        tmp_path: Path, once: bool) -> None:
    """The session's last step was evaluated already (periodic, at 4): not again (before: again, at step 0)."""
    session, services, writer = _trained(tmp_path, 0)
    evaluated: list[int] = []

    def evaluate() -> dict[str, float]:
        evaluated.append(session.client.global_step())
        return dict(METRICS)

    inner = EvalHook(evaluate, every_steps=4, writer=writer)
    hook = FinalEvalOnce(inner) if once else inner
    hook.after_create_session(session)  # type: ignore[arg-type]
    for _ in range(4):
        _told(hook, session)
    restart_ps(session.client, services, 0, training_workers=WORKERS)
    hook.end(session)  # type: ignore[arg-type]
    assert [step for step, _ in inner.history] == [4] and evaluated == [4]
    writer.close()


def test_the_final_evaluation_beside_a_ready_ps_task_0_is_at_its_global_step(tmp_path: Path) -> None:
    """Unchanged: ps task 0 ready says the cluster's global_step (another worker's steps after this session's last)."""
    session, _services, writer = _trained(tmp_path, 3)
    hook = EvalHook(lambda: dict(METRICS), every_steps=None, writer=writer)
    hook.after_create_session(session)  # type: ignore[arg-type]
    train_a_step(session.client)
    train_a_step(session.client)  # another worker's 4 and 5
    hook.end(session)  # type: ignore[arg-type]
    assert [step for step, _ in hook.history] == [5]
    assert _eval_steps(tmp_path, writer) == [5]
    writer.close()
