"""The chief tells every ps task that it is saving a checkpoint, for as long as the save lasts.

In sync mode the chief's save holds the next step on every ps task (the other workers' gradients wait for the
chief's); the ps tasks let it, without the step's ``--sync-timeout`` running out, as long as these notices come
(:mod:`psflow.ps.save_hold`). :func:`notify_save` wraps a save:

1. on entering, a thread of its own asks ps task 0 (the step task) for global_step, then sends every ps task a
   ``SaveNotice`` (writer, directory, that step, active);
2. it sends the notice again within the ``renew_every`` seconds each task replied (a quarter of the sync
   timeout) until the save is over; a task that replied None (async, ssp: nothing to hold) gets no more;
3. on leaving (the save succeeded or failed), the thread is stopped and every task told gets the end notice.

Never fails the save: a notice that cannot be sent is logged (DEBUG; a dead ps task's save fails on its own)
and the next one is tried at the next renewal. The notices travel on channels of their own where the client
opened its own (a carrier's connection may serve one call at a time, and the save's calls use the client's),
on the client's in-process channels otherwise (called directly); with replicated ps shards none is sent (a
shard's primary moves, and the client's router belongs to its training thread): a save there holds a sync step
only up to ``--sync-timeout``, as before.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping

from psflow.errors import PsflowError
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import SaveNoticeReply, SaveNoticeRequest, StatsReply
from psflow.rpc.api import PARAMETER_SERVICE, Channel, RpcError
from psflow.rpc.inprocess import InProcessChannel
from psflow.rpc.registry import open_channel

__all__ = ["notify_save"]

log = logging.getLogger(__name__)

#: Seconds one notice may take (a notice is small; a ps task that does not answer in time is tried again later).
_CALL_TIMEOUT = 5.0


@contextlib.contextmanager
def notify_save(client: ParameterClient, directory: str) -> Iterator[None]:
    """Tells every ps task that ``client`` (the chief) saves into ``directory`` while the ``with`` block runs
    (see the module docstring). Blocks on leaving until the notice thread stopped (at most one notice's
    timeout) and the end notices were sent; raises nothing of its own."""
    sync = getattr(client, "sync", None)  # (a stand-in of the client, in tests, may have neither)
    if getattr(client, "router", None) is not None or sync is None or sync.mode != "sync":
        yield  # replicated shards (see the module docstring); async and ssp hold no step for a save
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
        self._step_task = client.step_task
        self._owned = not all(isinstance(c, InProcessChannel) for c in client.channels.values())
        self._channels: Mapping[int, Channel] = (
            {t: open_channel(client.config.transport, f"/job:ps/task:{t}", client.cluster.task_address("ps", t),
                             PARAMETER_SERVICE, client.config) for t in client.channels}
            if self._owned else dict(client.channels))
        self._step: int | None = None
        self._told: set[int] = set()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="psflow-save-notice", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=2 * _CALL_TIMEOUT + 1.0)
        if not self._thread.is_alive():
            self._send(sorted(self._told), active=False)
        if self._owned:
            for channel in self._channels.values():
                channel.close()

    def _run(self) -> None:
        try:
            self._step = StatsReply.from_frame(self._channels[self._step_task].call(
                "Stats", timeout=_CALL_TIMEOUT)).global_step
        except RpcError as e:
            log.debug("%s: save notice: global_step unknown: %s", self._writer, e)
        tasks = sorted(self._channels)
        while tasks and not self._stopped.is_set():
            renew = self._send(tasks, active=True)
            tasks = [t for t in tasks if renew.get(t, 1.0) is not None]
            every = [r for r in renew.values() if r is not None]
            self._stopped.wait(min(every) if every else 1.0)

    def _send(self, tasks: list[int], *, active: bool) -> dict[int, float | None]:
        """Sends the notice to ``tasks``; returns each answering task's ``renew_every``."""
        request = SaveNoticeRequest(self._writer, self._directory, self._step, active)
        calls = {}
        for t in tasks:
            try:
                calls[t] = self._channels[t].call_async(request.METHOD, request.to_frame().meta,
                                                        timeout=_CALL_TIMEOUT)
            except RpcError as e:
                log.debug("%s: save notice to /job:ps/task:%d not sent: %s", self._writer, t, e)
        renew: dict[int, float | None] = {}
        for t, call in calls.items():
            try:
                renew[t] = SaveNoticeReply.from_frame(call.result()).renew_every
            except RpcError as e:
                log.debug("%s: save notice to /job:ps/task:%d failed: %s", self._writer, t, e)
                continue
            if active and renew[t] is not None:
                self._told.add(t)
        return renew
