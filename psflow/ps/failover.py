"""Failover of a replicated ps shard, the client's side: which member is the shard's primary now.

A cluster with a ``ps_backup`` job replicates every ps shard (:mod:`psflow.cluster.replicas`; the
ps side is :mod:`psflow.ps.replication`): shard k's requests go to its primary, at first
``/job:ps/task:k``. :class:`ShardRouter` keeps, per shard, the members, the primary the client routes
to and the epoch it knows, and the channel to that primary (:attr:`ShardRouter.channels`, the
client's ``channels``: shard -> channel, changed in place on a failover).

When a request to a shard fails with UNAVAILABLE, DEADLINE_EXCEEDED or FAILED_PRECONDITION,
:meth:`ShardRouter.resolve` asks every member its ``ReplicaStatus`` (short deadline, in parallel)
and :func:`~psflow.ps.primary_choice.decide` reads the answers:

1. a member that says primary, holds the variables (``has_state``) and has the highest epoch of
   those holding them: the shard routes to it;
2. none (the primary died, or is cut off, or was deposed): the first member in member order that is
   a backup holding the variables at that epoch is sent ``Promote`` (idempotent: two clients
   promoting the same backup at the same epoch get the same primary), and the members are asked again
   -- but only once the view's primary is *provably gone* (below); a primary that is merely slow is
   waited for, so a slow answer never starts a failover;
3. no member holds the variables (a fresh cluster, or every replica of the shard lost): the shard
   routes to the member that says primary at the highest epoch, empty; today's path takes over from
   there (the chief initializes, or :class:`psflow.train.recovery.ClusterRecovery` restores the newest
   checkpoint onto it, and it rebuilds its backups);
4. the primary is the one the client knew, at the epoch it knew, and the request failed as
   unreachable or late: a backup of its view that the client cannot reach either, and that is provably
   gone too, is dropped from the view (``DropBackup``: the primary never drops one on its own, so a
   partition never makes two primaries); it joins again when it returns.

*Provably gone*: the member answered its status, but not as the primary holding the variables (restarted
empty, a backup, deposed), and again so when asked once more after its backup answered (a round's answers
come in parallel: one may predate another); or :class:`~psflow.ps.member_evidence.MemberEvidence` says it is
gone (:meth:`ShardRouter.gone`: its host refused the connection after this client had reached it once, or
it answered *nothing* for ``failover_timeout`` seconds, ``--ps-failover-timeout``, default 10 s; a member
that never answered this client is not up yet, and gone only after ``start_timeout``, the client's
``connect_timeout``, unless a backup holding the variables names it its primary: ``failover_timeout`` from
then). A status call that misses its 2 s deadline, a push that waits for its sync step, a process stalled for
a few seconds on a busy machine, a ps task slow to start: none of these promote a backup.

:meth:`resolve` returns True when the route changed (a new primary, epoch or view: the caller resends
the same request, whose ``push_id`` makes the new primary apply a push at most once) and False when it
did not (the error was not a failover's: the caller raises it). :meth:`gather` does both for one call
per shard: replies of the shards that succeeded are kept, only the failed shards' requests are resent (every
failed-over shard's, also when another shard's error is final: that error is raised once they replied);
:meth:`call` for one call to one shard (Register, ReaderPositions, Stats, and the chief's SetReady,
BeginRestore, LoadShard, SaveShard, Fence, CheckpointStatus through ``ParameterClient.call``: each
idempotent, so a worker or chief whose call was in flight to a primary that died follows the failover).

Not thread-safe: one router per client, used by its training thread (:func:`resolve_all` resolves distinct shards from several threads
at connect time, and :meth:`ShardRouter.gather` the shards of one call that failed together). An unreplicated cluster has no router.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent import futures

from psflow.cluster import ClusterSpec
from psflow.cluster.replicas import member_address, shard_members
from psflow.ps.member_evidence import MemberEvidence, refused
from psflow.ps.primary_choice import Decision, decide
from psflow.ps.protocol.replication import DropBackupRequest, PromoteRequest, ReplicaStatusReply, ReplicaStatusRequest
from psflow.rpc.api import (
    Channel,
    ConnectConfig,
    DeadlineExceededError,
    FailedPreconditionError,
    PendingReply,
    RpcError,
    TaskUnavailableError,
)
from psflow.rpc.framing import Frame

__all__ = ["FAILOVER_ERRORS", "FAILOVER_TIMEOUT", "ShardRouter", "refused", "resolve_all"]

log = logging.getLogger("psflow.ps.client")

#: Seconds a shard member may answer nothing (no status, no call) before a client takes it as gone (promotes a
#: backup over a primary, drops a backup) when no faster proof comes: the ``--ps-failover-timeout`` default.
FAILOVER_TIMEOUT = 10.0

#: The errors after which a replicated shard's primary is resolved again.
FAILOVER_ERRORS: tuple[type[RpcError], ...] = (TaskUnavailableError, DeadlineExceededError, FailedPreconditionError)


class ShardRouter:
    """Routes each shard of a replicated cluster to its primary; see the module docstring."""

    def __init__(self, cluster: ClusterSpec, open_member: Callable[[str, str], Channel], *, client_name: str,
                 config: ConnectConfig | None = None, failover_timeout: float | None = None,
                 status_timeout: float | None = None, wait_timeout: float | None = None,
                 start_timeout: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        """Opens the channels to the shards' first primaries (``open_member``; the others when first asked).

        Args:
            cluster: a replicated cluster (a ``ps_backup`` job).
            open_member: (task name, address) -> a channel to that member's parameter service.
            client_name: this client's task name (logs, errors, ``requester`` of its calls).
            config: the client's timeouts and backoff (the wait between two rounds of statuses grows
                from ``backoff_initial`` to at most 1 s).
            failover_timeout: seconds a member must have answered nothing (no status, no call) before it
                counts as gone when no faster proof comes (default :data:`FAILOVER_TIMEOUT`, 10 s).
            status_timeout: deadline of one ``ReplicaStatus`` call, seconds (default 2 s, at most
                ``config.rpc_timeout``).
            wait_timeout: seconds :meth:`resolve` tries before it gives up (default
                ``config.connect_timeout``, and at least ``failover_timeout`` or ``start_timeout``, whichever is
                longer, plus two status rounds).
            start_timeout: seconds a member that never answered this client must have answered nothing before it
                counts as gone (default ``config.connect_timeout``: it is starting, not silent).
            clock: the clock silences are measured by (tests move it by hand).

        Raises:
            ClusterError: the ``ps_backup`` job does not fit the ``ps`` job.
            ValueError: ``failover_timeout`` is not positive.
        """
        config = config or ConnectConfig()
        self.cluster = cluster
        self.client_name = client_name
        self.failover_timeout = FAILOVER_TIMEOUT if failover_timeout is None else failover_timeout
        if not self.failover_timeout > 0:
            raise ValueError(f"{client_name}: the ps failover timeout must be > 0 s, got {self.failover_timeout}")
        self.status_timeout = min(2.0, config.rpc_timeout) if status_timeout is None else status_timeout
        self.start_timeout = config.connect_timeout if start_timeout is None else start_timeout
        proof = max(self.failover_timeout, self.start_timeout) + 2 * self.status_timeout
        self.wait_timeout = max(config.connect_timeout, proof) if wait_timeout is None else wait_timeout
        self._clock = clock
        self._config = config
        self._evidence = MemberEvidence(self.failover_timeout, self.start_timeout, clock)
        self._in_doubt: dict[int, tuple[str, str]] = {}  # shard -> (target, error): a Promote/DropBackup, reply lost
        self._backoff = (config.backoff_initial, min(1.0, config.backoff_max))
        self._open = open_member
        shards = cluster.task_indices("ps")
        #: shard -> its members, in member order.
        self.members: dict[int, tuple[str, ...]] = {k: shard_members(cluster, k) for k in shards}
        #: shard -> (the primary requests go to, its epoch; None until a status said it).
        self.routes: dict[int, tuple[str, int | None]] = {k: (m[0], None) for k, m in self.members.items()}
        self._member_channels: dict[str, Channel] = {}
        #: shard -> the channel of its primary: the client's ``channels``, changed in place.
        self.channels: dict[int, Channel] = {k: self._channel(m[0]) for k, m in self.members.items()}
        #: Failovers this router followed (a new primary or epoch), for logs and tests.
        self.failovers = 0
        self._last_statuses: dict[int, dict[str, ReplicaStatusReply | None]] = {}

    def _channel(self, task: str) -> Channel:
        channel = self._member_channels.get(task)
        if channel is None:
            channel = self._member_channels[task] = self._open(task, member_address(self.cluster, task))
        return channel

    def twin(self, client_name: str) -> ShardRouter:
        """A router of its own over the same cluster, channel opener and timeouts (its own channels, routes and
        evidence of who is gone, starting from a copy of this one's: a member this router reached is reached for
        the twin too, so its refused connection is proof to the twin's first call), for calls made off the thread
        that uses this one (:class:`~psflow.ps.control_routes.ControlRouter`). Call it on this router's thread."""
        twin = ShardRouter(self.cluster, self._open, client_name=client_name, config=self._config,
                           failover_timeout=self.failover_timeout, status_timeout=self.status_timeout,
                           wait_timeout=self.wait_timeout, start_timeout=self.start_timeout, clock=self._clock)
        twin._evidence.inherit(self._evidence)
        return twin

    def start_at(self, other: ShardRouter) -> None:
        """Routes each shard where ``other`` routes it now, and starts from ``other``'s evidence of who is gone
        (a twin taking over another router's view, e.g. a save's client beginning at the data client's primaries
        rather than at each shard's first member: a refusal by a primary the data client reached proves it gone
        at once, rather than after another client's promotion or ``failover_timeout``). Call it on ``other``'s
        thread."""
        for shard, route in dict(other.routes).items():
            self.routes[shard] = route
            self.channels[shard] = self._channel(route[0])
        self._evidence.inherit(other._evidence)

    def reached(self, task: str) -> None:
        """Member ``task``'s process answered this client through another service at its address (shard 0's
        coordination service): from now on a refused connection proves it gone (:meth:`gone`), as after a
        status it answered."""
        self._evidence.reached(task)

    def epoch(self, shard: int) -> int | None:
        """The epoch shard ``shard``'s requests are routed by (None before the first status)."""
        return self.routes[shard][1]

    def statuses(self, shard: int) -> dict[str, ReplicaStatusReply | None]:
        """Every member's ``ReplicaStatus`` (in parallel; None: no answer within ``status_timeout``)."""
        meta = ReplicaStatusRequest().to_frame().meta
        sent = self._clock()
        calls = {t: self._channel(t).call_async(ReplicaStatusRequest.METHOD, meta, timeout=self.status_timeout)
                 for t in self.members[shard]}
        out: dict[str, ReplicaStatusReply | None] = {}
        for task, call in calls.items():
            try:
                out[task] = ReplicaStatusReply.from_frame(call.result())
                self._heard(task)
            except RpcError as e:
                out[task] = None
                self._unanswered(task, sent, e)
        for task, s in out.items():  # a backup holding the variables under a primary: that one was up (named())
            if s is not None and s.has_state and s.role == "backup" and s.primary and out.get(s.primary, s) is None:
                self._evidence.named(s.primary, sent, task)
        self._last_statuses[shard] = out
        return out

    def _serving(self, shard: int) -> bool:
        """Whether the primary shard ``shard`` routes to said, in the latest statuses, that it is that
        shard's primary holding the variables at the routed epoch (alive and serving: a request it failed
        as unavailable or late may be sent to it again)."""
        task, epoch = self.routes[shard]
        said = self._last_statuses.get(shard, {}).get(task)
        return said is not None and said.role == "primary" and said.has_state and said.epoch == epoch

    def _asked_again(self, decision: Decision, statuses: dict[str, ReplicaStatusReply | None]) -> bool:
        """(Before a ``Promote``) asks the view's primary its status once more, after its backup answered, when its
        own answer said it is not the primary: a round's answers come in parallel, so that one may predate the
        backup's (a member joining at epoch 0 an instant before it started the fresh shard at epoch 1). Updates
        ``statuses``; returns whether it asked."""
        backup = statuses.get(decision.task)
        primary = backup.primary if backup is not None else None
        if not primary or statuses.get(primary) is None:
            return False  # proven gone by a refusal or a silence: those are not overtaken by a later answer
        sent = self._clock()
        try:
            frame = self._channel(primary).call(ReplicaStatusRequest.METHOD, ReplicaStatusRequest().to_frame().meta,
                                                timeout=self.status_timeout)
            statuses[primary] = ReplicaStatusReply.from_frame(frame)
            self._heard(primary)
        except RpcError as e:
            statuses[primary] = None
            self._unanswered(primary, sent, e)
        return True

    def _heard(self, task: str) -> None:
        self._evidence.heard(task)

    def _unanswered(self, task: str, sent: float, error: RpcError) -> None:
        self._evidence.unanswered(task, sent, error)

    def gone(self, task: str) -> str | None:
        """Why member ``task`` counts as gone, or None (:meth:`~psflow.ps.member_evidence.MemberEvidence.gone`)."""
        return self._evidence.gone(task)

    def resolve(self, shard: int, error: RpcError | None = None, *, timeout: float | None = None) -> bool:
        """Finds shard ``shard``'s primary (promoting a backup, or dropping an unreachable one, where
        :func:`~psflow.ps.primary_choice.decide` says so) and routes the shard to it.

        Blocks until a member can serve the shard, at most ``timeout`` s (default
        ``failover_timeout``), asking the members again with backoff.

        Args:
            shard: the shard whose request failed.
            error: the request's error (None: no request failed, e.g. at connect time).
            timeout: seconds to try (0: one round of statuses, no wait).

        Returns:
            True if the route changed (resend the request), False if not (``error`` is the request's own).

        Raises:
            TaskUnavailableError: no member could serve the shard in time (names the shard, the members
                and what each said).
        """
        limit = self.wait_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        wait = self._backoff[0]
        known = self.routes[shard]
        unreachable = isinstance(error, TaskUnavailableError | DeadlineExceededError)
        while True:
            statuses = self.statuses(shard)
            gone = {t: why for t, s in statuses.items() if s is None and (why := self.gone(t)) is not None}
            decision = decide(self.members[shard], statuses, known=known, unreachable_error=unreachable, gone=gone)
            if decision.action == "promote" and self._asked_again(decision, statuses):
                gone = {t: why for t, s in statuses.items() if s is None and (why := self.gone(t)) is not None}
                decision = decide(self.members[shard], statuses, known=known, unreachable_error=unreachable, gone=gone)
            if decision.action == "route":
                return self._route(shard, known, decision)
            if decision.action in ("promote", "drop"):
                if self._act(shard, decision, statuses, gone) is not None:
                    unreachable = False  # the view changed: the next round routes by it
                    continue
            if time.monotonic() + wait > deadline:
                said = "; ".join(f"{t}: {_said(s)}" for t, s in statuses.items())
                raise TaskUnavailableError(
                    f"{self.client_name}: no member of ps shard {shard} can serve it after {limit:.1f} s ({said})"
                    + (f"; the request failed with: {error}" if error is not None else "")) from error
            time.sleep(wait)
            wait = min(wait * 2, self._backoff[1])

    def _route(self, shard: int, known: tuple[str, int | None], decision: Decision) -> bool:
        route = (decision.task, decision.epoch)
        if route == known:
            return False
        self.routes[shard] = route
        self.channels[shard] = self._channel(decision.task)
        if known[1] is not None:  # not the first status: a failover (or a view change)
            self.failovers += 1
            # INFO: one failover is one WARNING (the member's, the client's whose call made it), not one per client;
            # a WARNING where no member holds the variables, or after this client's call that lost its reply (none knows)
            lost = f" after this client's {d[1]}" if (d := self._in_doubt.pop(shard, None)) and d[0] == route[0] else ""
            log.log(logging.INFO if decision.has_state and not lost else logging.WARNING,
                    "%s: ps shard %d routes to %s at epoch %d (was %s at epoch %s)%s%s", self.client_name, shard,
                    decision.task, decision.epoch, known[0], known[1],
                    "" if decision.has_state else "; no member holds its variables", lost)
        return True

    def _act(self, shard: int, decision: Decision, statuses: Mapping[str, ReplicaStatusReply | None],
             gone: Mapping[str, str]) -> ReplicaStatusReply | None:
        """Sends the ``Promote`` or ``DropBackup`` of ``decision``; its reply, or None if refused or lost. Its line is a
        WARNING only where this call changed the view (a lost reply: :meth:`_route`'s), not one per client sending it."""
        if decision.action == "promote":
            target = decision.task
            request: PromoteRequest | DropBackupRequest = PromoteRequest(shard, decision.epoch, self.client_name)
            backup = statuses.get(target)
            primary = backup.primary if backup is not None and backup.primary else "its primary"
            said = statuses.get(primary)
            why = gone.get(primary) or (f"it says {_said(said)}" if said is not None else "gone")
            line: tuple[object, ...] = (
                "%s: ps shard %d has no primary holding its variables (%s: %s); promoting %s (epoch %d)",
                self.client_name, shard, primary, why, target, decision.epoch)
        else:
            target = decision.primary
            request = DropBackupRequest(shard, decision.epoch, decision.task, self.client_name)
            line = ("%s: ps shard %d: backup %s unreachable from %s and from here (%s); asking %s to drop it "
                    "(epoch %d)", self.client_name, shard, decision.task, target, gone.get(decision.task, "gone"),
                    target, decision.epoch)
        try:
            frame = self._channel(target).call(request.METHOD, request.to_frame().meta, timeout=self.status_timeout * 5)
        except RpcError as e:  # another client acted first, or the member went away: statuses again
            if isinstance(e, TaskUnavailableError | DeadlineExceededError):  # it may have been served: see _route
                self._in_doubt[shard] = (target, f"{request.METHOD}, whose reply was lost ({e})")
            log.info(*line)
            log.info("%s: ps shard %d: %s to %s: %s", self.client_name, shard, request.METHOD, target, e)
            return None
        self._heard(target)
        self._in_doubt.pop(shard, None)
        reply = ReplicaStatusReply.from_frame(frame)
        if reply.view_changed:
            log.warning(*line)
        else:
            log.info(f"{line[0]}: done already by another client", *line[1:])
        return reply

    def gather(self, calls: Mapping[int, PendingReply], resend: Callable[[int], PendingReply], *,
               replied: Callable[[Collection[int]], None] | None = None, wait: float | None = None) -> dict[int, Frame]:
        """Waits for one call per shard; the shards whose call failed over are resolved and their request
        resent (``resend(shard)`` sends it again to the shard's channel now), until each succeeded.

        Blocks for every call, then for each failover: at most ``wait`` s from the first failed reply (None:
        the router's ``wait_timeout``; a caller's own deadline, e.g. a status read that must not hold up the
        launcher's loop while a shard has no primary).
        ``replied`` is called once with the shards that replied, whether the call as a whole succeeds or
        raises (a push one shard applied is counted acknowledged there even when another shard failed).
        A shard's error that is final does not stop the others: each failed-over shard is still resolved (the
        failed shards of a round in parallel, so one whose members never answer does not use up the others' time)
        and its request resent until it replied or failed for good too, whatever its place in shard order (a push
        the dead primary had forwarded is held by the promoted backup: raised without its resend, it stayed
        applied there and was never counted acknowledged).

        Raises:
            RpcError: a shard's error that was not a failover (its route did not change), or the first
                error when a failed shard could not be resolved in time; the first such (in shard order, then
                round), raised once every call finished.
        """
        sent = self._clock()  # no later than the calls were sent: a silence counted from here is never too long
        replies, errors = _collect(calls)
        final: RpcError | None = None  # the first error that is final, raised once no shard is left to resend
        try:
            if self._evidence.any_silent and not errors:  # a member that was silent answered: its silence is over
                self._heard_from(replies, errors, sent)
            elif not errors:  # (a member's first answer: from now on its silence is one, not a start)
                self._evidence.first_answers(self.routes[shard][0] for shard in replies)
            deadline = time.monotonic() + (self.wait_timeout if wait is None else wait)
            while errors:
                self._heard_from(replies, errors, sent)
                resent: dict[int, PendingReply] = {}
                for shard, failed in self._follow_all(errors, deadline - time.monotonic()).items():
                    if failed is not None:
                        final = final or failed
                    else:
                        resent[shard] = resend(shard)
                sent = self._clock()
                more, errors = _collect(resent)
                replies.update(more)
            if final is not None:
                raise final
            return replies
        finally:
            if replied is not None:
                replied(tuple(replies))

    def _follow_all(self, errors: Mapping[int, RpcError], left: float) -> dict[int, RpcError | None]:
        """(:meth:`gather`) :meth:`_follow` for every failed shard at once, each within ``left`` s, in shard order. In
        parallel: a shard no member of which answers waits all of ``left`` and fails; followed one after the other, a
        failed-over shard after it had no time left and was never resent (its push, held by the promoted backup, never
        counted acknowledged). Distinct shards, as :func:`resolve_all`."""
        if len(errors) == 1:
            ((shard, error),) = errors.items()
            return {shard: self._follow(shard, error, left)}
        with futures.ThreadPoolExecutor(len(errors)) as pool:
            followed = {shard: pool.submit(self._follow, shard, error, left) for shard, error in sorted(errors.items())}
        return {shard: f.result() for shard, f in followed.items()}

    def _follow(self, shard: int, error: RpcError, left: float) -> RpcError | None:
        """(:meth:`gather`) Whether shard ``shard``'s failed call may be resent, within ``left`` s: None if so (its
        route changed, or its primary is serving and only failed it as unavailable or late), else the error to
        raise (the call's own, or the failover's when no member could serve the shard in time)."""
        if not isinstance(error, FAILOVER_ERRORS) or left <= 0:
            return error
        try:
            if self.resolve(shard, error, timeout=left):
                return None
        except RpcError as e:
            return e
        if not (isinstance(error, TaskUnavailableError | DeadlineExceededError) and self._serving(shard)):
            return error
        # The primary is alive and serving: it failed the call as unavailable (a backup slow to acknowledge) or the
        # call was late; sent again (a push with its push_id is applied once).
        time.sleep(min(self._backoff[1], max(0.0, left)))
        return None

    def call(self, shard: int, send: Callable[[int], PendingReply], *, wait: float | None = None) -> PendingReply:
        """One call to shard ``shard``'s primary, sent now (``send(shard)``); waiting for its reply follows a
        failover as :meth:`gather` does (the call resent to the new primary; ``wait``: as there). For calls
        that may be resent: idempotent ones (Register, SetReady, LoadShard, ...) and those a push_id guards."""
        return _FollowedCall(self, shard, send, send(shard), wait)

    def _heard_from(self, replies: Mapping[int, Frame], errors: Mapping[int, RpcError], sent: float) -> None:
        """(A gather with failed calls) records who answered and who did not, for :meth:`gone`."""
        for shard in replies:
            self._heard(self.routes[shard][0])
        for shard, error in errors.items():
            self._unanswered(self.routes[shard][0], sent, error)

    def reroute(self, errors: Mapping[int, RpcError]) -> set[int]:
        """Follows each shard of ``errors`` (whose call failed) to its primary now: one round of statuses, no
        wait; a shard that no member can serve now stays as it is (logged). Returns the shards whose route
        changed."""
        changed = set()
        for shard, error in errors.items():
            try:
                if self.resolve(shard, error, timeout=0):
                    changed.add(shard)
            except RpcError as e:
                log.info("%s: ps shard %d: %s", self.client_name, shard, e)
        return changed

    def close(self) -> None:
        """Closes every member's channel; idempotent."""
        for channel in self._member_channels.values():
            channel.close()


class _FollowedCall:
    """A call to one shard whose ``result()`` follows the shard to its new primary (:meth:`ShardRouter.call`)."""

    def __init__(self, router: ShardRouter, shard: int, send: Callable[[int], PendingReply], sent: PendingReply,
                 wait: float | None = None) -> None:
        self._router, self._shard, self._send, self._sent, self._wait = router, shard, send, sent, wait

    def result(self) -> Frame:
        return self._router.gather({self._shard: self._sent}, self._send, wait=self._wait)[self._shard]


def _collect(calls: Mapping[int, PendingReply]) -> tuple[dict[int, Frame], dict[int, RpcError]]:
    replies: dict[int, Frame] = {}
    errors: dict[int, RpcError] = {}
    for shard, call in calls.items():
        try:
            replies[shard] = call.result()
        except RpcError as e:
            errors[shard] = e
    return replies, errors


def _said(status: ReplicaStatusReply | None) -> str:
    if status is None:
        return "no answer"
    return f"{status.role} at epoch {status.epoch}" + ("" if status.has_state else ", empty")


def resolve_all(router: ShardRouter, shards: Sequence[int], *, timeout: float) -> None:
    """Resolves every shard of ``shards`` at once (in parallel; e.g. at connect time), each within ``timeout`` s.

    Raises:
        TaskUnavailableError: a shard had no member able to serve it in time.
    """
    with futures.ThreadPoolExecutor(max(1, len(shards))) as pool:
        for f in [pool.submit(router.resolve, k, None, timeout=timeout) for k in shards]:
            f.result()
