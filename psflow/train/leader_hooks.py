"""The chief duties' hooks that follow the chief lease (:class:`~psflow.train.recovery.Leadership`): a duty runs
only while this worker holds it (:class:`LeaderOnlyHook`), and a worker campaigns from its first step on
(:class:`CampaignWhileTrainingHook`); see :mod:`psflow.train.recovery` for the election. Moved from there
verbatim (layout limit); :mod:`psflow.train.recovery` still exports both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from psflow.errors import CheckpointError
from psflow.rpc.api import RpcError
from psflow.train.hook_api import duty_of
from psflow.train.hooks import RunContext, RunValues, SessionRunHook

if TYPE_CHECKING:
    from psflow.train.recovery import Leadership

__all__ = ["LeaderOnlyHook", "CampaignWhileTrainingHook"]

#: The election's logger (psflow.train.recovery's): these lines read as they did.
log = logging.getLogger("psflow.recovery")


class LeaderOnlyHook(SessionRunHook):
    """Runs ``inner`` only while this worker holds the chief lease (each call, ``before_run`` included).

    On gaining the lease, ``inner.after_create_session`` runs first (timers
    start from the current step); also on a new lease won since the last call, the one before lost meanwhile (a
    grant of its own: another worker may have held the duties in between, and its files sort after this one's).
    ``inner.after_initialize`` (the configured chief, which initialized a fresh cluster: the initial checkpoint) runs if this worker
    holds the lease then (it campaigns before it joins). A checkpoint or RPC failure inside the hook
    (a ps task died, or this chief was deposed and its save fenced off) is
    logged, not raised: the next chief, or the next period, saves again. The
    final checkpoint has no next period: its failure for any reason but a
    newer chief's fence is a :class:`~psflow.checkpoint.save.FinalCheckpointError`,
    which is not caught here, so the session, the worker and the run fail.
    """

    def __init__(self, inner: SessionRunHook, leadership: Leadership) -> None:
        self.inner = inner
        self.leadership = leadership
        self._grant: tuple[str, int] | None = None  # (holder, epoch) of the lease held at the last call

    def begin(self) -> None:
        self.inner.begin()

    def _leading(self, session: Any) -> bool:
        lease = self.leadership.lease()
        grant = None if lease is None else (lease.holder, lease.epoch)  # (a renewal keeps both)
        if grant is not None and grant != self._grant:  # a take-over: also a lease lost and won again since the
            self._guard(lambda: self.inner.after_create_session(session), "taking the duties")  # last call
            # (another held it meanwhile)
        self._grant = grant
        return grant is not None

    def after_initialize(self, session: Any) -> None:
        if self.leadership.lease() is not None:
            self._guard(lambda: self.inner.after_initialize(session), "after initializing the cluster")

    def after_create_session(self, session: Any) -> None:
        self._leading(session)

    def after_restore(self, session: Any, checkpoint: str | None, step: int | None) -> None:
        if self._leading(session):  # SummarySaverHook's START after a restore within the run
            self._guard(lambda: self.inner.after_restore(session, checkpoint, step), "after a restore")

    def before_run(self, context: RunContext) -> None:
        if self._leading(context.session):  # e.g. SummarySaverHook's START after a restore its join waited for
            self._guard(lambda: self.inner.before_run(context), "before a step")

    def after_run(self, context: RunContext, values: RunValues) -> None:
        if self._leading(context.session):
            self._guard(lambda: self.inner.after_run(context, values), f"after step {values.step}")

    def end(self, session: Any) -> None:
        if self._leading(session):
            self._guard(lambda: self.inner.end(session), "at the end")

    def _guard(self, call: Callable[[], None], when: str) -> None:
        try:
            call()
        except (CheckpointError, RpcError) as e:
            log.error("%s: chief duty %s skipped %s: %s", self.leadership.candidate, duty_of(self.inner), when, e)


class CampaignWhileTrainingHook(SessionRunHook):
    """Starts this worker's campaign for the chief lease after each of its steps, when it is not
    campaigning (its first step, or the first after a restore rewound it); see the module docstring."""

    def __init__(self, leadership: Leadership) -> None:
        self.leadership = leadership

    def after_run(self, context: RunContext, values: RunValues) -> None:
        if not self.leadership.campaigning():
            self.leadership.start()
