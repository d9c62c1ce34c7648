"""The in-graph client's batch (issue 26, item 7): a worker that failed its step runs its slice again once it is
back, and every slice's gradient is pushed once, by the client; a worker that does not come back ends the run
with one error naming it; at the session's end every worker is reported Done. Fake
worker sessions and a fake ps client, no sockets: the real thing runs in tests/integration/test_in_graph.py."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from psflow.cluster import ClusterSpec
from psflow.data import Batch
from psflow.gradients import DenseGradient
from psflow.ps.client import PushResult
from psflow.ps.protocol import RunStepReply
from psflow.rpc.api import TaskUnavailableError
from psflow.train.config import TrainConfig
from psflow.train.hooks import NanLossError
from psflow.train.in_graph_client import InGraphDriver, _report_run_over
from psflow.train.recovery import RecoveryError


@dataclass
class FakeSession:
    """A worker: its step returns ``loss`` and a gradient of ones; the first ``failures`` calls find it gone."""

    task: str
    failures: int = 0
    loss: float = 0.5
    calls: int = 0
    reconnects: int = 0

    def run_async(self, step_fn: str, batch: Batch, *, push: bool) -> Any:
        assert not push  # the client pushes
        self.calls += 1

        def result() -> tuple[RunStepReply, dict[str, DenseGradient]]:
            if self.failures:
                self.failures -= 1
                raise TaskUnavailableError(f"{self.task}: RunStep: UNAVAILABLE: connection refused")
            return RunStepReply(self.loss, 7), {"w": DenseGradient(np.full(2, float(batch.num_examples), np.float32))}

        return result

    def run(self, step_fn: str, batch: Batch, *, push: bool) -> tuple[RunStepReply, dict[str, DenseGradient]]:
        return self.run_async(step_fn, batch, push=push)()  # type: ignore[no-any-return]

    def reconnect(self) -> None:
        self.reconnects += 1

    def connect(self, timeout: float | None = None) -> None:
        pass


@dataclass
class FakeClient:
    """The client's pushes, each with the reader position it carried."""

    pushes: list[tuple[float, int, str | None]] = field(default_factory=list)

    def push_detailed(self, grads: Any, *, examples: int, loss: float, read_step: int | None, position: str | None,
                      generation: int | None) -> PushResult:
        self.pushes.append((float(grads["w"].values[0]), examples, position))
        return PushResult(len(self.pushes), True, True, None)

    def global_step(self) -> int:
        return len(self.pushes)


def driver(sessions: list[FakeSession], mode: str = "async", connect_timeout: float = 30.0) -> tuple[InGraphDriver, FakeClient]:
    config = TrainConfig.flat(train=("unused",), num_features=3, mode=mode, log_every=1000, connect_timeout=connect_timeout)
    client = FakeClient()
    return InGraphDriver(config, None, client, sessions), client  # type: ignore[arg-type]


BATCH = Batch(np.zeros(10, np.float32), {}, {})  # slices of 5 and 5


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_worker_that_failed_runs_its_slice_again_and_each_gradient_is_pushed_once(mode: str) -> None:
    sessions = [FakeSession("/job:worker/task:0"), FakeSession("/job:worker/task:1", failures=2)]
    d, client = driver(sessions, mode)
    result = d.run_batch(BATCH, "position-after-batch")
    assert [s.calls for s in sessions] == [1, 3] and sessions[1].reconnects == 2
    # async: one push per slice (5 examples each); sync: one push of the mean, for all 10
    expected = [(5.0, 5, "position-after-batch")] * 2 if mode == "async" else [(5.0, 10, "position-after-batch")]
    assert client.pushes == expected
    assert result.steps == tuple(range(1, len(expected) + 1)) and result.examples == 10 and d.examples == 10


def test_a_worker_that_does_not_come_back_ends_the_run_naming_it() -> None:
    sessions = [FakeSession("/job:worker/task:0"), FakeSession("/job:worker/task:1", failures=10**6)]
    d, client = driver(sessions, connect_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(RecoveryError, match=r"/job:worker/task:1 did not run its slice of the batch again within 0.5 s "
                                            r"\(--connect-timeout\)"):
        d.run_batch(BATCH, "p")
    assert time.monotonic() - started >= 0.5 and client.pushes == []  # nothing of the batch pushed


def test_a_slice_whose_loss_is_not_finite_is_named_and_nothing_is_pushed() -> None:
    sessions = [FakeSession("/job:worker/task:0"), FakeSession("/job:worker/task:1", loss=float("nan"))]
    d, client = driver(sessions)
    with pytest.raises(NanLossError, match=r"^/job:worker/task:1: loss is nan at global_step 7, "):
        d.run_batch(BATCH, "p")
    assert client.pushes == []


@dataclass
class EndingClient:
    """The client at the session's end."""

    done_for: list[str] = field(default_factory=list)

    def report_done(self, *, checkpoint_dir: bool, final_checkpoint: str | None, worker: str) -> list[str]:
        self.done_for.append(worker)
        return []


def test_the_session_s_end_reports_every_worker_done() -> None:
    """The session ended (its final checkpoint written): every ps task hears Done for each worker (else psflow
    server's ps tasks serve on). A Leave no ps task heard (sent before the session's end) is a WARNING, not a
    failed run: tests/unit/train/test_in_graph_leave_order.py."""
    config = TrainConfig.flat(train=("unused",), num_features=3)
    cluster = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]})
    client = EndingClient()
    _report_run_over(config, cluster, client)  # type: ignore[arg-type]
    assert client.done_for == ["/job:worker/task:0", "/job:worker/task:1"]


def test_sync_weights_each_slice_by_its_examples_as_one_process_on_the_batch() -> None:
    """A batch that does not split evenly (an epoch's last: 5 examples on 3 workers, slices of 1, 2 and 2): the
    pushed gradient and the loss are those of one process on the batch, each slice's mean weighted by its share
    (the unweighted mean of the slices' gave the 1-example slice 1/3 of the step instead of 1/5)."""
    sessions = [FakeSession(f"/job:worker/task:{i}", loss=loss) for i, loss in enumerate((0.1, 0.4, 0.4))]
    d, client = driver(sessions, "sync")
    result = d.run_batch(Batch(np.zeros(5, np.float32), {}, {}), "p")
    (gradient, examples, _), = client.pushes  # each slice's gradient is its number of examples
    assert examples == 5 and gradient == pytest.approx((1 * 1 + 2 * 2 + 2 * 2) / 5)
    assert result.loss == pytest.approx((1 * 0.1 + 2 * 0.4 + 2 * 0.4) / 5)
