"""A ps task's ledger of finished training workers: the run is over once every worker's newest process
sent Done (psflow.ps.run_end; issue 25, item 10)."""

from __future__ import annotations

from typing import Any

import pytest

from psflow.cluster import ClusterSpec
from psflow.ps.run_end import RunLedger, describe_workers, training_workers
from psflow.ps.service import ParameterService
from psflow.rpc.api import InvalidRequest
from psflow.rpc.framing import Frame
from psflow.train.chief import training_view

W0, W1, W2 = (f"/job:worker/task:{i}" for i in range(3))


def ledger(expected: list[str], incarnations: dict[str, int] | None = None) -> tuple[RunLedger, list[str]]:
    over: list[str] = []
    seen = incarnations if incarnations is not None else {}
    return RunLedger("/job:ps/task:1", expected, incarnation_of=lambda w: seen.get(w, 0), on_over=over.append), over


def done(ledger: RunLedger, worker: Any, incarnation: Any = 1, **extra: Any) -> dict[str, Any]:
    return ledger.done(Frame({"worker": worker, "incarnation": incarnation, **extra}))[0]


@pytest.mark.parametrize("cluster", [
    {"ps": ["p:1"], "worker": ["w0:1", "w1:1", "w2:1"]},
    {"ps": ["p:1"], "chief": ["c:1"], "worker": ["w0:1", "w1:1"]},
    {"ps": ["p:1"], "chief": ["c:1"]},
    {"ps": ["p:1"], "worker": {1: "w1:1", 4: "w4:1"}},
])
def test_the_expected_workers_are_the_names_the_training_workers_report_under(cluster: dict[str, Any]) -> None:
    spec = ClusterSpec(cluster)
    trainers = [(job, i) for job in ("chief", "worker") if job in spec.jobs for i in spec.task_indices(job)]
    reported = sorted(f"/job:worker/task:{training_view(spec, job, i)[1]}" for job, i in trainers)
    assert training_workers(spec) == reported


def test_a_cluster_without_training_workers_is_never_over() -> None:
    assert training_workers(ClusterSpec({"ps": ["p:1"]})) == []
    runs, over = ledger([])
    with pytest.raises(InvalidRequest, match=r"not a training worker of this cluster \(none\)"):
        done(runs, W0)
    assert not runs.over and over == []


def test_the_run_is_over_when_the_last_worker_is_done_and_only_then() -> None:
    runs, over = ledger([W0, W1, W2])
    assert done(runs, W1, checkpoint_dir=True) == {"ok": True, "run_over": False}
    assert done(runs, W1, checkpoint_dir=True)["run_over"] is False  # idempotent: W1 counted once
    assert done(runs, W0, checkpoint_dir=True, final_checkpoint="ckpt-000000512")["run_over"] is False
    assert not runs.over and over == []
    assert runs.stats() == {"workers_done": [W0, W1], "workers_expected": 3, "run_over": False}
    assert done(runs, W2, checkpoint_dir=True)["run_over"] is True
    assert over == ["workers 0-2 finished, final checkpoint ckpt-000000512 written"]
    done(runs, W2)  # a late repeat does not fire again
    assert len(over) == 1 and runs.stats()["run_over"] is True


def test_what_the_exit_line_says_without_a_final_checkpoint() -> None:
    runs, over = ledger([W0])
    done(runs, W0, checkpoint_dir=True)  # the run checkpoints, but no worker saw a final checkpoint
    assert over == ["worker 0 finished, no final checkpoint reported: see the chief's log"]
    runs, over = ledger([W0, W1])
    done(runs, W0)
    done(runs, W1)
    assert over == ["workers 0-1 finished, no checkpoint directory"]


def test_a_worker_restarted_after_its_done_must_finish_again() -> None:
    incarnations = {W0: 5}
    runs, over = ledger([W0, W1], incarnations)
    done(runs, W0, incarnation=5)
    incarnations[W0] = 9  # a new process of worker 0 pushed (or claimed its reader position)
    assert done(runs, W1, incarnation=1)["run_over"] is False
    assert runs.stats()["workers_done"] == [W1]
    assert done(runs, W0, incarnation=9)["run_over"] is True
    assert over == ["workers 0-1 finished, no checkpoint directory"]


def test_a_worker_that_registers_again_after_its_done_must_finish_again() -> None:
    runs, over = ledger([W0, W1])  # a ps task that sees no push of the new process (its data had ended)
    done(runs, W0)
    runs.joined(W0)  # the restarted worker 0 registers as it joins the cluster
    runs.joined("launcher")  # not a training worker: ignored
    assert done(runs, W1)["run_over"] is False and runs.stats()["workers_done"] == [W1]
    assert done(runs, W0)["run_over"] is True and len(over) == 1
    runs.joined(W0)  # once over, nothing changes
    assert runs.over and runs.stats()["workers_done"] == [W0, W1]


def test_an_earlier_process_done_does_not_count() -> None:
    runs, over = ledger([W0], {W0: 9})
    assert done(runs, W0, incarnation=5)["run_over"] is False and over == []


