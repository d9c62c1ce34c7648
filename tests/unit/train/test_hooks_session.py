"""Hook lifecycle, built-in hooks and the chief rule, without sockets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

import psflow.train.session as session_module
from psflow.cluster import ClusterSpec
from psflow.data import BatchSource, ReaderPosition
from psflow.optim import OptimizerSpec
from psflow.train.chief import JoinResult, is_chief
from psflow.train.duties import epochs_completed
from psflow.train.hooks import (
    NanLossError,
    NanLossHook,
    RunContext,
    RunValues,
    SessionRunHook,
    StopAfterEpochsHook,
    StopAtStepHook,
    WorkerProgressHook,
)
from psflow.train.session import MonitoredTrainingSession


@dataclass
class Step:
    step: int
    loss: float = 0.5
    examples: int = 1
    metrics: dict[str, float] = field(default_factory=dict)
    completed: bool = True
    min_clock: int | None = None


class Recorder(SessionRunHook):
    def __init__(self, calls: list[str], name: str, stop_after: int | None = None) -> None:
        self.calls, self.name, self.stop_after = calls, name, stop_after

    def begin(self) -> None:
        self.calls.append(f"{self.name}.begin")

    def after_create_session(self, session: MonitoredTrainingSession) -> None:
        self.calls.append(f"{self.name}.after_create_session")

    def before_run(self, context: RunContext) -> None:
        self.calls.append(f"{self.name}.before_run")

    def after_run(self, context: RunContext, values: RunValues) -> None:
        self.calls.append(f"{self.name}.after_run:{values.step}")
        if self.stop_after is not None and values.step >= self.stop_after:
            context.request_stop()

    def end(self, session: MonitoredTrainingSession) -> None:
        self.calls.append(f"{self.name}.end")


class FakeClient:
    client_name = "/job:worker/task:0"


@pytest.fixture
def no_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    def join(client: Any, optimizer: Any, **kw: Any) -> JoinResult:
        return JoinResult(created=kw["chief"], restored=None, global_step=5, reader_position=None)

    monkeypatch.setattr(session_module, "join_cluster", join)


def _session(hooks: list[SessionRunHook], chief_hooks: tuple[SessionRunHook, ...] = (), chief: bool = True) -> MonitoredTrainingSession:
    return MonitoredTrainingSession(FakeClient(), OptimizerSpec("sgd", {"learning_rate": 0.1}),  # type: ignore[arg-type]
                                    is_chief=chief, hooks=hooks, chief_only_hooks=chief_hooks)


def test_lifecycle_order_and_stop(no_cluster: None) -> None:
    calls: list[str] = []
    with _session([Recorder(calls, "a", stop_after=7), Recorder(calls, "b")]) as sess:
        assert sess.global_step == 5
        step = 5
        while not sess.should_stop():
            step += 1
            sess.run(lambda s=step: Step(s))  # type: ignore[misc]
    assert calls == [
        "a.begin", "b.begin", "a.after_create_session", "b.after_create_session",
        "a.before_run", "b.before_run", "a.after_run:6", "b.after_run:6",
        "a.before_run", "b.before_run", "a.after_run:7", "b.after_run:7",
        "a.end", "b.end",
    ]


def test_a_step_that_completed_nothing_runs_no_after_run_hook_and_report_runs_them_later(no_cluster: None) -> None:
    """A pipelined step (psflow.train.pipeline) returns None while it fills, and its last results come from
    drain(): the hooks see each result once, when it arrives."""
    calls: list[str] = []
    with _session([Recorder(calls, "a", stop_after=7)]) as sess:
        assert sess.run(lambda: None) is None
        assert not sess.should_stop()
        sess.run(lambda: Step(6))
        sess.report(Step(7))
        assert sess.should_stop() and sess.global_step == 7
    assert calls == ["a.begin", "a.after_create_session", "a.before_run", "a.before_run", "a.after_run:6",
                     "a.after_run:7", "a.end"]


def test_exception_skips_end_and_chief_only_hooks_only_on_chief(no_cluster: None) -> None:
    calls: list[str] = []
    with pytest.raises(NanLossError, match="loss is nan at global_step 6"):
        with _session([NanLossHook(), Recorder(calls, "a")]) as sess:
            sess.run(lambda: Step(6, loss=float("nan")))
    assert "a.end" not in calls and "a.after_run:6" not in calls
    calls.clear()
    with _session([], (Recorder(calls, "chief"),), chief=False):
        pass
    assert calls == []


def test_a_nan_loss_names_the_worker_the_step_and_the_batch_source(no_cluster: None) -> None:
    source = BatchSource((("a9a", 1409, 1536, 128),), 1, 1, line_based=True)
    with pytest.raises(NanLossError) as caught, _session([NanLossHook()]) as sess:
        sess.run(lambda: Step(31, loss=float("inf")), source=source)
    assert str(caught.value).startswith("/job:worker/task:0: loss is inf at global_step 31, on the batch of a9a lines "
                                        "1409-1536, epoch 1; ")
    assert "\n" not in str(caught.value)
    with pytest.raises(NanLossError, match="global_step 7, on a batch of unknown source"), _session([NanLossHook()]) as sess:
        sess.run(lambda: Step(7, loss=float("nan")))


def test_stop_at_step_counts_steps_before_a_restore(no_cluster: None) -> None:
    ran: list[int] = []
    with _session([StopAtStepHook(last_step=5)]) as sess:  # restored at 5: nothing left to do
        assert sess.run(lambda: Step(6)) is None and sess.should_stop()
    with _session([StopAtStepHook(num_steps=2)]) as sess:
        while not sess.should_stop():
            ran.append(sess.global_step + 1)
            sess.run(lambda: Step(ran[-1]))
    assert ran == [6, 7]


def test_the_stop_hook_decides_and_says_why(no_cluster: None) -> None:
    """The loop reads the stop and its reason from the session (a worker's stop_reason): the first hook's."""
    with _session([StopAtStepHook(last_step=7), Recorder([], "r", stop_after=7)]) as sess:
        sess.run(lambda: Step(6))
        assert not sess.should_stop() and sess.stop_reason is None
        sess.run(lambda: Step(7))
        assert sess.should_stop() and sess.stop_reason == "global_step reached max_steps=7"
    with _session([StopAtStepHook(last_step=5)]) as sess:  # another worker's push reached it: no step runs
        assert sess.run(lambda: Step(6)) is None
        assert sess.stop_reason == "stopped at global_step 5 (max_steps=5)"
    with _session([Recorder([], "r", stop_after=6)]) as sess:  # a hook that gives no reason
        sess.run(lambda: Step(6))
        assert sess.should_stop() and sess.stop_reason is None


def test_worker_progress_is_logged_by_its_hook_once_per_owned_multiple(
        no_cluster: None, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="psflow.worker")
    with _session([WorkerProgressHook(3, every_steps=2)]) as sess:
        for step, completed in ((6, True), (7, True), (8, False), (10, True)):
            ran = Step(step, loss=0.25, examples=4, metrics={"auc": 0.75}, completed=completed, min_clock=step - 1)
            sess.run(lambda ran=ran: ran)  # type: ignore[misc]
    lines = [r.getMessage() for r in caplog.records if r.name == "psflow.worker"]
    steps = [line for line in lines if "step=" in line and "clock" not in line]
    assert [line.split(" examples/s=")[0] for line in steps] == [
        "worker 3: step=6 loss=0.2500 auc=0.7500", "worker 3: step=10 loss=0.2500 auc=0.7500"]
    assert [line for line in lines if "clock=" in line] == ["worker 3: clock=2 min_clock=6",
                                                            "worker 3: clock=4 min_clock=9"]


def test_stop_after_epochs_and_epoch_counting(no_cluster: None) -> None:
    assert epochs_completed(ReaderPosition(epoch=0, file_index=0, path="f")) == 0
    assert epochs_completed(ReaderPosition(epoch=0, file_index=1, path="")) == 1
    with _session([StopAfterEpochsHook(2)]) as sess:
        sess.run(lambda: Step(6), epochs_completed=1)
        assert not sess.should_stop()
        sess.run(lambda: Step(7), epochs_completed=2)
        assert sess.should_stop()


def test_chief_is_chief_job_task_0_else_worker_0() -> None:
    plain = ClusterSpec({"ps": ["h:1"], "worker": ["h:2", "h:3"]})
    assert is_chief(plain, "worker", 0) and not is_chief(plain, "worker", 1) and not is_chief(plain, "ps", 0)
    with_chief = ClusterSpec({"ps": ["h:1"], "chief": ["h:4"], "worker": ["h:2"]})
    assert is_chief(with_chief, "chief", 0) and not is_chief(with_chief, "worker", 0)
