"""A worker lingering after its data ended (:meth:`psflow.train.recovery.ClusterRecovery.linger`), every worker
finished, when a ps task is lost after the last step: it leaves once the others' sessions ended (the holder's final
checkpoint written), rather than waiting for a restore nobody is left to make; a restore the holder does make still
rewinds it.

Before: it waited in :meth:`~psflow.train.recovery.ClusterRecovery.wait` for the timeout and raised RecoveryError
(the real run: 'cluster not restored within 60 s', its restarts 'not initialized by the chief', the run failed;
tests/integration/test_ps_lost_in_final_eval.py). A scripted cluster: each poll's ps task 0 ``Stats`` and every
task's state come from a list; no time is asserted (a wait for the timeout fails the test by its exception).
"""

from __future__ import annotations

from typing import Any

import pytest

from psflow.cluster import ClusterSpec
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.protocol import StatsReply
from psflow.ps.sync import SyncConfig
from psflow.train.recovery import ClusterRecovery, RecoveryError

_ME, _OTHER = "/job:worker/task:1", "/job:worker/task:0"


def _ps(task: int, *, ready: bool = True, generation: int = 0, done: tuple[str, ...] = ()) -> StatsReply:
    step = {"global_step": 64, "finished": (_ME, _OTHER), "counters": {"run_end": {"workers_done": list(done)}}}
    return StatsReply(task=f"/job:ps/task:{task}", ready=ready, generation=generation, registered=ready,
                      **(step if task == 0 else {}))


def _layout() -> dict[str, Any]:
    """weights on ps task 0, bias on ps task 1: the lost task held variables (not idle: psflow.train.idle_tasks)."""
    vs = VariableSet(replica_device_setter(cluster=ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})))
    vs.get_variable("weights", (8, 2))
    vs.get_variable("bias", (2,))
    return {p.var.name: p for p in vs.placements()}


class _Client:
    client_name, step_task = _ME, 0
    router, sync, channels, layout = None, SyncConfig(), {0: None, 1: None}, _layout()

    def __init__(self, rounds: list[dict[int, StatsReply | None]]) -> None:
        self.rounds, self.asked = rounds, 0

    def now(self) -> dict[int, StatsReply | None]:
        return self.rounds[min(self.asked, len(self.rounds) - 1)]

    def ps_stats(self) -> StatsReply:
        self.asked += 1
        reply = self.now()[0]
        assert reply is not None
        return reply

    def reader_positions(self) -> dict[str, Any]:
        return {_ME: '{"at": 7}'}


class _Recovery(ClusterRecovery):
    def _states(self) -> dict[int, StatsReply | None]:
        return self.client.now()  # type: ignore[attr-defined, no-any-return]


def _recovery(rounds: list[dict[int, StatsReply | None]], *, lease: Any = None, timeout: float = 3.0) -> _Recovery:
    return _Recovery(_Client(rounds), OptimizerSpec("sgd", {"learning_rate": 0.1}), checkpoint_dir="/nonexistent", leader=lambda: lease,
                     timeout=timeout, generation=0)


def test_leaves_when_the_others_ended_and_a_ps_task_was_lost_after_the_last_step(caplog: pytest.LogCaptureFixture) -> None:
    lost = {0: _ps(0, done=(_OTHER,)), 1: _ps(1, ready=False)}
    assert _recovery([lost]).linger(2, poll=0.01, first_poll=0.01) == (False, None)
    assert "/job:ps/task:1 was lost after the last step and nobody is left to restore it" in caplog.text


def test_leaves_when_the_task_is_unreachable_too() -> None:
    assert _recovery([{0: _ps(0, done=(_OTHER,)), 1: None}]).linger(2, poll=0.01, first_poll=0.01) == (False, None)


def test_waits_for_the_holder_s_end_then_leaves() -> None:
    ending = {0: _ps(0), 1: _ps(1, ready=False)}  # the holder in its final evaluation: no Done yet
    recovery = _recovery([ending] * 5 + [{0: _ps(0, done=(_OTHER,)), 1: _ps(1, ready=False)}])
    assert recovery.linger(2, poll=0.01, first_poll=0.01) == (False, None)
    assert recovery.client.asked == 5  # type: ignore[attr-defined]  # (it polled on, and left at the Done)


def test_a_restore_the_holder_makes_meanwhile_still_rewinds_it() -> None:
    ending = {0: _ps(0), 1: _ps(1, ready=False)}
    restored = {0: _ps(0, generation=5), 1: _ps(1, generation=5)}
    recovery = _recovery([ending] * 3 + [restored])
    assert recovery.linger(2, poll=0.01, first_poll=0.01) == (True, '{"at": 7}')
    assert recovery.generation == 5


def test_a_holder_that_never_ends_nor_restores_is_waited_for_at_most_the_timeout() -> None:
    with pytest.raises(RecoveryError, match="not restored within"):
        _recovery([{0: _ps(0), 1: _ps(1, ready=False)}], timeout=0.3).linger(2, poll=0.01, first_poll=0.01)
