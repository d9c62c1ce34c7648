"""The chief tells every ps task that it is saving a checkpoint, for as long as the save lasts.

In sync mode the chief's save holds the next step on every ps task (the other workers' gradients wait for the
chief's), in ssp mode the workers its clock holds back (:mod:`psflow.ps.staleness`); the ps tasks let it,
without ``--sync-timeout`` running out, as long as these notices come (:mod:`psflow.ps.save_hold`). Async mode
sends none. :func:`notify_save` wraps a save:

1. on entering, a thread of its own sends every ps task a ``SaveNotice`` (writer and its process, the save's id
   among that process's saves, directory, the newest global_step the chief pulled, active, the save's bound
   ``--save-timeout``) at once, then asks ps task 0 (the step task) for global_step, in another thread, which the
   next notices carry: a slow ``Stats`` never delays a notice past a step's timeout;
2. it sends the notice again within the ``renew_every`` seconds each task replied (a quarter of the sync
   timeout) until the save is over, or until ``--save-timeout`` after its start: a save stuck in storage longer
   than that holds no step (the ps tasks let a step time out ``--sync-timeout`` after it, and the error names the
   save and the flag, :mod:`psflow.ps.save_hold`), so the run fails instead of hanging; a task that replied
   None (in ssp mode every task but the one holding global_step: nothing to hold) gets no more;
3. on leaving (the save succeeded or failed), the thread is stopped and every task told gets the end notice;
   if the thread does not stop in time (a call stuck past its deadline, e.g. an in-process task that does not
   answer), every task gets it all the same, from a thread of its own whose answers the save's end waits for no
   longer than for the notice thread, and the notice thread sends no active notice once the save is over. A
   renewal already in flight may still reach a task after the end notice: the save's id makes the task ignore it
   (it reopened the save, which then held that task's steps up to ``--save-timeout``).

Never fails the save: a notice that cannot be sent is logged (DEBUG; a dead ps task's save fails on its own)
and the next one is tried at the next renewal. The notices travel on channels of their own where the client
opened its own (a carrier's connection may serve one call at a time, and the save's calls use the client's),
on the client's in-process channels otherwise (called directly). With replicated ps shards every member of
every shard is told (a shard's primary moves, and the client's router belongs to its training thread): the
backups record the save as the primary does, so a backup promoted during a save holds the step as well.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import threading
import time
from collections.abc import Iterator, Mapping

from psflow.cluster.replicas import member_address, shard_members
from psflow.errors import PsflowError
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import SaveNoticeReply, SaveNoticeRequest, StatsReply
from psflow.rpc.api import PARAMETER_SERVICE, Channel, RpcError
from psflow.rpc.inprocess import InProcessChannel
from psflow.rpc.registry import open_channel

__all__ = ["notify_save"]

log = logging.getLogger(__name__)

#: The saves' ids of this process (its incarnation): each save's notices carry the next (:mod:`psflow.ps.save_hold`).
_SAVE_IDS = itertools.count(1)

#: Seconds one notice may take (a notice is small; a ps task that does not answer in time is tried again later).
_CALL_TIMEOUT = 5.0


@contextlib.contextmanager
def notify_save(client: ParameterClient, directory: str) -> Iterator[None]:
    """Tells every ps task that ``client`` (the chief) saves into ``directory`` while the ``with`` block runs
    (see the module docstring). Blocks on leaving until the notice thread stopped (at most one notice's
    timeout) and the end notices were sent; raises nothing of its own."""
    sync = getattr(client, "sync", None)  # (a stand-in of the client, in tests, may have neither)
    if sync is None or sync.mode == "async":
        yield  # async holds nothing for a save
        return
    try:
        notices = _Notices(client, directory)
    except (PsflowError, OSError) as e:  # channels not opened: the save goes on without notices
        log.warning("%s: the ps tasks are not told of this save (a sync step may time out during it): %s",
                    client.client_name, e)
        yield
        return
    notices.start()
    try:
        yield
    finally:
        notices.stop()


class _Notices:
    """The notice thread of one save."""

    def __init__(self, client: ParameterClient, directory: str) -> None:
        self._writer, self._directory = client.client_name, directory
        self._incarnation = client.incarnation
        self._save_id = next(_SAVE_IDS)  # this save's, among this process's: a late renewal of it reopens nothing
        self._bound = client.config.save_timeout
        self._owned = not all(isinstance(c, InProcessChannel) for c in client.channels.values())
        # Each ps task by name; a replicated shard's every member (its first: the task of that number).
        self._step_task = f"/job:ps/task:{client.step_task}"
        names = {f"/job:ps/task:{t}": t for t in client.channels}
        if client.router is not None:
            names = {m: t for t in client.channels for m in shard_members(client.cluster, t)}
        self._channels: Mapping[str, Channel] = (
            {m: open_channel(client.config.transport, m, member_address(client.cluster, m), PARAMETER_SERVICE,
                             client.config) for m in names}
            if self._owned else {m: client.channels[t] for m, t in names.items()})
        self._step: int | None = client.last_pull_step  # (the save's own step, from Stats, once known)
        self._told: set[str] = set()
        self._call_timeout = _CALL_TIMEOUT  # at most the renewal period: a dead member delays no renewal
        self._stopped = threading.Event()
        self._outlived = threading.Event()  # the thread outlived the save's end (stop's join)
        self._thread = threading.Thread(target=self._run, name="psflow-save-notice", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        bound = 2 * _CALL_TIMEOUT + 1.0
        self._thread.join(timeout=bound)
        if not self._thread.is_alive():
            self._send(sorted(self._told), active=False)
        else:  # (a call stuck past its deadline): it sends no active notice from now on
            self._outlived.set()
            # The end notice even then: without it a told task held its steps for a save that is over (until its
            # bound). A task whose first answer has not come yet may have taken that notice: told too. Sent from a
            # thread of its own, waited for as long as the join: a task that answers nothing (an in-process one's
            # call runs in the calling thread, its deadline unheeded) would keep the save from ending.
            ending = threading.Thread(target=functools.partial(self._send, sorted(self._channels), active=False),
                                      name="psflow-save-notice-end", daemon=True)
            ending.start()
            ending.join(timeout=bound)
        if self._owned:
            for channel in self._channels.values():
                channel.close()

    def _run(self) -> None:
        started = time.monotonic()
        tasks = sorted(self._channels)
        asked = False
        while tasks and not self._stopped.is_set():
            left = started + self._bound - time.monotonic()
            if left <= 0:
                log.warning("%s: the checkpoint save into %s has lasted longer than --save-timeout (%g s): the ps "
                            "tasks are no longer told of it, and a sync step waiting for this worker times out "
                            "--sync-timeout later", self._writer, self._directory, self._bound)
                return
            renew = self._send(tasks, active=True)
            tasks = [t for t in tasks if renew.get(t, 1.0) is not None]
            if not asked and self._step_task in self._channels:  # after the first notices, never before them
                asked = True  # (a thread of its own: a slow answer delays no renewal)
                threading.Thread(target=self._ask_step, name="psflow-save-notice-step", daemon=True).start()
            every = [r for r in renew.values() if r is not None]
            self._call_timeout = min([_CALL_TIMEOUT, *every])
            self._stopped.wait(min(min(every) if every else 1.0, left))

    def _ask_step(self) -> None:
        """Sets the global_step the next notices carry to ps task 0's (the save's own step)."""
        try:
            self._step = StatsReply.from_frame(self._channels[self._step_task].call(
                "Stats", timeout=_CALL_TIMEOUT)).global_step
        except (PsflowError, ValueError) as e:  # (RpcError; a channel closed by the save's end)
            log.debug("%s: save notice: global_step unknown: %s", self._writer, e)

    def _send(self, tasks: list[str], *, active: bool) -> dict[str, float | None]:
        """Sends the notice to ``tasks``; returns each answering task's ``renew_every``."""
        request = SaveNoticeRequest(self._writer, self._directory, self._step, active, self._bound,
                                    self._incarnation, self._save_id)
        calls = {}
        for t in tasks:
            if active and self._outlived.is_set():
                break  # its end notice is sent (or about to be): never an active one after it
            try:
                calls[t] = self._channels[t].call_async(request.METHOD, request.to_frame().meta,
                                                        timeout=self._call_timeout)
            except RpcError as e:
                log.debug("%s: save notice to %s not sent: %s", self._writer, t, e)
        renew: dict[str, float | None] = {}
        for t, call in calls.items():
            try:
                renew[t] = SaveNoticeReply.from_frame(call.result()).renew_every
            except RpcError as e:
                log.debug("%s: save notice to %s failed: %s", self._writer, t, e)
                continue
            if active and renew[t] is not None:
                self._told.add(t)
        return renew
