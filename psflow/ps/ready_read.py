"""Reads that require a ready model: an evaluation's ``Pull`` (``require_ready``) on a ps task being restored.

A ps task restarted empty holds fresh initial values until the restore's loads come; one between a ``BeginRestore``
and its ``SetReady`` holds some partitions loaded and some not. Training is kept off such a task by its pushes'
generation (:mod:`psflow.ps.restore_gate`); a read is not a push, so an evaluation read such a task and reported
its metrics (AUC, loss) as the run's. A ``Pull`` that says ``require_ready`` is let in only while the task is
ready, and its reply only where the task is still ready at the same generation once the values were read
(:func:`ready_read`); else it is refused with FAILED_PRECONDITION (:class:`NotReadyToRead`) naming the task, its
state and generation: retryable (once the restore is over, the read is of the restored model). A pull without it
(a worker's training lookup, an older client's) is not checked and costs nothing more.

Across tasks, the reader compares every task's readiness and generation (``Stats``) before and after its reads
(:mod:`psflow.train.ready_eval`): a restore that began and ended between two of its pulls is caught there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from psflow.ps.restore_gate import RestoreGate
from psflow.rpc.api import PreconditionFailed

__all__ = ["NotReadyToRead", "ready_read"]


class NotReadyToRead(PreconditionFailed):
    """A read that requires a ready model came to a ps task that is not ready, or was restored during the read
    (FAILED_PRECONDITION; the reader retries once the task is restored)."""


def _state(gate: RestoreGate) -> tuple[bool, int, bool]:
    """(ready, generation, restoring), read together."""
    state = gate.replica_state()
    generation = state["generation"]
    return state["ready"] is True, generation if isinstance(generation, int) else 0, state["restoring"] is True


@contextmanager
def ready_read(gate: RestoreGate, required: bool) -> Iterator[None]:
    """Around a pull's read: where ``required``, refuses it unless the task is ready (before) and still ready at
    the same generation (after; the values read are dropped).

    Raises:
        NotReadyToRead: names the task, what it is doing and its generation.
    """
    if not required:
        yield
        return
    ready, generation, restoring = _state(gate)
    if not ready:
        doing = "being restored" if restoring else "restarted or initializing, awaiting its restore"
        raise NotReadyToRead(f"a read of the ready model refused: {gate.task_name} is not ready ({doing}, "
                             f"generation {generation}); retry once it is restored")
    yield
    ready_after, generation_after, _ = _state(gate)
    if not ready_after or generation_after != generation:
        raise NotReadyToRead(f"a read of the ready model refused: {gate.task_name} was restored while it was read "
                             f"(generation {generation} -> {generation_after}, "
                             f"{'ready' if ready_after else 'not ready'}); retry")
