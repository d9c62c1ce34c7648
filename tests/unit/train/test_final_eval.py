"""The final model evaluated once, whichever workers hold the chief duties at their session's end
(psflow.train.final_eval): holders in turn, the second skips what the first evaluated and recorded on ps task 0;
a holder that died before its record leaves the evaluation to the next. A real ps service (its run ledger) behind
in-process channels, as tests/two_ps_in_process.py sets them up."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest
from two_ps_in_process import SGD

from psflow.cluster import ClusterSpec
from psflow.gradients import DenseGradient
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.service import ParameterService
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.chief import join_cluster
from psflow.train.final_eval import FinalEvalOnce
from psflow.train.hooks import EvalHook, RunContext, RunValues

W0, W1 = "/job:worker/task:0", "/job:worker/task:1"
CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1"]})


def _cluster(*, ledger: bool = True) -> tuple[ParameterService, list[ParameterClient]]:
    """ps task 0 (with the run ledger of workers 0-1, as ``psflow server`` starts it, or without) and both workers'
    clients, joined."""
    service = ParameterService(0, holds_global_step=True, training_workers=[W0, W1] if ledger else None)
    variables = VariableSet(replica_device_setter(cluster=CLUSTER))
    variables.get_variable("weights", (4,))
    clients = [ParameterClient(CLUSTER, variables.placements(), client_name=name,
                               channels={0: InProcessChannel("/job:ps/task:0", service.handlers())}) for name in (W0, W1)]
    join_cluster(clients[0], SGD, chief=True)
    join_cluster(clients[1], SGD, chief=False)
    return service, clients


def _step(client: ParameterClient) -> None:
    client.push({"weights": DenseGradient(np.ones(4, np.float32))}, generation=client.ps_stats().generation)


def _holder(client: ParameterClient, evaluations: list[tuple[str, int]],
            evaluate: Callable[[], dict[str, float]] | None = None, every_steps: int | None = None,
            ) -> tuple[FinalEvalOnce, SimpleNamespace]:
    """A worker's hook (its evaluation counted in ``evaluations``) and its session, begun."""
    def counted() -> dict[str, float]:
        evaluations.append((client.client_name, client.global_step()))
        return {"auc": 0.9}

    hook = FinalEvalOnce(EvalHook(evaluate or counted, every_steps=every_steps))
    session = SimpleNamespace(client=client, global_step=client.global_step())
    hook.begin()
    hook.after_create_session(session)  # type: ignore[arg-type]  # the hooks read .client and .global_step
    return hook, session


def test_the_second_holder_at_the_runs_end_skips_the_model_the_first_evaluated(
        caplog: pytest.LogCaptureFixture) -> None:
    service, (w0, w1) = _cluster()
    _step(w0)
    evaluations: list[tuple[str, int]] = []
    first, second = _holder(w0, evaluations), _holder(w1, evaluations)
    caplog.set_level("INFO", logger="psflow.worker")
    first[0].end(first[1])  # type: ignore[arg-type]
    second[0].end(second[1])  # type: ignore[arg-type]
    assert evaluations == [(W0, 1)]
    assert f"{W1}: the final model (global_step 1) was evaluated by {W0} already: not again" in caplog.messages
    assert service.run_ledger is not None
    assert service.run_ledger.describe().endswith(f", final model evaluated at step 1 by {W0}")


def test_a_holder_that_died_before_its_record_leaves_the_evaluation_to_the_next() -> None:
    _, (w0, w1) = _cluster()
    evaluations: list[tuple[str, int]] = []

    def dies() -> dict[str, float]:
        raise SystemExit(137)  # its process ended mid-evaluation: nothing recorded

    first, second = _holder(w0, evaluations, dies), _holder(w1, evaluations)
    with pytest.raises(SystemExit):
        first[0].end(first[1])  # type: ignore[arg-type]
    second[0].end(second[1])  # type: ignore[arg-type]
    assert evaluations == [(W1, 0)]


def test_a_record_of_an_earlier_model_does_not_skip_a_later_one() -> None:
    _, (w0, w1) = _cluster()
    evaluations: list[tuple[str, int]] = []
    first = _holder(w0, evaluations)
    first[0].end(first[1])  # type: ignore[arg-type]
    _step(w1)  # e.g. a restore rewound the workers, and they trained on
    second = _holder(w1, evaluations)
    second[0].end(second[1])  # type: ignore[arg-type]
    assert evaluations == [(W0, 0), (W1, 1)]


def test_a_periodic_evaluation_at_the_last_step_is_the_final_one() -> None:
    _, (w0, w1) = _cluster()
    evaluations: list[tuple[str, int]] = []
    first = _holder(w0, evaluations, every_steps=1)
    _step(w0)
    first[0].after_run(RunContext(first[1], 0), RunValues(step=1, loss=0.5, examples=4))  # type: ignore[arg-type]
    first[0].end(first[1])  # type: ignore[arg-type]
    second = _holder(w1, evaluations)
    second[0].end(second[1])  # type: ignore[arg-type]
    assert evaluations == [(W0, 1)]


def test_a_ps_task_that_cannot_be_asked_does_not_stop_the_evaluation(caplog: pytest.LogCaptureFixture) -> None:
    _, (w0, w1) = _cluster(ledger=False)  # it serves no FinalEval: the call is refused
    evaluations: list[tuple[str, int]] = []
    first, second = _holder(w0, evaluations), _holder(w1, evaluations)
    first[0].end(first[1])  # type: ignore[arg-type]
    second[0].end(second[1])  # type: ignore[arg-type]
    assert evaluations == [(W0, 0), (W1, 0)]  # twice rather than not at all
    assert any("could not ask /job:ps/task:0 whether the final model (global_step 0) was evaluated already" in m
               and m.endswith("evaluating it") for m in caplog.messages), caplog.messages


def test_a_holder_stalled_mid_evaluation_drops_its_own_once_its_successor_recorded_one(
        caplog: pytest.LogCaptureFixture) -> None:
    """Worker 0's evaluation lasts while worker 1 (which took the duties over) evaluates the same model and records
    it: worker 0's is not reported (no history, no 'eval step=' line) and the record stays worker 1's. Before, both
    were reported and worker 0's record replaced worker 1's."""
    service, (w0, w1) = _cluster()
    _step(w0)
    evaluations: list[tuple[str, int]] = []
    second = _holder(w1, evaluations)

    def stalled() -> dict[str, float]:
        evaluations.append((W0, w0.global_step()))
        second[0].end(second[1])  # type: ignore[arg-type]  # while worker 0 is stopped mid-evaluation
        return {"auc": 0.5}

    first = _holder(w0, evaluations, stalled)
    caplog.set_level("INFO")
    first[0].end(first[1])  # type: ignore[arg-type]
    assert evaluations == [(W0, 1), (W1, 1)]
    assert first[0].inner.history == [] and second[0].inner.history == [(1, {"auc": 0.9})]
    assert [m for m in caplog.messages if m.startswith("eval step=")] == ["eval step=1 auc=0.9000"], caplog.messages
    assert f"{W0}: the final model (global_step 1) was evaluated by {W1} while this worker evaluated it (stalled " \
           "past --lease-ttl?): its own evaluation is not reported" in caplog.messages
    assert service.run_ledger is not None
    assert service.run_ledger.describe().endswith(f", final model evaluated at step 1 by {W1}")
