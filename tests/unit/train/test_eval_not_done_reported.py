"""An evaluation not done is tried again at the next period, not at the next step, and is listed where the run
is reported (a worker's result file, metrics.json ``eval_not_done``).

Since 080c3a3 the chief's evaluation reads only ready ps tasks (psflow.train.ready_eval): one beside a ps task
being restored ends not done after its wait (up to 5 s), logged and written nowhere else. Two gaps, shown here:

1. a periodic evaluation not done (or failed: a task unreachable) marked no period, so the chief tried it again at
   every step, each try waiting its 5 s while the task was being restored;
2. metrics.json did not say an evaluation was skipped.

Real in-process ps services (tests/two_ps_in_process.py): ps task 1 restarted and registered, not ready (a restore
to follow). Calls are counted, nothing is timed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from two_ps_in_process import SGD, OneExample, SumModel, restart_ps, train_a_step, two_ps_cluster

from psflow.rpc.api import TaskUnavailableError
from psflow.train import duties
from psflow.train.deferred_end import DeferredEnd
from psflow.train.final_eval import FinalEvalOnce
from psflow.train.generation_restore import register_as_chief
from psflow.train.hook_api import RunContext, RunValues
from psflow.train.hooks import EvalHook
from psflow.train.ready_eval import EvaluationNotDone, ReadyEvaluation
from psflow.train.session import MonitoredTrainingSession
from psflow.train.worker_result import eval_not_done, evaluations_not_done

pytestmark = pytest.mark.timeout(120)

WORKERS = ["/job:worker/task:0"]


def _ps1_being_restored() -> tuple[Any, Any]:
    """A trained cluster whose ps task 1 died and came back (registered, not ready); (the client, the session as
    the hooks see it at the cluster's global_step)."""
    client, services = two_ps_cluster(training_workers=WORKERS)
    with MonitoredTrainingSession(client, SGD, is_chief=True):
        pass
    for _ in range(3):
        train_a_step(client)
    restart_ps(client, services, 1, training_workers=WORKERS)
    register_as_chief(client, SGD, None, limit=5.0)
    return client, SimpleNamespace(client=client, join_result=None, global_step=client.global_step())


class Counted:
    """``inner`` called through it: how many times (each a whole evaluation, its retries inside it)."""

    def __init__(self, inner: Callable[[], dict[str, float]]) -> None:
        self.inner, self.calls = inner, 0

    def __call__(self) -> dict[str, float]:
        self.calls += 1
        return self.inner()


def _ready_eval(client: Any) -> ReadyEvaluation:
    return ReadyEvaluation(SumModel(), client, OneExample(), moving_averages=False, timeout=0.3)  # type: ignore[arg-type]


def _steps(hook: EvalHook, session: Any, *steps: int) -> None:
    for step in steps:
        hook.after_run(RunContext(session=session, local_step=0), RunValues(step=step, loss=0.5, examples=1))


def test_a_periodic_evaluation_not_done_is_tried_again_at_the_next_period_not_at_the_next_step() -> None:
    client, session = _ps1_being_restored()
    evaluation = Counted(_ready_eval(client))
    hook = EvalHook(evaluation, every_steps=10)
    hook.after_create_session(session)  # (global_step 3)
    _steps(hook, session, 10, 11, 12, 19)
    assert evaluation.calls == 1, f"{evaluation.calls} evaluations tried in one period (one a step)"
    assert [(n.step, n.final) for n in hook.not_done] == [(10, False)], hook.not_done
    assert "/job:ps/task:1 is not ready" in hook.not_done[0].why, hook.not_done
    _steps(hook, session, 20)  # the next period: tried again
    assert evaluation.calls == 2 and [n.step for n in hook.not_done] == [10, 20], hook.not_done


def test_a_periodic_evaluation_that_failed_is_tried_again_at_the_next_period_and_listed() -> None:
    client, session = _ps1_being_restored()

    def unreachable() -> dict[str, float]:
        raise TaskUnavailableError("/job:ps/task:1: connection refused")

    evaluation = Counted(unreachable)
    hook = EvalHook(evaluation, every_steps=10)
    hook.after_create_session(session)
    with pytest.raises(TaskUnavailableError):  # raised as before (the chief's duty wrapper logs it)
        _steps(hook, session, 10)
    _steps(hook, session, 11, 12)
    assert evaluation.calls == 1, f"{evaluation.calls} evaluations tried in one period (one a step)"
    assert [(n.step, n.final) for n in hook.not_done] == [(10, False)], hook.not_done
    assert "failed" in hook.not_done[0].why and "connection refused" in hook.not_done[0].why, hook.not_done


@pytest.mark.parametrize("once", [False, True], ids=["EvalHook", "FinalEvalOnce"])
def test_the_final_evaluation_is_still_made_after_a_periodic_one_not_done_and_listed_as_final(once: bool) -> None:
    client, session = _ps1_being_restored()
    evaluation = Counted(_ready_eval(client))
    inner = EvalHook(evaluation, every_steps=10)
    hook = FinalEvalOnce(inner) if once else inner
    hook.after_create_session(session)  # type: ignore[arg-type]
    _steps(inner, session, 10, 11)
    hook.end(session)  # type: ignore[arg-type]
    assert evaluation.calls == 2, evaluation.calls
    step = session.global_step
    assert [(n.step, n.final) for n in inner.not_done] == [(10, False), (step, True)], inner.not_done


def test_a_worker_s_result_lists_the_evaluations_its_duties_did_not_do() -> None:
    """Its hooks as make_session wraps them (a deferred end around the final evaluation once around the hook)."""
    client, session = _ps1_being_restored()
    inner = EvalHook(_ready_eval(client), every_steps=10)
    _steps(inner, session, 10)
    worker = SimpleNamespace(client=client, hooks=[object(), DeferredEnd(FinalEvalOnce(inner))])
    records = evaluations_not_done(worker)  # type: ignore[arg-type]
    assert [(r["step"], r["final"], r["task"]) for r in records] == [(10, False, "/job:worker/task:0")], records
    assert "/job:ps/task:1 is not ready" in records[0]["why"], records
    assert evaluations_not_done(SimpleNamespace(client=client, hooks=[])) == []  # type: ignore[arg-type]
    # metrics.json: every driver's, by step
    results = [{"task": "/job:worker/task:1", "eval_not_done": [{"step": 30, "final": True, "why": "b", "task": "w1"}]},
               {"task": "/job:worker/task:0", "eval_not_done": records}, {"steps": 4}]
    assert [r["step"] for r in eval_not_done(results)] == [10, 30]


def test_metrics_json_of_an_in_process_run_lists_the_evaluation_not_done(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real --in-process run whose first evaluation finds no ready model (as beside a ps task being restored)."""
    from psflow.launch.in_process import run_in_process
    from psflow.train.config import TrainConfig

    class FirstNotDone(ReadyEvaluation):
        tried = 0

        def __call__(self) -> dict[str, float]:
            FirstNotDone.tried += 1
            if FirstNotDone.tried == 1:
                raise EvaluationNotDone("/job:worker/task:0: evaluation not done: /job:ps/task:1 is not ready")
            return super().__call__()

    monkeypatch.setattr(duties, "ReadyEvaluation", FirstNotDone)
    data = tmp_path / "data.libsvm"
    data.write_text("".join(f"{i % 2} {1 + i % 3}:1 4:{i / 64:.3f}\n" for i in range(64)))
    config = TrainConfig.flat(train=(str(data),), eval=(str(data),), format="libsvm", num_features=5, batch_size=8,
                              num_workers=1, eval_every_steps=2)
    final = run_in_process(config, str(tmp_path / "out"))
    written = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert final["phase"] == "finished" and written["eval"]["auc"] is not None, written
    listed = [(r["step"], r["final"], r["task"]) for r in written["eval_not_done"]]
    assert listed == [(2, False, "/job:worker/task:0")], written["eval_not_done"]
    assert "/job:ps/task:1 is not ready" in written["eval_not_done"][0]["why"]
    assert written["workers"][0]["eval_not_done"] == written["eval_not_done"]
