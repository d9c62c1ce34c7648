"""When a fault injected by ``--chaos`` recovered: ``recovery_seconds`` and ``recovered_at_step`` in metrics.json.

A fault has recovered once its task's replacement runs and the cluster trains again: global_step, read
from the step task (ps task 0) while it is *ready* (serving at its generation), goes past the first value
read that way after the replacement started. Ordered, for one fault:

1. the fault fires (:meth:`RecoveryWatch.fired`); nothing counts until the task's replacement runs;
2. the first ready reading after that is the fault's baseline;
3. the first ready reading past the baseline is its recovery (that step, the seconds since the fault).

A restarted member of a replicated ps shard (``--ps-replicas``) counts as running only once it is back in its
shard's view (the primary's, or a backup in it: :func:`primary_reading`). Its shard trains on as soon as a
backup is promoted, before the restarted process even serves; a next round that killed the new primary then
found it with no backup and every replica of the shard was lost (978 of 3,014 acknowledged pushes, with
``kill:ps:0@step=200`` and ``kill:ps:0@step=202``).

What does not count as training again:

* a restore's jump: a restarted ps task 0 answers 0 until the chief restores it, then (not yet ready) the
  restored value, past its journal's bound (up to 1,000 higher); a reading of a step task that is not
  ready is never a baseline, so the restored value is, and the first push after the restore recovers.
  (Counting the jump recovered a ps fault at the restore, before any step ran; the next chaos round then
  fired 40 steps after a recovery that had not happened yet.)

* pushes in flight when an (unreplicated) ps task other than the step task died: the step task stays ready
  at its generation while the cluster waits for the restore its empty replacement needs (for the dead chief's
  lease to lapse, ``--lease-ttl``, where the chief died too), and those pushes move global_step; while a ps
  fault is watched and the step task is still at the generation a ready reading said before it fired, no
  fault (that one, or the chief's or a worker's fired with it) takes a baseline: only a reading at another
  generation (the restore's) does. A ps fault fired while the step task was not ready (a resumed run's restore
  at start, at generation 0, which the fault makes start over at generation 0) is held to no generation.
  (A run killing ``ps:1`` and ``chief`` together said ``recovered at global_step 125, 1.72 s after the fault``
  for the ps task and ``at global_step 105, 2.28 s`` for the chief; the restore came 10 s after them, at
  global_step 125.) Such a fault left at the run's end says the cluster was not restored.

And what recovers without a step: a replacement with nothing left to train (a worker killed once its data
had ended, or in the run's last steps) moves no step; it has recovered when it ends its part cleanly
(exit 0), at the newest step read (its ``recovery_seconds`` then ends at the reading that saw the exit).
When the run ends, the launcher settles the faults with its final snapshot's reading
(:meth:`RecoveryWatch.settle`; with ``--ps-replicas`` the shard primaries' reading, views included), so a
recovery in the run's last moments is not missed between two polls of the chaos thread. A replicated shard
member's replacement back in its shard's view then has recovered, the shard having trained past the fault
(its promoted primary did, and it has its backup again), step or no step since. A fault left is not
recovered: ``recovered`` false in metrics.json, with ``why`` (e.g. ``/job:ps/task:0's replacement had not
rejoined its ps shard's view by the run's end``: the shard ended the run one backup short).

A ps task that holds nothing (:mod:`psflow.train.idle_tasks`: none of the model's variables) lost nothing when it
was killed: the chief makes its replacement ready at the generation the cluster trains in (*readmitted*), and no
restore comes. Its fault recovered once the replacement's own ``Stats`` says it is ready at the generation read
before the fault (:attr:`StepReading.ready_members`: the chaos thread asks each watched ps task's ``Stats`` once
a replacement runs, the run's end every ps task's), at that reading's global_step, with ``how`` ``readmitted, nothing
restored``; until then a restore is taken as owed, as for any ps task (no other fault recovers on the pushes in
flight). A killed task ready at another generation was restored, never readmitted.

Not thread-safe: the caller serializes (the chaos thread and the run's end take the launcher's lock).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from psflow.cluster.replicas import BACKUP_JOB, PS_JOB
from psflow.launch.chaos import InjectedFault
from psflow.rpc.api import FailedPreconditionError, RpcError
from psflow.rpc.grpc_client import TaskChannel
from psflow.status.replication import shard_primaries

#: A fault's ``how`` where an idle ps task's replacement was made ready at the cluster's generation.
READMITTED = "readmitted, nothing restored"

__all__ = ["READMITTED", "StepReading", "Replacement", "RecoveryWatch", "final_reading", "poll_reading", "primary_reading", "step_reading"]


@dataclass(frozen=True)
class StepReading:
    """global_step as the step task answered it, whether that task was ready (restored, serving), and
    how many workers it counted as finished with their data (``Leave``); ``in_view``: the ps shard members
    in their shard's view (each shard's primary and its backups; None: not a replicated cluster's reading);
    ``answered``: the ps members whose own ``Stats`` answered the poll that read it (:func:`poll_reading`; a
    refusal is an answer), each one's report that it serves, never another's; ``ready_members``: (task,
    generation) of each unreplicated ps task whose own ``Stats`` in that poll said it is ready at that
    generation (the tasks asked: see :func:`poll_reading`; every ps task at the run's end)."""

    step: int
    ready: bool
    finished: int = 0
    in_view: frozenset[str] | None = None
    generation: int | None = None  # the step task's restore generation (None: not said)
    answered: frozenset[str] = frozenset()
    ready_members: frozenset[tuple[str, int]] = frozenset()


class Replacement(Enum):
    """The state of a killed task's replacement process."""

    NONE = "none"          # not started yet (restart backoff), or it died too and its own is not started yet
    RUNNING = "running"
    WENT_ON = "went on"    # a shard member not restarted: its shard went on with the promoted backup
    FINISHED = "finished"  # exited 0: it did its part


def step_reading(stats: dict[str, Any]) -> StepReading | None:
    """The reading in one ps task's ``Stats`` meta; None if that task does not hold global_step."""
    step = stats.get("global_step")
    if isinstance(step, bool) or not isinstance(step, int):
        return None
    finished, generation = stats.get("finished"), stats.get("generation")
    return StepReading(step, stats.get("ready") is True, len(finished) if isinstance(finished, list) else 0,
                       generation=generation if isinstance(generation, int) and not isinstance(generation, bool)
                       else None)


def primary_reading(primaries: list[dict[str, Any]]) -> StepReading | None:
    """The reading of the shard primaries' ``Stats`` (:func:`~psflow.status.replication.shard_primaries`): the
    first holding global_step, with ``in_view`` every member their views name; None if none holds it."""
    in_view: set[str] = set()
    for stats in primaries:
        entry = stats.get("replication")
        if isinstance(entry, Mapping):
            backups = entry.get("backups")
            in_view.update(str(m) for m in [entry.get("primary"), *(backups if isinstance(backups, (list, tuple)) else [])]
                           if m is not None)
    for stats in primaries:
        reading = step_reading(stats)
        if reading is not None:
            return replace(reading, in_view=frozenset(in_view))
    return None


def poll_reading(channels: list[TaskChannel], *, replicated: bool = False,
                 also: frozenset[str] = frozenset()) -> StepReading | None:
    """global_step (and whether its task is ready) from the first ps task that answers holding it (None if
    none does). A channel whose call failed reconnects (:meth:`TaskChannel.reconnect`): a failed gRPC
    channel backs off its reconnects (up to its ``backoff_max``, 2 s), and the ps tasks are not listening
    yet when this starts, so the first calls fail; a backed-off channel would see the steps only long after
    they passed (training runs hundreds of steps a second).

    ``replicated``: ``channels`` are every shard member's; each is asked (in parallel) and the shard
    primaries' answers are read (:func:`~psflow.status.replication.shard_primaries`), never a backup's copy. A
    member without its shard's state (rebuilding, deposed) refuses: an answer, its channel kept (replaced at
    every poll, every few ms, a rebuilding member got a new connection each time).

    ``also`` (unreplicated): the ps tasks asked as well after the one holding global_step (those whose faults are
    watched: :meth:`RecoveryWatch.ps_tasks`), for ``ready_members``.

    The reading's ``answered``: the members whose own call answered (the tasks asked up to the one holding
    global_step, and ``also``; replicated, every member that answered or refused)."""
    if replicated:
        return _primaries_reading(channels)
    answered: set[str] = set()
    ready: set[tuple[str, int]] = set()
    found: StepReading | None = None
    for ch in channels:
        if found is not None and ch.task not in also:
            continue
        try:
            stats = dict(ch.call("Stats").meta)
        except RpcError:
            ch.reconnect()
            continue
        answered.add(ch.task)
        ready |= _ready_at(ch.task, stats)
        if found is None and (reading := step_reading(stats)) is not None:
            found = reading
            if not also:
                break
    if found is None:
        return None
    return replace(found, answered=frozenset(answered), ready_members=frozenset(ready))


def _ready_at(task: str, stats: Mapping[str, Any]) -> set[tuple[str, int]]:
    """``{(task, generation)}`` where ``stats`` (``task``'s own) says it is ready at that generation, else empty."""
    generation = stats.get("generation", 0)
    if stats.get("ready") is not True or isinstance(generation, bool) or not isinstance(generation, int):
        return set()
    return {(task, generation)}


def _primaries_reading(channels: list[TaskChannel]) -> StepReading | None:
    calls = [(ch, ch.call_async("Stats", {})) for ch in channels]
    answers, answered = [], set()
    for ch, call in calls:
        try:
            answers.append(dict(call.result().meta))
        except FailedPreconditionError:
            pass  # a member without its shard's state refused (rebuilding, deposed): it answered, its channel works
        except RpcError:
            ch.reconnect()
            continue
        answered.add(ch.task)
    reading = primary_reading(shard_primaries(answers))
    return replace(reading, answered=frozenset(answered)) if reading is not None else None


def final_reading(ps_stats: list[dict[str, Any]], *, replicated: bool) -> StepReading | None:
    """The reading of the run's final snapshot's ``Stats`` (``replicated``: the shard primaries', views included)."""
    if replicated:
        return primary_reading(shard_primaries(ps_stats))
    reading = next((r for r in map(step_reading, ps_stats) if r is not None), None)
    ready = {pair for stats in ps_stats if isinstance(task := stats.get("task"), str) for pair in _ready_at(task, stats)}
    return replace(reading, ready_members=frozenset(ready)) if reading is not None else None


def _rejoining(task: str, reading: StepReading) -> bool:
    """Whether ``task`` is a restarted ps shard member not back in its shard's view yet (module docstring)."""
    member = task.startswith((f"/job:{PS_JOB}/", f"/job:{BACKUP_JOB}/"))
    return member and reading.in_view is not None and task not in reading.in_view


@dataclass
class _Watched:
    fault: InjectedFault
    fired: float             # time.monotonic() when it fired
    baseline: int | None = None
    back: float | None = None  # time.monotonic() of the baseline's reading: its replacement seen back
    generation: int | None = None  # the step task's generation a ready reading said as it fired (None: none read)


class RecoveryWatch:
    """The faults fired and not recovered yet; see the module docstring."""

    def __init__(self, replacement: Callable[[str, int], Replacement]) -> None:
        """``replacement(task, killed_pid)``: the state of the newest process of ``task`` other than the killed one."""
        self._replacement = replacement
        self._watched: list[_Watched] = []
        self._last_step: int | None = None
        self._generation: int | None = None  # the step task's, as a ready reading said last

    def fired(self, fault: InjectedFault, now: float, reading: StepReading | None = None) -> None:
        """Starts watching ``fault``, fired at ``now`` (``time.monotonic()``) on ``reading`` (the chaos thread's
        fresh one, taken with the trainers held: it may be the first it got, none observed before): its step
        task's generation, else (no reading) the one a ready reading said last, is the one a ps fault's restore moves
        on from. A reading of a step task that is not ready gives none (the old rule: the first ready reading after
        the replacement runs is the baseline): the cluster is being initialized or restored then, and the fault may
        make it start that over at the same generation (a restore at start is at generation 0 every time), never
        at a new one."""
        generation = self._generation if reading is None else reading.generation if reading.ready else None
        self._watched.append(_Watched(fault, now, generation=generation))

    def watching(self) -> int:
        """Faults fired and not recovered yet."""
        return len(self._watched)

    def ps_tasks(self) -> frozenset[str]:
        """The ps tasks of the faults watched whose replacement runs (the chaos thread asks their ``Stats`` too: a
        readmission). Not before: only a replacement is readmitted, and a ``stop`` fault's process, stopped until hang
        detection kills it (never with ``--liveness-timeout 0``), would hold every poll for the call's timeout."""
        return frozenset(w.fault.task for w in self._watched if w.fault.task.startswith(f"/job:{PS_JOB}/")
                         and self._replacement(w.fault.task, w.fault.pid) is Replacement.RUNNING)

    def observe(self, reading: StepReading | None, now: float) -> list[InjectedFault]:
        """One reading of the chaos thread (None: no ps task answered); returns the faults it recovered,
        each with ``recovered_at_step`` and ``recovery_seconds`` set."""
        if reading is not None:
            self._last_step = reading.step if self._last_step is None else max(self._last_step, reading.step)
            if reading.ready and reading.generation is not None:
                self._generation = reading.generation
        recovered = []
        owing = self._owing(reading)
        for watched in list(self._watched):
            state = self._replacement(watched.fault.task, watched.fault.pid)
            if state is Replacement.FINISHED and self._last_step is not None:
                self._recover(watched, self._last_step, now)
            elif state not in (Replacement.RUNNING, Replacement.WENT_ON) or reading is None or not reading.ready:
                continue
            elif state is Replacement.RUNNING and _rejoining(watched.fault.task, reading):
                continue
            elif state is Replacement.RUNNING and _readmitted(watched, reading):
                watched.fault.how = READMITTED
                self._recover(watched, reading.step, now)
            elif owing is not None:  # any fault's: the cluster trains again only after that restore
                continue
            elif watched.baseline is None:
                watched.baseline, watched.back = reading.step, now
                continue
            elif reading.step > watched.baseline:
                self._recover(watched, reading.step, now)
            else:
                continue
            recovered.append(watched.fault)
        return recovered

    def settle(self, reading: StepReading | None, now: float) -> list[InjectedFault]:
        """(The run's end) :meth:`observe` once more with the final snapshot's reading, then settles each fault
        left: a replicated shard member's replacement back in its shard's view, the shard having trained past
        the fault, has recovered at the final step (as of the reading that first saw it back, else ``now``);
        every other fault left is not recovered, and gets ``why``. Returns the faults it recovered."""
        recovered = self.observe(reading, now)
        for watched in list(self._watched):
            fault = watched.fault
            state = self._replacement(fault.task, fault.pid)
            if reading is not None and _back_in_view(fault, state, reading):
                self._recover(watched, reading.step, watched.back if watched.back is not None else now)
                recovered.append(fault)
            else:
                fault.why = self._why_left(fault, state, reading)
        return recovered

    def _why_left(self, fault: InjectedFault, state: Replacement, reading: StepReading | None) -> str:
        """Why ``fault`` had not recovered by the run's end: :func:`_why`, unless a restore is still owed."""
        owing = self._owing(reading)
        if owing is None or reading is None or state is Replacement.NONE:
            return _why(fault, state, reading)
        at = f"(the step task still at generation {reading.generation}, global_step {reading.step})"
        owed = owing.fault.task
        if self._replacement(owed, owing.fault.pid) is Replacement.NONE:
            return f"the cluster was not restored: {owed} was not running again by the run's end {at}"
        return f"the cluster was not restored after {owed}'s replacement started {at}"

    def _owing(self, reading: StepReading | None) -> _Watched | None:
        """The first fault watched whose restore ``reading`` shows still owed (:func:`_restore_owed`), or None."""
        return next((w for w in self._watched if reading is not None and _restore_owed(w, reading)), None)

    def _recover(self, watched: _Watched, step: int, now: float) -> None:
        watched.fault.recovered_at_step = step
        watched.fault.recovery_seconds = round(now - watched.fired, 3)
        self._watched.remove(watched)


def _restore_owed(watched: _Watched, reading: StepReading) -> bool:
    """Whether ``watched`` killed an unreplicated ps task and the step task is still at the generation read before
    the fault: its replacement came back empty, so the cluster trains again only after a restore (a new
    generation); until then global_step moves only by pushes that were in flight (known where generations are
    read), unless the task was readmitted (:func:`_readmitted`: it held nothing, and no restore comes)."""
    ps = watched.fault.task.startswith(f"/job:{PS_JOB}/") and reading.in_view is None
    held = ps and watched.generation is not None and reading.generation == watched.generation
    return held and not _readmitted(watched, reading)


def _readmitted(watched: _Watched, reading: StepReading) -> bool:
    """Whether ``watched`` killed an unreplicated ps task now ready (its own ``Stats``) at the generation the step
    task was at before the fault and still is: an idle task made ready again without a restore (module docstring).
    The caller checks that the replacement runs (a reading of the killed process never says ready here: it was
    ready at that generation, but it is dead before any reading the fault is observed with)."""
    ps = watched.fault.task.startswith(f"/job:{PS_JOB}/") and reading.in_view is None
    at = watched.generation
    return (ps and at is not None and reading.ready and reading.generation == at
            and (watched.fault.task, at) in reading.ready_members)


def _back_in_view(fault: InjectedFault, state: Replacement, reading: StepReading) -> bool:
    """Whether ``fault``'s task is a replicated shard member whose replacement is in its shard's view, the
    shard (its promoted primary) having trained past the fault: its shard has its backup again."""
    member = reading.in_view is not None and fault.task in reading.in_view
    return state is Replacement.RUNNING and member and reading.ready and reading.step > fault.at_step


def _why(fault: InjectedFault, state: Replacement, reading: StepReading | None) -> str:
    """Why ``fault`` had not recovered by the run's end, in one line."""
    task = fault.task
    if state is Replacement.NONE:
        return f"{task} was not running again by the run's end"
    if reading is None:
        return "no ps task answered global_step at the run's end"
    if state is Replacement.RUNNING and _rejoining(task, reading):
        return (f"{task}'s replacement had not rejoined its ps shard's view by the run's end: the shard ran "
                "without it as a backup")
    if not reading.ready:
        return f"the step task was not ready at the run's end (global_step {reading.step})"
    return f"global_step did not advance past {reading.step} after {task}'s replacement started"
