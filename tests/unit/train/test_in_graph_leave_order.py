"""The in-graph client leaves (``Leave``) when its data ends, before its session's end writes the final checkpoint
and runs the final evaluation, as a between-graph worker does (:mod:`psflow.train.worker`: it leaves, then its
session ends).

Reviewing 515ef99: the client left only after its session's end, so the launcher's chaos thread, which counts
training as ended at the step task's count of Leave (:meth:`psflow.launch.resilience.Resilience._training_ended`),
still fired a fault that came due at the last step, or whose round was waiting for a target, during the final
save or evaluation: a between-graph run drops those faults ('not fired: training ended'), and an in-graph run
with ``--restart-policy never`` failed after its training was done. The parts the client is made of are fakes
here (no sockets): the order of its calls is what is tested; tests/integration/test_in_graph.py runs the real thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

import psflow.train.in_graph_client as client_module
from psflow.cluster import ClusterSpec
from psflow.rpc.api import TaskUnavailableError
from psflow.train.config import TrainConfig

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]})


@dataclass
class Calls:
    order: list[str] = field(default_factory=list)
    leave_fails: bool = False


class FakeParameterClient:
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    def connect(self) -> None:
        pass

    def ps_stats(self) -> Any:
        return type("Stats", (), {"generation": 1})()

    def leave(self) -> None:
        self.calls.order.append("leave")
        if self.calls.leave_fails:
            raise TaskUnavailableError("/job:ps/task:0: Leave: UNAVAILABLE: connection refused")

    def report_done(self, *, checkpoint_dir: bool, final_checkpoint: str | None, worker: str) -> list[str]:
        self.calls.order.append(f"done {worker}")
        return []

    def close(self) -> None:
        self.calls.order.append("close")


class FakeMonitored:
    """The session: its end is the final checkpoint and evaluation."""

    global_step = 0
    join_result = None  # its join restored nothing

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.hooks: list[Any] = []  # (no evaluation hook: its result's eval_not_done is [])

    def __enter__(self) -> FakeMonitored:
        return self

    def __exit__(self, *exc: object) -> None:
        self.calls.order.append("session end (final save, evaluation)")


def _run(monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    class FakeDriver:
        steps = examples = 0

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

    def train(*args: Any) -> tuple[int, str]:
        calls.order.append("train")
        return 3, "end of data"

    monkeypatch.setattr(client_module, "Session", lambda *a, **k: type("S", (), {
        "connect": lambda self: None, "close": lambda self: None})())
    monkeypatch.setattr(client_module, "build_model", lambda config, cluster: (None, type("V", (), {
        "placements": lambda self: {}})()))
    monkeypatch.setattr(client_module, "ParameterClient", lambda *a, **k: FakeParameterClient(calls))
    monkeypatch.setattr(client_module, "make_session", lambda *a, **k: FakeMonitored(calls))
    monkeypatch.setattr(client_module, "_restore_initialized_cluster", lambda config, client: None)
    monkeypatch.setattr(client_module, "InGraphDriver", FakeDriver)
    monkeypatch.setattr(client_module, "_train", train)
    client_module.run_in_graph_client(TrainConfig.flat(train=("unused",), num_features=3), CLUSTER)


def test_the_client_leaves_when_its_data_ends_before_its_final_save_and_evaluation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = Calls()
    _run(monkeypatch, calls)
    assert calls.order == ["train", "leave", "session end (final save, evaluation)",
                           "done /job:worker/task:0", "done /job:worker/task:1", "close"]


def test_a_leave_no_ps_task_heard_is_a_warning_and_the_session_still_ends(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    calls = Calls(leave_fails=True)
    _run(monkeypatch, calls)
    assert calls.order == ["train", "leave", "session end (final save, evaluation)",
                           "done /job:worker/task:0", "done /job:worker/task:1", "close"]
    assert any("did not hear it leave" in r.getMessage() and "/job:ps/task:0: Leave: UNAVAILABLE" in r.getMessage()
               and r.levelname == "WARNING" for r in caplog.records), caplog.records
