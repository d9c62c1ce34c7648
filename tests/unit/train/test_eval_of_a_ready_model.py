"""An evaluation reads one ready model or says it was not done: never a number from a ps task being restored.

A ps task restarted empty and registered by the restore (fresh initial values, not ready), or between a
``BeginRestore`` and its ``SetReady``, answered an evaluation's ``Pull`` as any other: the chief's evaluation
(EvalHook, FinalEvalOnce) reported metrics of a model that never existed as the run's (the console's ``eval step=``,
the ``eval/*`` summaries). Now the evaluation's pulls say ``require_ready`` (psflow.ps.ready_read) and
psflow.train.ready_eval compares every task's state before and after its reads, retrying until its timeout.

Real in-process ps services (tests/two_ps_in_process.py); ``weights`` on ps task 0, ``bias`` on ps task 1; the
model's one metric is the sum of both (what a read of the trained model gives is known)."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from two_ps_in_process import SGD, OneExample, SumModel, restart_ps, train_a_step, two_ps_cluster

from psflow.ps.client import ParameterClient
from psflow.ps.protocol import BeginRestoreRequest, FinalEvalReply, FinalEvalRequest, PullRequest, SetReadyRequest
from psflow.rpc.api import FailedPreconditionError
from psflow.train.evaluation import evaluate
from psflow.train.final_eval import FinalEvalOnce
from psflow.train.generation_restore import register_as_chief
from psflow.train.hooks import EvalHook
from psflow.train.ready_eval import EvaluationNotDone, ReadyEvaluation
from psflow.train.session import MonitoredTrainingSession

pytestmark = pytest.mark.timeout(60)

WORKERS = ["/job:worker/task:0"]




def _trained(steps: int = 3) -> tuple[ParameterClient, list[Any], float]:
    """A ready cluster after ``steps`` pushes, and the metric of its model (read directly)."""
    client, services = two_ps_cluster(training_workers=WORKERS)
    with MonitoredTrainingSession(client, SGD, is_chief=True):
        pass
    for _ in range(steps):
        train_a_step(client)
    values = client.pull({"weights": None, "bias": None})
    return client, services, float(values["weights"].sum() + values["bias"].sum())


def _restarted_ps1(client: ParameterClient, services: list[Any]) -> None:
    """ps task 1 died and came back; the restore's Register made its fresh partitions (not ready, no load yet)."""
    restart_ps(client, services, 1, training_workers=WORKERS)
    register_as_chief(client, SGD, None, limit=5.0)


def _ready_eval(client: ParameterClient, model: SumModel | None = None, timeout: float = 0.6) -> ReadyEvaluation:
    return ReadyEvaluation(model or SumModel(), client, OneExample(), moving_averages=False,  # type: ignore[arg-type]
                           timeout=timeout)


def test_an_unchecked_read_of_a_restarted_task_gives_a_number_of_no_model() -> None:
    """What the evaluation read before: a number, not the trained model's (the bug, as a plain read still gives)."""
    client, services, trained = _trained()
    _restarted_ps1(client, services)
    assert evaluate(SumModel(), client, OneExample())["auc"] != pytest.approx(trained)  # type: ignore[arg-type]


@pytest.mark.parametrize("state", ["restarted", "restoring"])
def test_a_pull_that_requires_ready_is_refused_by_a_task_being_restored(state: str) -> None:
    client, services, _ = _trained()
    if state == "restarted":
        _restarted_ps1(client, services)
        said = "/job:ps/task:1 is not ready (restarted or initializing, awaiting its restore, generation 0)"
    else:
        client.call(1, BeginRestoreRequest(generation=4))
        said = "/job:ps/task:1 is not ready (being restored, generation 4)"
    with pytest.raises(FailedPreconditionError) as refused:
        client.pull({"bias": None}, require_ready=True)
    assert said in str(refused.value) and "retry" in str(refused.value)
    assert client.pull({"bias": None})["bias"].shape == (2,)  # a training lookup: not checked, as before
    assert client.pull({"weights": None}, require_ready=True)["weights"].shape == (8, 2)  # ps task 0 is ready


def test_the_field_is_sent_only_where_set() -> None:
    """An older task ignores no field it does not know; an older client's pull (no field) is not checked."""
    plain = PullRequest([("bias", None)]).to_frame()
    assert "require_ready" not in plain.meta
    assert PullRequest.from_frame(plain).require_ready is False
    asked = PullRequest([("bias", None)], require_ready=True).to_frame()
    assert asked.meta["require_ready"] is True and PullRequest.from_frame(asked).require_ready is True


def test_an_evaluation_that_finds_no_ready_model_in_its_time_is_not_done() -> None:
    client, services, _ = _trained()
    _restarted_ps1(client, services)
    evaluation = _ready_eval(client)
    with pytest.raises(EvaluationNotDone) as not_done:
        evaluation()
    assert "/job:ps/task:1 is not ready (generation 0)" in str(not_done.value), not_done.value
    assert evaluation.attempts >= 2


def test_an_evaluation_waits_for_the_restore_and_reads_the_restored_model() -> None:
    client, services, _ = _trained()
    client.call(1, BeginRestoreRequest(generation=1))
    opened = threading.Timer(0.3, lambda: client.call(1, SetReadyRequest(generation=1)))
    opened.start()
    try:
        evaluation = _ready_eval(client, timeout=20.0)
        metrics = evaluation()
    finally:
        opened.join()
    values = client.pull({"weights": None, "bias": None})
    assert metrics["auc"] == pytest.approx(float(values["weights"].sum() + values["bias"].sum()))
    assert evaluation.attempts >= 2


def test_a_restore_that_began_and_ended_during_the_evaluation_drops_its_reads() -> None:
    """Between the evaluation's reads and its end, ps task 1 was restored (BeginRestore, SetReady at generation 1):
    the pulls were each of a ready task, the whole not of one model: made again."""
    client, services, trained = _trained()
    model = SumModel()
    model.on_predict.append(lambda: (client.call(1, BeginRestoreRequest(generation=1)),
                                     client.call(1, SetReadyRequest(generation=1))))
    evaluation = _ready_eval(client, model, timeout=20.0)
    assert evaluation()["auc"] == pytest.approx(trained)
    assert evaluation.attempts == 2


@pytest.mark.parametrize("once", [False, True], ids=["EvalHook", "FinalEvalOnce"])
def test_the_final_evaluation_beside_a_task_being_restored_reports_no_number(
        caplog: pytest.LogCaptureFixture, once: bool) -> None:
    client, services, _ = _trained()
    step = client.global_step()
    _restarted_ps1(client, services)
    inner = EvalHook(_ready_eval(client), every_steps=None)
    hook = FinalEvalOnce(inner) if once else inner
    session = SimpleNamespace(client=client, join_result=None, global_step=step)
    with caplog.at_level(logging.INFO, logger="psflow"):
        hook.end(session)  # type: ignore[arg-type]
    assert inner.history == []
    assert [(n.step, n.final) for n in inner.not_done] == [(step, True)], inner.not_done
    assert "/job:ps/task:1 is not ready" in inner.not_done[0].why, inner.not_done
    assert f"eval step={step} not done, no metrics" in caplog.text and "auc=" not in caplog.text, caplog.text
    if once:  # not recorded as evaluated: a later holder of the duties may evaluate the model
        record = FinalEvalReply.from_frame(client.call(client.step_task, FinalEvalRequest(client.client_name, step)))
        assert record.step != step