@pytest.mark.parametrize("meta, message", [
    ({"worker": "/job:worker/task:7", "incarnation": 1}, r"'/job:worker/task:7', not a training worker .*workers 0-1"),
    ({"worker": "/job:ps/task:0", "incarnation": 1}, "not a training worker"),
    ({"worker": 3, "incarnation": 1}, "'worker' must be a training worker's task name"),
    ({"worker": W0}, "'incarnation' must be a non-negative integer"),
    ({"worker": W0, "incarnation": -1}, "'incarnation' must be a non-negative integer"),
    ({"worker": W0, "incarnation": True}, "'incarnation' must be a non-negative integer"),
    ({"worker": W0, "incarnation": 1, "checkpoint_dir": "yes"}, "'checkpoint_dir' must be true or false"),
    ({"worker": W0, "incarnation": 1, "final_checkpoint": "ckpt-1\nps/0: run over"}, "'final_checkpoint' must be"),
    ({"worker": W0, "incarnation": 1, "final_checkpoint": "../x"}, "'final_checkpoint' must be"),
    ({"worker": W0, "incarnation": 1, "final_checkpoint": 7}, "'final_checkpoint' must be"),
])
def test_a_malformed_done_is_refused_naming_the_task_and_counts_nothing(meta: dict[str, Any], message: str) -> None:
    runs, over = ledger([W0, W1])
    with pytest.raises(InvalidRequest, match=message) as refused:
        runs.done(Frame(meta))
    assert str(refused.value).startswith("/job:ps/task:1: ")
    assert runs.stats()["workers_done"] == [] and over == []


def test_the_parameter_service_reports_the_highest_incarnation_it_saw() -> None:
    svc = ParameterService(0, holds_global_step=True)
    assert svc.workers.incarnation_of(W0) == 0
    svc.workers.claim(W0, 42, drain_timeout=0.0)
    assert svc.workers.incarnation_of(W0) == 42 and svc.workers.incarnation_of(W1) == 0


def test_workers_are_described_by_index_runs() -> None:
    assert describe_workers([W0]) == "worker 0"
    assert describe_workers([W2, W0, W1]) == "workers 0-2"
    assert describe_workers([f"/job:worker/task:{i}" for i in (0, 1, 4, 6, 7)]) == "workers 0-1, 4, 6-7"


def final_eval(ledger: RunLedger, worker: Any, step: Any, evaluated: bool = False) -> dict[str, Any]:
    return ledger.final_eval(Frame({"worker": worker, "step": step, "evaluated": evaluated}))[0]


def test_the_final_evaluation_is_recorded_the_newest_kept_and_named_in_the_exit_line() -> None:
    runs, over = ledger([W0, W1])
    assert final_eval(runs, W0, 40) == {"step": None, "worker": None}  # asking records nothing
    assert final_eval(runs, W0, 40, evaluated=True) == {"step": 40, "worker": W0}
    assert final_eval(runs, W1, 30, evaluated=True) == {"step": 40, "worker": W0}  # an older model's: not kept
    assert final_eval(runs, W1, 40) == {"step": 40, "worker": W0}
    done(runs, W0)
    done(runs, W1)
    assert over == [f"workers 0-1 finished, no checkpoint directory, final model evaluated at step 40 by {W0}"]


def test_the_final_evaluation_travels_with_a_replicated_ledger_and_a_bad_one_is_refused() -> None:
    runs, _ = ledger([W0, W1])
    final_eval(runs, W1, 7, evaluated=True)
    backup, _ = ledger([W0, W1])
    backup.load_replica_state(runs.replica_state())
    assert final_eval(backup, W0, 7) == {"step": 7, "worker": W1}
    backup.load_replica_state({"done": [], "over": False})  # a primary's state without one: none
    assert final_eval(backup, W0, 7) == {"step": None, "worker": None}
    backup.load_replica_state(runs.replica_state())
    other, _ = ledger([W0, W1])
    done(other, W0)  # a state of other reports, whose final evaluation is malformed: none of it is taken
    with pytest.raises(ValueError, match="malformed final evaluation"):
        backup.load_replica_state(dict(other.replica_state(), final_eval=[7, "worker 1\n"]))
    assert final_eval(backup, W0, 7) == {"step": 7, "worker": W1}  # the state refused left the ledger as it was
    assert backup.replica_state() == runs.replica_state()


@pytest.mark.parametrize(("meta", "message"), [
    ({"worker": W0}, "'step' must be a non-negative integer"),
    ({"worker": W0, "step": -1}, "'step' must be a non-negative integer"),
    ({"step": 3}, "'worker' must be a task name"),
    ({"worker": "w0\nINFO forged line", "step": 3}, "'worker' must be a task name"),
    ({"worker": W0, "step": 3, "evaluated": "yes"}, "'evaluated' must be true or false"),
])
def test_a_malformed_final_evaluation_is_refused_naming_the_field(meta: dict[str, Any], message: str) -> None:
    runs, _ = ledger([W0])
    with pytest.raises(InvalidRequest, match=f"/job:ps/task:1: FinalEval: {message}"):
        runs.final_eval(Frame(meta))
    assert final_eval(runs, W0, 3) == {"step": None, "worker": None}
