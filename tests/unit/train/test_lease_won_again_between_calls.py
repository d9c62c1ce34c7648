"""A chief duty whose worker lost the lease and won a new one between two of its calls is set up again, as on any
take-over (:meth:`~psflow.train.hook_api.SessionRunHook.after_create_session`).

LeaderOnlyHook told a take-over only by "not leading at the last call, leading now": a worker whose lease lapsed
(a step longer than --lease-ttl: a stopped or paused process) while another worker took the duties, and that won a
new lease (the other resigned: its data ended) before its own next call, went on as if it had held the duties all
along. Its summary hook wrote on in its own file, which sorts before the file the other holder created meanwhile:
TensorBoard reads a directory's files in name order, so these later points came before the other holder's earlier
ones (a live TensorBoard, which has moved on to the newer file, never reads them: the rest of the run missing).
A lease is now told by its grant (holder and epoch): a new grant is a take-over; a renewal is not.

Real in-process ps services (tests/two_ps_in_process.py), the real SummarySaverHook behind LeaderOnlyHook; read back
with TensorBoard's EventAccumulator.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from summary_holders import loss_steps, summary_holders
from two_ps_in_process import SGD, train_a_step, two_ps_cluster

from psflow.coord import Lease
from psflow.train.hook_api import RunContext, RunValues, SessionRunHook
from psflow.train.leader_hooks import LeaderOnlyHook
from psflow.train.session import MonitoredTrainingSession

pytestmark = pytest.mark.timeout(60)


class _Leadership:
    """Hands out the lease named in ``grants`` for this candidate (None: not leading)."""

    def __init__(self, name: str, grants: dict[str, Lease | None]) -> None:
        self.candidate, self.grants = name, grants

    def lease(self) -> Lease | None:
        return self.grants.get(self.candidate)


def _grant(name: str, epoch: int, expires_at: float = float("inf")) -> Lease:
    return Lease("chief", name, f"{name}#{epoch}", epoch, 10.0, expires_at)


class _Recording(SessionRunHook):
    def __init__(self) -> None:
        self.set_up = 0

    def after_create_session(self, session: Any) -> None:
        self.set_up += 1


def test_a_new_grant_is_a_take_over_and_a_renewal_is_not() -> None:
    grants: dict[str, Lease | None] = {"a": _grant("a", 7)}
    inner = _Recording()
    hook = LeaderOnlyHook(inner, _Leadership("a", grants))  # type: ignore[arg-type]
    session: Any = SimpleNamespace()
    hook.after_create_session(session)
    assert inner.set_up == 1
    grants["a"] = _grant("a", 7, expires_at=1e12)  # renewed: the same grant
    hook.end(session)
    assert inner.set_up == 1
    grants["a"] = _grant("a", 9)  # lost and won again (epoch 8 was another worker's) between two calls
    hook.end(session)
    assert inner.set_up == 2  # before: 1 (the new grant went unnoticed)


def test_points_after_the_lease_won_again_are_read_after_the_other_holders(tmp_path: Path) -> None:
    client, _ = two_ps_cluster()
    with MonitoredTrainingSession(client, SGD, is_chief=True):  # the cluster initialized and ready
        pass
    logdir = tmp_path / "summaries"
    grants: dict[str, Lease | None] = {"a": _grant("a", 7), "b": None}
    writers, hooks, sessions = summary_holders(client, logdir, ("a", "b"), lambda name: _Leadership(name, grants))
    for name in ("a", "b"):
        hooks[name].after_create_session(sessions[name])

    def step(name: str) -> None:
        train_a_step(client)
        sessions[name].global_step = client.global_step()
        context = RunContext(session=sessions[name], local_step=0)  # type: ignore[arg-type]
        hooks[name].before_run(context)
        hooks[name].after_run(context, RunValues(step=sessions[name].global_step, loss=0.5, examples=1))

    for _ in range(2):
        step("a")  # 1, 2
    grants["a"], grants["b"] = None, _grant("b", 8)  # a's lease lapsed in a long step; b took the duties
    for _ in range(2):
        step("b")  # 3, 4 (its timer starts at its take-over, 3: a point at 4), in b's file, created now: sorting last
    grants["a"], grants["b"] = _grant("a", 9), None  # b resigned (its data ended); a won a new lease, still in its step
    for _ in range(2):
        step("a")  # 5, 6
    for writer in writers.values():
        writer.close()
    # before: [1, 2, 5, 6, 4] (a's 5 and 6 in its own file, sorting before b's); now a's timer starts again at 5,
    # as on any take-over, and its point goes to a file sorting after b's
    assert loss_steps(logdir) == [1, 2, 4, 6]
