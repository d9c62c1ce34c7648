"""What a save asks the ps tasks around its pointer switch: whether the model its shards hold may become current.

Two checks, asked of the ps tasks once the save's manifest is written (steps 4-6 of :mod:`psflow.checkpoint`); a task
holding nothing wrote no shard (:mod:`psflow.checkpoint.shard_files`), and only its fence's refusal counts:

* :func:`check_fence` -- every task still accepts the saving chief's lease epoch, before the switch and again after
  it (a newer chief elected meanwhile fences the save off: :class:`~psflow.checkpoint.switch.CheckpointFencedError`).
* :func:`check_no_restore_since` -- no restore within the run reached a task since its shard was taken, and no task
  ready then restarted since: asked under the directory's mutex, just before the pointer is written
  (:func:`~psflow.checkpoint.switch.switch_pointer`'s ``before_publish``). A save given up at ``--save-timeout``
  (:mod:`psflow.checkpoint.bounded_save`) goes on in its thread; where every one of its shards was taken before a
  restore (one generation, all ready: :func:`~psflow.checkpoint.save_manifest.build_manifest` passes) and its
  thread publishes after it, its checkpoint holds the model the restore discarded, newer than the restored one,
  while the cluster trains on from the restored one: a later restore (another ps death) would load the discarded
  model. Such a save fails instead (its directory removed, counted once: a given-up save was counted already).

And one the saving process asks itself, under the same mutex, just before: :class:`PublishGate` -- its manager's
publishing is still open. A process that exits while a save given up at ``--save-timeout`` still runs closes it
before it releases the run's lock (:mod:`psflow.train.lock_at_end`): the save's thread, a daemon, lives on until the
interpreter's end, and another run may hold the directory by then; its model would be replaced by this late save.

Guarantees: a save that passed :func:`check_no_restore_since` published before any restore whose ``BeginRestore``
reached a task after the check; the check and the pointer's write are one step under the directory's mutex. A
restorer reads the pointer before it sends its ``BeginRestore`` (:func:`psflow.train.generation_restore.
restore_at_new_generation`'s caller); a save checked in between is refused all the same where a ps task died: that
task is unreachable, or restarted and not ready (nothing makes it ready before the restore's ``SetReady``). A save
not past :meth:`PublishGate.check` when the run's lock was released after :meth:`PublishGate.close` (the release
takes the same mutex) never publishes: one that passed it published while this run held the directory.
Not covered: a restore that no ps task's death started (a restarted chief's join that finds the run past
its checkpoint, :func:`psflow.train.chief.join_cluster`) with a save of another live chief checked in that window; with
a lease that chief's switch is fenced off (the restorer took the pointer over at its newer epoch:
:func:`~psflow.checkpoint.adopt.adopt_latest`), without one there is no other chief.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from psflow.checkpoint.switch import CheckpointFencedError
from psflow.errors import CheckpointError
from psflow.ps.client import ParameterClient
from psflow.ps.idle import idle_tasks
from psflow.ps.protocol import FenceRequest, SaveShardReply, StatsReply
from psflow.rpc.api import DeadlineExceededError, FailedPreconditionError, FencedOffError, RpcError, TaskUnavailableError

__all__ = ["IDLE_FENCE_TIMEOUT", "STATS_TIMEOUT", "PublishGate", "UnaskedTasksError", "await_routes", "check_fence",
           "check_no_restore_since"]

#: Seconds :func:`check_no_restore_since` waits for a ps task's ``Stats`` (a round of calls, all tasks at once). It
#: runs under the directory's mutex: twice this plus a failover's status round stays well within the mutex's
#: :data:`~psflow.checkpoint.lock.MUTEX_TIMEOUT` (30 s), past which a waiter with a lease epoch goes on without it
#: and an object store's lock held from another host is taken over as stale. A task silent that long (stopped, its
#: host gone) fails the save as an unreachable one: the saver hook waits for its next period.
STATS_TIMEOUT = 5.0


#: Seconds :func:`check_fence` waits for a ps task holding nothing (:func:`~psflow.ps.idle.idle_tasks`), twice a save:
#: a stopped one's silence delays each save that long (then it is not waited for; a dead one refuses at once).
IDLE_FENCE_TIMEOUT = 1.0


class UnaskedTasksError(CheckpointError):
    """:func:`check_no_restore_since` could not ask some ps tasks (``errors``: task -> its call's error): nothing
    was learned of a restore there, so the save was not made current. A dead task is one a restore is coming for;
    a replicated shard's primary may instead have gone silent just then, its state alive on a backup promoted
    moments later (:func:`await_routes`)."""

    def __init__(self, message: str, errors: Mapping[int, RpcError]) -> None:
        super().__init__(message)
        self.errors = dict(errors)


class PublishGate:
    """Whether a manager's saves may still make a checkpoint current: open until :meth:`close`. Thread-safe (closed
    on the exiting thread, read on a save's)."""

    def __init__(self) -> None:
        self._closed: str | None = None

    def close(self, why: str) -> None:
        """No save checked after this makes its checkpoint current (``why``: said in the refusal). Blocks for
        nothing (an exit function: no thread, no mutex). Call it before the run's lock is released: the release
        takes the directory's mutex, under which :meth:`check` is asked, so a save not checked before the release
        is refused after it."""
        self._closed = why

    def check(self, path: str, refused: str = "not made current") -> None:
        """Raises :class:`~psflow.errors.CheckpointError` (names ``path``, ``refused`` and why) once :meth:`close`
        was called. Also asked as a save takes the run's lock (:meth:`~psflow.checkpoint.lock.DirectoryLock.
        acquire`'s ``check``, under the same mutex): a save not begun when the lock was released at exit never
        takes it again (its lock file would name the process gone a moment later)."""
        if self._closed is not None:
            raise CheckpointError(f"checkpoint {path} {refused}: {self._closed}")

    def guard(self, path: str, then: Callable[[], None]) -> Callable[[], None]:
        """A save's ``before_publish`` for checkpoint ``path`` (asked under the directory's mutex): :meth:`check`,
        then ``then`` (:func:`check_no_restore_since`). What either raises refuses the switch."""

        def before_publish() -> None:
            self.check(path)
            then()

        return before_publish


def check_fence(client: ParameterClient, fence: tuple[int, str] | None, path: str, *, current: bool = False) -> None:
    """Every ps task still accepts the lease ``fence`` (epoch, holder) of the saving chief (None: unfenced, nothing
    asked), before and, ``current``, after the pointer named ``path``. Blocks for one ``Fence`` call per task, in
    parallel. A task holding nothing (:func:`~psflow.ps.idle.idle_tasks`: it wrote no shard) is waited for at most
    :data:`IDLE_FENCE_TIMEOUT` s, and only its fence's refusal counts: it may be down or restarting, having lost nothing
    (a newer chief fences every task at once, those holding the model among them: they refuse the save too).

    Raises:
        CheckpointFencedError: a ps task's fence refused the epoch (ABORTED, one is enough: it holds a newer
            chief's epoch, so this chief is deposed, whatever the other tasks said); that refusal is the cause.
        CheckpointError: no fence refused the epoch, but a task refused it otherwise (a replicated shard's
            deposed member) or could not be asked; the cause is a task that could not be reached, if one could
            not (the saver hook then waits for the next period), else the first error. The message says
            whether ``path`` was made current (``current``: it was, and stays so).
    """
    if fence is None:
        return
    epoch, holder = fence
    idle = idle_tasks(client)  # (no shard of theirs in the save: only their fence's refusal counts)
    calls = {t: client.call_async(t, FenceRequest(epoch, holder=holder), timeout=IDLE_FENCE_TIMEOUT if t in idle else None)
             for t in client.channels}
    refusals: list[str] = []
    errors: list[RpcError] = []
    for t, call in calls.items():  # every call collected, even after a refusal
        try:
            call.result()
        except RpcError as e:
            if t in idle and not isinstance(e, FencedOffError):  # down, or restarted and refusing: it holds nothing
                continue
            what = "refused" if isinstance(e, FailedPreconditionError) else "could not be asked"
            refusals.append(f"/job:ps/task:{t} {what}: {e}")
            errors.append(e)
    if not errors:
        return
    # only the fence's own refusal (ABORTED): a replicated shard's deposed member refuses too (FAILED_PRECONDITION,
    # naming its new primary), and no newer chief fenced this one off then
    fenced = [e for e in errors if isinstance(e, FencedOffError)]
    if fenced:
        raise CheckpointFencedError(f"checkpoint {path} not made current: {'; '.join(refusals)}") from fenced[0]
    unreachable = [e for e in errors if isinstance(e, (TaskUnavailableError, DeadlineExceededError))]
    outcome = (f"checkpoint {path} is current (complete; kept), but this chief's fence could not be re-checked "
               "after the switch" if current else f"checkpoint {path} not made current")
    raise CheckpointError(f"{outcome}: {'; '.join(refusals)}") from (unreachable or errors)[0]


def _moved(reply: SaveShardReply, now: StatsReply) -> tuple[str, str] | None:
    """How a task moved since its shard was taken: ("restored", what) where its generation differs, ("restarted",
    what) where it was ready and is not, at the same generation; None: it did not (a reply naming no generation or
    readiness, an older task's, is not compared on it)."""
    state = "" if now.ready else "not ready "
    if reply.generation is not None and now.generation != reply.generation:
        return "restored", f"{reply.task} {state}at generation {now.generation}, was {reply.generation}"
    if reply.ready and not now.ready:
        return "restarted", f"{reply.task} not ready at generation {now.generation}, was ready"
    return None


def check_no_restore_since(client: ParameterClient, replies: Mapping[int, tuple[str, SaveShardReply]],
                           path: str) -> None:
    """No ps task was restored (its generation moved) nor restarted (ready when its shard was taken, not now) since
    the save's shards were taken (``replies``: task -> its file name and :class:`SaveShardReply`); see the module
    doc. A task made ready since at the same generation (the chief's initial save, given up, then its ``SetReady``)
    is no restore. Logs nothing: the save that fails logs the error (counted, or a late failure of one given up:
    :class:`~psflow.checkpoint.save.CheckpointManager`).

    Blocks for at most ``2 * STATS_TIMEOUT`` s and a failover's status round, never the mutex's
    :data:`~psflow.checkpoint.lock.MUTEX_TIMEOUT` (asked under it: a waiter goes past a holder that long, or takes an
    object store's lock over): every task's ``Stats`` asked at once with a deadline of :data:`STATS_TIMEOUT` s, not
    ``--rpc-timeout`` one after another; a replicated shard whose primary did not answer, or refused (deposed,
    rebuilding), is followed to its primary now (one round of its members' statuses, a backup promoted where the
    primary is provably gone: :meth:`~psflow.ps.failover.ShardRouter.reroute`) and asked once more, those at once
    too.

    Raises:
        CheckpointError: a task was restored or restarted since (names each, its generation now and then).
        UnaskedTasksError: a task could not be asked (names it: a dead task is one a restore is coming for; one
            silent past the deadline is taken as one, the cause a ``DeadlineExceededError``, so the saver hook
            waits for its next period; the final save, which has none, waits for the shard's failover instead
            where it is replicated, :func:`await_routes`, and saves again).
    """
    states, errors = _stats(client, sorted(replies))
    router = getattr(client, "router", None)
    if errors and router is not None:
        again, errors = _stats(client, sorted(router.reroute(errors)), errors)
        states.update(again)
    if errors:
        task, error = min(errors.items())
        raise UnaskedTasksError(f"checkpoint {path} not made current: {replies[task][1].task} could not be asked "
                                f"whether it was restored since the save's shards were taken: {error}", errors) from error
    moved = [found for task, (_, reply) in sorted(replies.items()) if (found := _moved(reply, states[task])) is not None]
    if not moved:
        return
    how = "restored" if any(why == "restored" for why, _ in moved) else "restarted"
    discarded = ("it holds the model the restore discarded" if how == "restored" else
                 "a restore is coming for them, which may have read the pointer already")
    raise CheckpointError(f"checkpoint {path} not made current: ps tasks were {how} since its shards were taken "
                          f"({'; '.join(what for _, what in moved)}): {discarded}; its directory is removed (the "
                          "checkpoints already saved are kept, and the next save takes the restored state)")


def await_routes(client: ParameterClient, error: UnaskedTasksError, timeout: float) -> bool:
    """Waits, at most ``timeout`` s, until each replicated shard :func:`check_no_restore_since` could not ask
    (``error``) routes to a member serving it: its failover done (a backup promoted once the primary is provably
    gone, :meth:`~psflow.ps.failover.ShardRouter.resolve`) or its primary answering again. Returns True then: a
    save made now asks the shard's state where it lives. Returns False at once where the cluster is not
    replicated (no router: an unreachable ps task is gone with its shard's state, a restore is coming for it) or
    no time is left. Makes no save current itself: a save made after it passes its own checks or fails.

    Raises:
        TaskUnavailableError: a shard had no member able to serve it within ``timeout`` (names the shard and
            what each member said).
    """
    router = getattr(client, "router", None)
    if router is None or timeout <= 0:
        return False
    deadline = time.monotonic() + timeout
    for shard, cause in sorted(error.errors.items()):
        router.resolve(shard, cause, timeout=max(0.0, deadline - time.monotonic()))
    return True


def _stats(client: ParameterClient, tasks: list[int], errors: Mapping[int, RpcError] | None = None,
           ) -> tuple[dict[int, StatsReply], dict[int, RpcError]]:
    """``Stats`` of each of ``tasks``, asked at once on the channel its calls go to now (a replicated shard's
    primary), each within :data:`STATS_TIMEOUT` s: (replies, errors), the errors of ``errors`` not asked again
    kept."""
    calls = {t: client.channels[t].call_async("Stats", timeout=STATS_TIMEOUT) for t in tasks}
    states: dict[int, StatsReply] = {}
    failed = {t: e for t, e in (errors or {}).items() if t not in calls}
    for t, call in calls.items():
        try:
            states[t] = StatsReply.from_frame(call.result())
        except RpcError as e:
            failed[t] = e
    return states, failed
