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
   (:meth:`ClusterRecovery.linger`), so a later restore can rewind it too.

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
import threading
import time
from collections.abc import Callable

from psflow.checkpoint.adopt import checkpoint_to_restore
from psflow.coord.api import (
    BackendUnavailableError,
    CampaignTimeoutError,
    CoordinationBackend,
    CoordinationError,
    Lease,
    LeaseLostError,
)
from psflow.errors import CheckpointError, TrainingError
from psflow.optim import OptimizerSpec
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import StatsReply
from psflow.rpc.api import RpcError
from psflow.train.generation_restore import restore_at_new_generation
from psflow.train.leader_hooks import CampaignWhileTrainingHook, LeaderOnlyHook
from psflow.train.state_loss import StateLostError, lost_tasks, ps_states, state_lost_message

__all__ = ["Leadership", "LeaderOnlyHook", "CampaignWhileTrainingHook", "ClusterRecovery", "RecoveryError"]

log = logging.getLogger("psflow.recovery")


#: Pauses of the background campaign between two asks of a polling backend (CoordinationBackend.campaign_polls).
_FIRST_PAUSE, _MAX_PAUSE = 0.05, 0.4


class RecoveryError(TrainingError, RuntimeError):
    """The cluster was not restored in time; names the tasks not ready (no checkpoint at all:
    :class:`~psflow.train.state_loss.StateLostError`)."""


