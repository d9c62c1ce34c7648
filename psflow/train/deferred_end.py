"""A chief duty whose ``end()`` error is raised after another duty's ``end()`` (:class:`DeferredEnd`,
:class:`RaiseDeferred`).

:func:`~psflow.train.duties.make_session` puts the summary hook first among the chief duties: a START it owes on
taking the duties over is at the restored checkpoint's step, which must precede the checkpoint saver's first save as
a new holder (its ``end()``'s final checkpoint). A session stops at the first ``end()`` that raises, so a summary
write failing there (a full or unwritable summary disk; the checkpoint directory may be elsewhere) would skip the
final checkpoint, which the saver, second then, wrote before the summary's ``end()`` when it came first. Guarantees:

* :class:`DeferredEnd` runs each call of the hook it wraps as that hook does, and raises what it raises, except
  ``end()``: its exception is kept (whatever ``end()`` does, e.g. a :class:`~psflow.train.recovery.LeaderOnlyHook`
  taking the duties over first).
* :class:`RaiseDeferred`, placed after the duty that must not be skipped, raises that kept exception in its own
  ``end()``: the session's hooks after it are skipped, as those after the saver were when it was raised in place;
  the run fails with it as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from psflow.train.hook_api import SessionRunHook, WrappingHook

if TYPE_CHECKING:
    from psflow.train.session import MonitoredTrainingSession

__all__ = ["DeferredEnd", "RaiseDeferred"]


class DeferredEnd(WrappingHook):
    """``inner`` as it is, but the exception its ``end()`` raises is kept for :class:`RaiseDeferred`."""

    def __init__(self, inner: SessionRunHook) -> None:
        super().__init__(inner)
        self.error: Exception | None = None

    def end(self, session: MonitoredTrainingSession) -> None:
        try:
            self.inner.end(session)
        except Exception as e:  # noqa: BLE001 - raised by RaiseDeferred, after the duty placed before it
            self.error = e


class RaiseDeferred(SessionRunHook):
    """Raises, in its ``end()``, the exception ``deferred``'s ``end()`` kept (none: nothing)."""

    def __init__(self, deferred: DeferredEnd) -> None:
        self.deferred = deferred

    def end(self, session: MonitoredTrainingSession) -> None:
        error, self.deferred.error = self.deferred.error, None
        if error is not None:
            raise error
