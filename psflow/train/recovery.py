"""Recovery of a training cluster: an elected chief, and restores after a ps task died.

Chief election (:class:`Leadership`): every worker that trains campaigns, on
a background thread, for the ``chief`` lease of a coordination backend
(:mod:`psflow.coord`: ``embedded`` on ps task 0, or ``zookeeper``). The
holder runs the chief duties (:class:`~psflow.train.leader_hooks.LeaderOnlyHook` wraps the checkpoint,
summary and eval hooks), so when it dies or stops, another worker takes them
over within the lease time while training goes on. Its checkpoint writes
carry its lease epoch, which the ps tasks fence: a deposed chief's save is
refused (:meth:`psflow.checkpoint.save.CheckpointManager.save`).

Only a worker that trains takes the lease: the duties run between its steps
(the hooks), so a holder that runs no step would do none of them, and the
checkpoints would stop until the run ends. So a worker campaigns from its
first step on (:class:`~psflow.train.leader_hooks.CampaignWhileTrainingHook`; again after a restore
rewinds it), or from the moment it waits for a restore before its first step (a chief restarted beside a
ps task that came back empty: nobody else may be left to take the lease and restore), stops campaigning the moment its data ends
(:meth:`Leadership.stop_campaigning`) and hands a lease it holds to a worker
that still trains (it resigns as soon as it sees one), taking it back only once none is left
(:mod:`psflow.train.take_over`). The last worker to finish keeps the lease, or waits until it can take it
(a dead holder's lease lapses within the lease time), and writes the final checkpoint.

With replicated ps shards (``--ps-replicas``) none of this runs when a shard's
primary dies: the worker's client promotes a backup and resends to it
(:mod:`psflow.ps.failover`), and no error reaches the worker; the chief keeps its lease,
replicated with shard 0 (:mod:`psflow.ps.replication.leases`). Only a shard that
lost every replica at once comes back empty, and is restored as below (logged:
its acknowledged pushes since the checkpoint are the run's ``updates_lost``).

A ps task that died is restarted empty by the supervisor. Then, in order:

1. every worker's next push fails (the task is unreachable, or not ready, or
   the push names an old *generation*); :meth:`ClusterRecovery.needed` asks
   every ps task's ``Stats`` whether the cluster is being restored, else the
   error is re-raised (it was something else);
2. the workers wait, with bounded backoff, until every ps task is ready at
   one generation (:meth:`ClusterRecovery.wait`, at most ``timeout``);
3. meanwhile the chief (the lease holder) restores EVERY ps task from the
   newest checkpoint (:meth:`ClusterRecovery.restore`, through
   :func:`psflow.train.generation_restore.restore_at_new_generation`, as a
   restarted chief's join within the run does): registers the layout
   (creating the restarted task's variables), sends ``BeginRestore`` with a
   new generation (pushes of the old one are refused from then on, and the
   ones in flight finish first), loads variables, slots, reader positions and
   the example count, sets global_step, then marks every task ready at the
   new generation (ps task 0 last). With no checkpoint to restore from, the
   chief raises :class:`~psflow.train.state_loss.StateLostError` instead (one
   line naming the empty tasks), and so does every worker at once when the
   run has no checkpoint directory: never a model of fresh and trained
   variables (:mod:`psflow.train.state_loss`);
4. each worker re-reads its reader position (the checkpoint's) and re-opens
   its data there: the records since the checkpoint are trained again, none
   twice relative to the model state, none skipped. This includes workers
   that had already finished their data: in asynchronous mode a finished
   worker does not exit but resigns the chief lease and waits for the others
   (:meth:`ClusterRecovery.linger`), so a later restore can rewind it too. A ps task lost once every worker
   finished and the others' sessions ended (the holder's final checkpoint written, its ``Done`` sent: nobody is
   left to restore it) ends the lingering worker's wait instead: it leaves, its data done (logged).

A ps task that held nothing (:func:`~psflow.ps.idle.idle_tasks`: by the placement, not the task holding
global_step, no partition of any variable; none in a sync, replicated or dynamic-table run) lost nothing when it
died, and no task is restored for it: the lease holder registers the layout there (creating nothing) and makes it
ready at the generation every other task is at (:func:`psflow.train.idle_tasks.readmit`), from :meth:`ClusterRecovery.wait`
(a call to it failed: a worker's ``Leave``) or from its :class:`~psflow.train.idle_tasks.ReadmitIdleTasks` hook
(no training call goes to it, nor a save: :mod:`psflow.checkpoint.shard_files`). The workers waiting resume at their own reader
positions: nothing trained twice, none skipped, global_step and every other task's generation unchanged.

global_step never goes back: after a restore it continues from the value
surviving ps task 0 held; if ps task 0 itself died, from the bound its
journal recorded (``--state-dir``, :class:`psflow.ps.global_step.StepJournal`:
at most one block of step values is skipped), or, without a journal, from the
checkpoint's (then values handed out since that checkpoint are handed out
again). So every logged ``step=`` value stays unique; redone work takes new
step numbers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from psflow.checkpoint.adopt import checkpoint_to_restore
from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.coord.api import Lease
from psflow.errors import CheckpointError, TrainingError
from psflow.optim import OptimizerSpec
from psflow.ps.client import ParameterClient
from psflow.ps.idle import idle_tasks
from psflow.ps.protocol import StatsReply
from psflow.rpc.api import RpcError
from psflow.train.generation_restore import restore_at_new_generation
from psflow.train.idle_tasks import idle_down, readmit, tasks_named
from psflow.train.leader_hooks import CampaignWhileTrainingHook, LeaderOnlyHook
from psflow.train.leadership import Leadership
from psflow.train.state_loss import StateLostError, lost_tasks, ps_states, state_lost_message

__all__ = ["Leadership", "LeaderOnlyHook", "CampaignWhileTrainingHook", "ClusterRecovery", "RecoveryError"]

log = logging.getLogger("psflow.recovery")

#: Seconds between two lines of a restore that keeps failing (:meth:`ClusterRecovery.wait` retries it at every
#: poll, up to 4 a second, for as long as its timeout): the first failure is logged, then how many since, at most
#: this often.
RESTORE_RETRY_LOG_EVERY = 30.0


class _RetryLog:
    """The lines of one wait's failed restores: the first, then at most one per :data:`RESTORE_RETRY_LOG_EVERY` s
    counting the failures since the line before, and those no line counted yet when the wait ends (restored after
    all, back at the worker's own generation, or given up)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.failures = 0
        self._told, self._told_at = 0, 0.0
        self._last: Exception | None = None

    def failed(self, error: Exception) -> None:
        self.failures, self._last = self.failures + 1, error
        if self.failures == 1:
            log.error("%s: restore failed: %s; retrying", self.name, error)
            self._told, self._told_at = 1, time.monotonic()
        elif time.monotonic() - self._told_at >= RESTORE_RETRY_LOG_EVERY:
            self._since("; retrying")

    def ended(self) -> None:
        if self.failures > self._told:
            self._since("")

    def _since(self, then: str) -> None:
        more, now = self.failures - self._told, time.monotonic()
        log.error("%s: restore failed %d more time%s in %.0f s (%d in all; the last: %s)%s", self.name, more,
                  "" if more == 1 else "s", now - self._told_at, self.failures, self._last, then)
        self._told, self._told_at = self.failures, now


def _step_of(states: dict[int, StatsReply | None], step_task: int) -> int | None:
    """global_step as the task holding it said in ``states`` (None: it did not)."""
    state = states.get(step_task)
    return state.global_step if state is not None else None


class RecoveryError(TrainingError, RuntimeError):
    """The cluster was not restored in time; names the tasks not ready (no checkpoint at all:
    :class:`~psflow.train.state_loss.StateLostError`)."""


class ClusterRecovery:
    """What one worker does when the data path fails; see the module docstring."""

    def __init__(self, client: ParameterClient, optimizer: OptimizerSpec, *, checkpoint_dir: str | None,
                 leader: Callable[[], Lease | None], timeout: float, generation: int | None = 0,
                 run: str | None = None, on_restored: Callable[[str | None, int | None], None] | None = None) -> None:
        """Args:
            client: this worker's client.
            optimizer: the model's optimizer (registered on a restarted ps task).
            checkpoint_dir: where the newest checkpoint is.
            leader: this worker's lease if it is the chief now, else None.
            timeout: seconds a worker waits for the cluster to be restored.
            generation: the restore generation the cluster is at now; None: a restore is pending (a restarted
                chief's join left it to the lease holder), and the first generation it settles at counts as one.
            run: this run's id (:func:`psflow.train.duties.run_id`): a restore takes replicated shards'
                ``pushes_applied`` only from a checkpoint this run wrote (None: from any checkpoint).
            on_restored: called once the cluster settled at a new generation (by :meth:`wait`, before it returns,
                so before this worker's next step), with the checkpoint and global_step the cluster was set back to
                (:meth:`MonitoredTrainingSession.restored <psflow.train.session.MonitoredTrainingSession.restored>`:
                the chief's summaries write a SessionLog START there).
        """
        #: The restore generation this worker trains in (its pushes carry it); a restore moves it on.
        self.generation: int | None = generation
        self.client = client
        self.optimizer = optimizer
        self.checkpoint_dir = checkpoint_dir
        self.run = run
        self.leader = leader
        self.timeout = timeout
        self.restores = 0
        self.on_restored = on_restored
        self._restored: tuple[str, int] | None = None  # (checkpoint, its step): this worker's restore, not reported yet

    def _states(self) -> dict[int, StatsReply | None]:
        return ps_states(self.client)

    def _settled(self, states: dict[int, StatsReply | None]) -> int | None:
        """The generation every ps task is ready at, or None."""
        gens = {s.generation for s in states.values() if s is not None and s.ready}
        if len(gens) != 1 or any(s is None or not s.ready for s in states.values()):
            return None
        return gens.pop()

    def needed(self, *, since: float | None = None) -> bool:
        """After a data-path error: is (or was) the cluster being restored? ``since``: when the failed call began;
        an idle task restarted since (and maybe readmitted already: :meth:`wait`) says yes too."""
        states = self._states()
        settled = self._settled(states)
        return (self.generation is None or settled != self.generation
                or bool(self._restarted_since(states, since, time.monotonic())))

    def wait(self, *, since: float | None = None) -> tuple[bool, str | None]:
        """Blocks until every ps task is ready at one generation (restoring it if this worker is chief).

        ``since``: when (``time.monotonic()``) the failed call began. Where the cluster is settled at this worker's
        generation at the first poll already, an idle task whose ``Stats`` say its process started after that
        (:meth:`_restarted_since`: a worker's ``Leave`` failed on it, and it was restarted and readmitted before
        this poll) was readmitted, not a failure of the caller's own: ``(True, position)`` as below.

        Returns:
            ``(restored, position)``: whether the cluster was restored (a new
            generation; else every task came back with its state, and the
            caller should treat the original error as its own failure), and
            this worker's reader position (JSON) to resume from, or None
            (the start of its data).

        Raises:
            StateLostError: a ps task lost its variables and there is no checkpoint to restore them
                from (raised by the chief; by every worker at once when the run has no checkpoint directory).
            RecoveryError: not restored within ``timeout``.
        """
        started = time.monotonic()
        deadline, wait = started + self.timeout, 0.05
        failures = _RetryLog(self.client.client_name)
        readmitting: set[int] = set()  # idle tasks (psflow.train.idle_tasks) seen not ready in this wait
        while True:
            states = self._states()
            answered = time.monotonic()
            generation = self._settled(states)
            if generation is not None and generation == self.generation:
                failures.ended()  # (every task came back with its state: no restore was needed after all)
                readmitting |= self._restarted_since(states, since, answered)
                return self._resumed_in_place(readmitting, started) if readmitting else (False, None)
            if generation is not None:
                break
            if idle := idle_down(self.client, states, self.generation):  # lost nothing: made ready, nothing restored
                readmitting |= idle
                if (lease := self.leader()) is not None and all(states[t] is not None for t in idle):
                    try:
                        readmit(self.client, self.optimizer, idle, generation=self.generation or 0, lease=lease,
                                global_step=_step_of(states, self.client.step_task), run=self.run,
                                limit=max(deadline - time.monotonic(), 0.0))
                        continue
                    except (CheckpointError, RpcError) as e:
                        failures.failed(e)
            elif (empty := lost_tasks(states))[0] and not self.checkpoint_dir:  # no checkpoint can exist: all stop
                raise StateLostError(state_lost_message(self.client, empty[0], empty[1], checkpoint_dir=None))
            elif (lease := self.leader()) is not None and all(s is not None for s in states.values()):
                try:
                    self.restore(lease, states, limit=max(deadline - time.monotonic(), 0.0))
                    continue
                except (CheckpointError, RpcError) as e:
                    failures.failed(e)
            if time.monotonic() + wait > deadline:
                failures.ended()
                down = [f"/job:ps/task:{t}" for t, s in sorted(states.items()) if s is None or not s.ready]
                raise RecoveryError(f"{self.client.client_name}: cluster not restored within {self.timeout:.0f} s "
                                    f"(waited {time.monotonic() - started:.1f} s; not ready: {', '.join(down) or 'none'})")
            time.sleep(wait)
            # At most 0.25 s between polls: a worker that is not the chief sees the restore that much after it
            # ended, and a sync run waits for its slowest worker (a 1.0 s cap cost up to 1 s per restore, most
            # of one in the tests' restores of 1.5-3 s). Each poll is one Stats RPC per ps task.
            wait = min(wait * 2, 0.25)
        failures.ended()
        self.generation = generation
        if self.on_restored is not None:
            self.on_restored(*self._restore_seen(states))
        self._restored = None
        position = self.client.reader_positions().get(self.client.client_name)
        log.warning("%s: cluster restored (generation %d) after %.1f s; resuming data at the checkpoint's position",
                    self.client.client_name, generation, time.monotonic() - started)
        return True, position if isinstance(position, str) else None

    def _restarted_since(self, states: dict[int, StatsReply | None], since: float | None, answered: float) -> set[int]:
        """The idle tasks (:func:`~psflow.ps.idle.idle_tasks`) of ``states`` (their answers all in by
        ``answered``) whose process started after ``since``: its ``uptime`` shorter than the time from ``since`` to
        ``answered`` (durations, whatever the hosts' clocks say). A process started after ``since`` always is; one
        started before it only within the reply's latency before it (taken as restarted: the caller then resumes
        where it was rather than fail). Empty where ``since`` is None."""
        if since is None:
            return set()
        out = set()
        for task in idle_tasks(self.client):
            uptime = (s := states.get(task)) is not None and s.counters.get("uptime")
            if isinstance(uptime, (int, float)) and not isinstance(uptime, bool) and uptime < answered - since:
                out.add(task)
        return out

    def _resumed_in_place(self, tasks: set[int], started: float) -> tuple[bool, str | None]:
        """(The cluster settled at this worker's generation again after idle ``tasks`` were made ready) ``(True,
        position)``: this worker re-opens its data at its own reader position on the task holding global_step (the
        one its last applied push recorded): nothing trained twice, nothing skipped, no checkpoint read."""
        position = self.client.reader_positions().get(self.client.client_name)
        log.warning("%s: %s restarted holding no variables and is ready again at generation %s after %.1f s: nothing "
                    "was restored; resuming data where it was", self.client.client_name, tasks_named(tasks),
                    self.generation, time.monotonic() - started)
        return True, position if isinstance(position, str) else None

    def _restore_seen(self, states: dict[int, StatsReply | None]) -> tuple[str | None, int | None]:
        """The checkpoint the cluster was just restored from and its global_step: this worker's restore's; another
        worker's restore: the one the ps tasks name in ``states`` (their ``Stats`` as the cluster settled: what
        the restore of their generation loaded), not the newest in the directory, which a save since the restore
        (by its lease holder, after a step there) moved past it: the summaries' START there dropped none of the lost
        steps' points. ps tasks too old to name it: the newest checkpoint now. (None, None) where none can be read:
        the cluster is restored all the same, and this worker goes on."""
        if self._restored is not None:
            return self._restored
        named = [s for _, s in sorted(states.items(), key=lambda item: item[0] != self.client.step_task)
                 if s is not None and s.restored_from_step is not None]
        if named:  # ps task 0's first (every task's load named the same checkpoint)
            return named[0].restored_from, named[0].restored_from_step
        try:  # a directory that cannot be listed now (CheckpointListingError) must not fail a restored worker
            checkpoint = latest_checkpoint(self.checkpoint_dir) if self.checkpoint_dir else None
            return (checkpoint, read_manifest(checkpoint).global_step) if checkpoint is not None else (None, None)
        except CheckpointError as e:  # deleted since (rotation), or not listed
            log.info("%s: the checkpoint the cluster was restored from is not known: %s", self.client.client_name, e)
            return None, None

    def await_restore(self, leadership: Leadership | None) -> str | None:
        """(A chief whose join left the restore within the run to the lease holder: generation None) campaigns, and
        waits for the cluster to settle at a new generation (restoring it if elected); its position to resume from.

        Raises:
            StateLostError, RecoveryError: as :meth:`wait`.
        """
        log.warning("%s: waiting for the cluster to be restored before the first step", self.client.client_name)
        if leadership is not None:  # nobody else may be left to take the lease and restore
            leadership.start()
        return self.wait()[1]

    def linger(self, num_workers: int, *, before_waiting: Callable[[], None] | None = None,
               take_over: Callable[[float, int | None, tuple[str, ...], int], bool] | None = None,
               poll: float = 0.2, first_poll: float = 0.025, first_for: float = 1.0) -> tuple[bool, str | None]:
        """(A worker that finished its data and sent ``Leave``) waits for the others to finish,
        ready to be rewound: a restore after a ps death sets every worker back to the
        checkpoint, this one included, so it must train its records since then again.

        Blocks until every worker has finished (per ps task 0's ``Stats``) with every ps task
        ready at this generation (a ps task that died after the last push is restored first, and
        every worker rewound with it, rather than left behind by workers that already exited), or until
        global_step has not moved for ``timeout`` s with the cluster settled (the others
        are gone; logged), or until a restore happened. ``before_waiting`` runs once,
        when another worker is found still training (e.g. resign the chief lease); ``take_over``
        (:class:`psflow.train.take_over.TakeOver`) at each poll after, with the seconds global_step stood
        still, its value, the workers finished and ``num_workers``: True ends the wait (it took the duties).

        Asks ``Stats`` every ``first_poll`` s for the first ``first_for`` s, then every ``poll`` s: with
        equal shares of the data the others usually finish within a fraction of a second of this one, and
        the run ends when this worker sees it (a 0.2 s poll from the start cost every run ~0.1 s on
        average); a long wait stays at ``poll``.

        Returns:
            ``(False, None)`` when done; ``(True, position)`` after a restore, with
            this worker's reader position (JSON) to resume from (None: its start).

        Raises:
            RecoveryError: a restore did not complete in time.
            RpcError: ps task 0 failed for another reason than a restore.
        """
        client = self.client
        last_step, last_move = None, time.monotonic()
        fast_until = last_move + first_for
        unsettled: float | None = None  # since when every worker finished with a ps task lost, the holder ending
        while True:
            try:
                stats: StatsReply | None = client.ps_stats()
            except RpcError:
                if not self.needed():
                    raise
                stats = None
            done = stats is not None and len(stats.finished or ()) >= num_workers
            if done and self._settled(self._states()) == self.generation:
                return False, None
            if not done and stats is not None and stats.ready and stats.generation == self.generation:
                if before_waiting is not None:
                    before_waiting()
                    before_waiting = None
                if stats.global_step != last_step:
                    last_step, last_move = stats.global_step, time.monotonic()
                elif take_over is not None and take_over(time.monotonic() - last_move, last_step,
                                                         stats.finished or (), num_workers):
                    return False, None
                elif time.monotonic() - last_move > self.timeout:
                    log.warning("%s: global_step stayed at %s for %.0f s while waiting for the other workers "
                                "(finished: %s); leaving", client.client_name, last_step, self.timeout,
                                ", ".join(stats.finished or ()) or "none")
                    return False, None
                time.sleep(first_poll if time.monotonic() < fast_until else poll)
                continue
            if done and self._ended_without_a_restore(stats):
                return False, None
            if done and self._holder_ending(stats, since=unsettled):
                unsettled = unsettled if unsettled is not None else time.monotonic()
                time.sleep(poll)
                continue
            if self.needed():
                restored, position = self.wait()
                if restored:
                    return True, position
            time.sleep(first_poll if time.monotonic() < fast_until else poll)

    def _holder_ending(self, stats: StatsReply | None, *, since: float | None) -> bool:
        """(Every worker finished; the run did not end without a restore) whether to poll again rather than wait for
        a restore: this worker holds no lease, the ps tasks are not settled at a new generation, and another worker's
        session has not ended yet (the holder in its final save or evaluation, whose ``Done`` tells this one the
        run ended), for at most ``timeout`` s since ``since``; then :meth:`wait` as before."""
        if stats is None or self.leader() is not None or (since is not None and time.monotonic() - since > self.timeout):
            return False
        return self._settled(self._states()) is None

    def _ended_without_a_restore(self, stats: StatsReply | None) -> bool:
        """(Every worker finished its data; the cluster is not settled at this worker's generation) whether the run
        ended with no restore to wait for: this worker holds no lease (it cannot restore), a ps task is not ready
        or unreachable (lost after the last push; restarted empty or not) and none is settled at a new generation, and
        every other worker's session ended normally (its ``Done`` on ps task 0: :mod:`psflow.ps.run_end`), the
        holder's after writing the final checkpoint. Nobody is left to restore the lost task; a restore would rewind
        no one whose data is not done, and the final model is the final checkpoint (a launcher evaluates it there).
        Logged (WARNING) when it is so; False otherwise, and this worker waits for the restore as before."""
        if stats is None or self.leader() is not None:
            return False
        run_end = stats.counters.get("run_end")
        done = set(run_end.get("workers_done") or ()) if isinstance(run_end, dict) else set()
        if not set(stats.finished or ()) - {self.client.client_name} <= done:
            return False
        states = self._states()
        if self._settled(states) is not None:  # restored meanwhile (at a new generation): wait() rewinds this one
            return False
        lost = [f"/job:ps/task:{t}" for t, s in sorted(states.items()) if s is None or not s.ready]
        log.warning("%s: every worker finished and the others' sessions ended (the final checkpoint written); %s "
                    "was lost after the last step and nobody is left to restore it: leaving (this worker's data is "
                    "done; the final model is the final checkpoint)", self.client.client_name, ", ".join(lost))
        return True

    def _checkpoint(self, lease: Lease | None) -> str | None:
        """The checkpoint a restore reads: the newest one, taken over with ``lease``'s epoch when there is a lease
        and a run id (:func:`~psflow.checkpoint.adopt.checkpoint_to_restore`), so an older chief whose save of it is
        then fenced off neither deletes it nor puts its previous pointer back; None: there is none."""
        if not self.checkpoint_dir:
            return None
        return checkpoint_to_restore(self.checkpoint_dir, run_id=self.run, lease=lease)  # no lease: in-graph's chief

    def restore(self, lease: Lease | None, states: dict[int, StatsReply | None], *, limit: float | None = None) -> None:
        """(Chief) restores every ps task from the newest checkpoint at a new generation.

        ``lease``: the elected chief's, whose epoch fences the restore; None where no election
        is held (an in-graph run's client, the run's only chief: :mod:`psflow.train.in_graph_client`).
        ``limit``: how long its Register asks a ps task that is unreachable again (:meth:`wait`: the time left).

        Raises:
            StateLostError: there is no checkpoint (names the tasks that lost their variables).
            CheckpointError, RpcError: the restore failed (the caller retries until its deadline).
        """
        client = self.client
        latest = self._checkpoint(lease)
        if latest is None:
            empty, kept = lost_tasks(states)
            unready = [t for t, s in sorted(states.items()) if s is not None and not s.ready]
            raise StateLostError(state_lost_message(client, empty or unready, [t for t in kept if t not in unready],
                                                    checkpoint_dir=self.checkpoint_dir))
        step_state = states[client.step_task]
        done = restore_at_new_generation(client, self.optimizer, latest, lease, states, run=self.run, limit=limit,
                                         step_survived=step_state is not None and step_state.registered)
        generation, step, manifest = done.generation, done.global_step, done.manifest
        self.restores += 1
        self._restored = latest, manifest.global_step
        log.warning("%s: restored checkpoint %s (step %d) onto every ps task; generation %d, global_step %d",
                    client.client_name, latest, manifest.global_step, generation, step)
        empty, _ = lost_tasks(states)
        if client.router is not None and empty:  # replicated: only a loss of every replica of a shard gets here
            log.warning("%s: every replica of ps shard %s was lost at once: the pushes it acknowledged after that "
                        "checkpoint are lost (counted in updates_lost); its primary rebuilds its backups",
                        client.client_name, ", ".join(str(t) for t in empty))
