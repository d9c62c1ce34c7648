"""Chief duties whose ``end()`` errors are raised after each of them ran its ``end()`` (:class:`DeferredEnd`,
:class:`RaiseDeferred`).

A session stops at the first hook ``end()`` that raises. :func:`~psflow.train.duties.make_session` puts the
checkpoint saver first among the chief duties, then the summary hook, then the evaluation, each deferred: a summary
write failing at the end (the summary disk full or unwritable; the checkpoint directory may be elsewhere) must not
skip the final checkpoint, and a final checkpoint that fails (:class:`~psflow.checkpoint.save.FinalCheckpointError`,
which neither :class:`~psflow.train.leader_hooks.LeaderOnlyHook` nor the configured chief's guard catches) must not
skip the summary hook's ``end()`` (the final point, the flush, and the SessionLog START a worker first holding the
duties at its end owes a restore nobody led through: without it TensorBoard keeps the discarded model's points) nor
the final evaluation's (its metrics logged and written). The release of the run's lock, after them, ends whatever
raised (:attr:`~psflow.train.hook_api.SessionRunHook.ends_always`). Guarantees:

* :class:`DeferredEnd` runs each call of the hook it wraps as that hook does, and raises what it raises, except
  ``end()``: its exception is kept (whatever ``end()`` does, e.g. a ``LeaderOnlyHook`` taking the duties over first).
* :class:`RaiseDeferred`, placed after the duties it covers, raises in its own ``end()`` the first exception they
  kept, in their order (the saver's before the summary hook's, before the evaluation's); any other is logged as an
  error naming the hook. The session's hooks after it are skipped, as those after a duty raising in place were (but
  those that end always: the lock's release); the run fails with it as before.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from psflow.train.hook_api import SessionRunHook, WrappingHook, duty_of

if TYPE_CHECKING:
    from psflow.train.session import MonitoredTrainingSession

__all__ = ["DeferredEnd", "RaiseDeferred"]

log = logging.getLogger(__name__)


class DeferredEnd(WrappingHook):
    """``inner`` as it is, but the exception its ``end()`` raises is kept for :class:`RaiseDeferred`."""

    def __init__(self, inner: SessionRunHook) -> None:
        super().__init__(inner)
        self.error: Exception | None = None

    def end(self, session: MonitoredTrainingSession) -> None:
        try:
            self.inner.end(session)
        except Exception as e:  # noqa: BLE001 - raised by RaiseDeferred, after the duties placed before it
            self.error = e


class RaiseDeferred(SessionRunHook):
    """Raises, in its ``end()``, the first exception the ``deferred`` hooks' ``end()`` kept (none: nothing); logs
    the others."""

    def __init__(self, *deferred: DeferredEnd) -> None:
        self.deferred = deferred

    def end(self, session: MonitoredTrainingSession) -> None:
        errors = []
        for hook in self.deferred:
            if hook.error is not None:
                errors.append((hook, hook.error))
                hook.error = None
        for hook, error in errors[1:]:
            log.error("chief duty %s: its end() failed too: %s", duty_of(hook), error)
        if errors:
            raise errors[0][1]