class Leadership:
    """Campaigns for a lease in the background and keeps campaigning after losing it.

    Thread-safe. :meth:`lease` is the held lease or ``None``; it turns ``None``
    as soon as the backend's local view of the lease expires (never later
    than the service's).
    """

    def __init__(self, backend: CoordinationBackend, candidate: str, *, poll: float = 0.2,
                 on_elected: Callable[[Lease], None] | None = None) -> None:
        """Args:
            backend: the coordination backend (closed by :meth:`close`).
            candidate: this worker's task name.
            poll: seconds between two checks that the lease is still held.
            on_elected: called with each new lease, on the electing thread, before :meth:`lease`
                returns it: the worker fences every ps task at the new epoch there, so a deposed
                chief's writes are refused from the take-over on, even if the new chief never
                writes. A :class:`CoordinationError` or :class:`RpcError` it raises is logged.
        """
        self.backend = backend
        self.candidate = candidate
        self._poll = poll
        self._on_elected = on_elected
        self._lease: Lease | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        #: Set by :meth:`resign`, cleared by :meth:`start` and :meth:`rewound`.
        self.resigned = False

    def campaign(self, timeout: float) -> Lease | None:
        """Campaigns now, in the caller's thread, for at most ``timeout`` s; the lease or None."""
        try:
            lease = self.backend.campaign(self.candidate, timeout=timeout)
        except (CampaignTimeoutError, BackendUnavailableError) as e:
            log.info("%s: not elected chief now: %s", self.candidate, e)
            return None
        self._elected(lease)
        with self._lock:
            self._lease = lease
        log.info("%s: elected chief (epoch %d)", self.candidate, lease.epoch)
        return lease

    def _elected(self, lease: Lease) -> None:
        if self._on_elected is None:
            return
        try:
            self._on_elected(lease)
        except (CoordinationError, RpcError) as e:  # the first fenced write fences them instead
            log.warning("%s: fencing the ps tasks at epoch %d on election: %s", self.candidate, lease.epoch, e)

    def start(self) -> None:
        """Starts the background campaign (again, after :meth:`resign`); idempotent."""
        if self._thread is None or not self._thread.is_alive():
            self._closed.clear()
            self.resigned = False
            self._thread = threading.Thread(target=self._run, name="psflow-leadership", daemon=True)
            self._thread.start()

    def stop_campaigning(self) -> None:
        """Stops the background campaign, keeping a lease held (the backend goes on renewing it):
        once it returns, this worker takes no new lease until :meth:`start`; idempotent. Blocks until
        the campaign thread ends (at most one campaign call: one RPC with a polling backend such as the
        embedded one, about a second with one the service wakes); that call may still be granted, and
        the lease is then held (and logged) like any other."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def campaigning(self) -> bool:
        """Whether the background campaign runs."""
        return self._thread is not None and self._thread.is_alive() and not self._closed.is_set()

    def resign(self) -> None:
        """Stops campaigning and gives up the lease if held, keeping the backend open
        (:meth:`start` campaigns again); idempotent. Blocks for at most one poll and one RPC."""
        self.resigned = True
        self.stop_campaigning()
        with self._lock:
            lease, self._lease = self._lease, None
        if lease is not None:
            try:
                self.backend.resign(lease)
                log.info("%s: resigned as chief (epoch %d)", self.candidate, lease.epoch)
            except CoordinationError as e:
                log.warning("%s: resigning the chief lease (epoch %d): %s", self.candidate, lease.epoch, e)

    def rewound(self) -> None:
        """(A restore rewound this worker to a checkpoint) voids an earlier :meth:`resign`: that handed the duties on
        when this worker's data had ended, which it no longer has, so whether it finishes last is decided again when
        its data ends next (:func:`~psflow.train.final_duties.end_duties`). A stale ``resigned`` let a worker rewound
        to the end of its data (it runs no step, so it never campaigns again) skip the final checkpoint while the
        other worker, which saw it training, had resigned too: nobody wrote it (CI, test_final_snapshot)."""
        self.resigned = False

    def lease(self) -> Lease | None:
        """The lease if this worker leads now, else None. A held lease found lost here is resigned (best effort,
        one call to the service): the backend renews it no more, so this worker's next campaign can win."""
        with self._lock:
            lease = self._lease
        if lease is not None and not self.backend.is_held(lease):
            with self._lock:
                if self._lease is lease:
                    self._lease = None
            log.warning("%s: no longer chief (lease epoch %d lost)", self.candidate, lease.epoch)
            # Given up for good: a lease lapsed only in this worker's view (its grant came back after its ttl)
            # is still renewed by the backend and held at the service, refusing this worker's next campaign.
            try:
                self.backend.resign(lease)
            except CoordinationError as e:
                log.info("%s: resigning the lost lease epoch %d: %s", self.candidate, lease.epoch, e)
            return None
        return lease

    def confirmed_lease(self) -> Lease | None:
        """Like :meth:`lease`, confirmed by a round trip to the service (a renewal).

        Use it before acting on the lease after a failure: a restarted ps task 0 forgets every
        embedded lease (replicated shards: only if every replica of shard 0 was lost), so a chief's
        local view can outlive its lease while a successor is already elected. Blocks for one RPC
        at most (replicated shards: one per member of shard 0); not confirmed, two (the lease is resigned).

        A lease not confirmed because the service did not answer (ps task 0 restarting; with replicated
        shards, no member of shard 0 primary yet) is resigned: the backend stops renewing it, so it lapses
        within its ttl and this worker's next campaign can win. Else the backend's renewals kept it alive at a
        service that kept its table (a promoted backup of shard 0), refusing this worker's own campaign.
        """
        lease = self.lease()
        if lease is None:
            return None
        try:
            self.backend.renew(lease)
        except CoordinationError as e:
            with self._lock:
                if self._lease is lease:
                    self._lease = None
            log.warning("%s: not acting as chief: lease epoch %d not confirmed: %s", self.candidate, lease.epoch, e)
            if not isinstance(e, LeaseLostError):  # lost: the backend renews it no more already
                try:
                    self.backend.resign(lease)
                except CoordinationError as resign_error:
                    log.info("%s: resigning the unconfirmed lease epoch %d: %s", self.candidate, lease.epoch,
                             resign_error)
            return None
        return lease

    def _run(self) -> None:
        # A polling backend is asked once per call and the pauses are waits on _closed: stop_campaigning then
        # returns within one Campaign call (a call of a second's polling held the last worker's end until the
        # lease was granted, up to 0.4 s after the other worker resigned). The pauses grow as that call's did
        # (0.05 s, doubling up to 0.4 s), without its restart every second: fewer calls, not more.
        polls = self.backend.campaign_polls
        pause = _FIRST_PAUSE
        while not self._closed.is_set():
            if self.lease() is None:
                try:
                    lease = self.backend.campaign(self.candidate, timeout=0.0 if polls else 1.0)
                except CampaignTimeoutError:
                    if polls:
                        self._closed.wait(pause)
                        pause = min(pause * 2, _MAX_PAUSE)
                    continue
                except CoordinationError as e:
                    log.info("%s: campaign failed: %s; retrying", self.candidate, e)
                    self._closed.wait(0.5)
                    continue
                self._elected(lease)
                with self._lock:
                    self._lease = lease
                # Said even when the campaign was stopped meanwhile (its data ended): the lease is held all the same.
                log.info("%s: elected chief (epoch %d)", self.candidate, lease.epoch)
                pause = _FIRST_PAUSE
                if self._closed.is_set():
                    break
            self._closed.wait(self._poll)

    def close(self) -> None:
        """Stops campaigning and resigns (another worker may then be elected); idempotent."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        with self._lock:
            self._lease = None
        try:
            self.backend.close()
        except CoordinationError as e:
            log.warning("%s: closing the coordination backend: %s", self.candidate, e)


class ClusterRecovery:
    """What one worker does when the data path fails; see the module docstring."""

    def __init__(self, client: ParameterClient, optimizer: OptimizerSpec, *, checkpoint_dir: str | None,
                 leader: Callable[[], Lease | None], timeout: float, generation: int | None = 0,
                 run: str | None = None) -> None:
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

    def _states(self) -> dict[int, StatsReply | None]:
        return ps_states(self.client)

    def _settled(self, states: dict[int, StatsReply | None]) -> int | None:
        """The generation every ps task is ready at, or None."""
        gens = {s.generation for s in states.values() if s is not None and s.ready}
        if len(gens) != 1 or any(s is None or not s.ready for s in states.values()):
            return None
        return gens.pop()

    def needed(self) -> bool:
        """After a data-path error: is (or was) the cluster being restored?"""
        return self.generation is None or self._settled(self._states()) != self.generation

    def wait(self) -> tuple[bool, str | None]:
        """Blocks until every ps task is ready at one generation (restoring it if this worker is chief).

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
        while True:
            states = self._states()
            generation = self._settled(states)
            if generation is not None and generation == self.generation:
                return False, None
            if generation is not None:
                break
            empty, kept = lost_tasks(states)
            if empty and not self.checkpoint_dir:  # no checkpoint can exist: every worker stops at once
                raise StateLostError(state_lost_message(self.client, empty, kept, checkpoint_dir=None))
            lease = self.leader()
            if lease is not None and all(s is not None for s in states.values()) and generation is None:
                try:
                    self.restore(lease, states, limit=max(deadline - time.monotonic(), 0.0))
                    continue
                except (CheckpointError, RpcError) as e:
                    log.error("%s: restore failed: %s; retrying", self.client.client_name, e)
            if time.monotonic() + wait > deadline:
                down = [f"/job:ps/task:{t}" for t, s in sorted(states.items()) if s is None or not s.ready]
                raise RecoveryError(f"{self.client.client_name}: cluster not restored within {self.timeout:.0f} s "
                                    f"(waited {time.monotonic() - started:.1f} s; not ready: {', '.join(down) or 'none'})")
            time.sleep(wait)
            # At most 0.25 s between polls: a worker that is not the chief sees the restore that much after it
            # ended, and a sync run waits for its slowest worker (a 1.0 s cap cost up to 1 s per restore, most
            # of one in the tests' restores of 1.5-3 s). Each poll is one Stats RPC per ps task.
            wait = min(wait * 2, 0.25)
        self.generation = generation
        position = self.client.reader_positions().get(self.client.client_name)
        log.warning("%s: cluster restored (generation %d) after %.1f s; resuming data at the checkpoint's position",
                    self.client.client_name, generation, time.monotonic() - started)
        return True, position if isinstance(position, str) else None

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
            if self.needed():
                restored, position = self.wait()
                if restored:
                    return True, position
            time.sleep(first_poll if time.monotonic() < fast_until else poll)

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
        log.warning("%s: restored checkpoint %s (step %d) onto every ps task; generation %d, global_step %d",
                    client.client_name, latest, manifest.global_step, generation, step)
        empty, _ = lost_tasks(states)
        if client.router is not None and empty:  # replicated: only a loss of every replica of a shard gets here
            log.warning("%s: every replica of ps shard %s was lost at once: the pushes it acknowledged after that "
                        "checkpoint are lost (counted in updates_lost); its primary rebuilds its backups",
                        client.client_name, ", ".join(str(t) for t in empty))
