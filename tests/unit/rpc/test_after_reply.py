"""Work a handler leaves for after its reply (psflow/rpc/after_reply.py): the TCP carrier runs it in the
connection's thread once the reply is sent and before that connection's next call; gRPC and in-process
callers see the handler do it before replying (nothing is deferred there). Served on 127.0.0.1 in this
process, as tests/unit/rpc/test_carrier_contract.py serves its carriers."""

from __future__ import annotations

import threading
import time

import pytest

from psflow.rpc import after_reply
from psflow.rpc.api import CarrierServer, Channel, ConnectConfig, Handler, Reply, ServeConfig
from psflow.rpc.framing import Frame
from psflow.rpc.inprocess import InProcessChannel
from psflow.rpc.registry import open_channel, serve
from psflow.rpc.tcp import TCP_PORT_KEY, TRANSPORT_METHOD

pytestmark = pytest.mark.timeout(60)

TASK, SERVICE, TOKEN = "/job:ps/task:0", "psflow.AfterReplyTest", "after-reply-token"


class Recorder:
    """A handler that defers writing its call's number; ``release`` lets the deferred write go on."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.release = threading.Event()
        self.deferred = threading.Event()

    def handler(self, frame: Frame) -> Reply:
        n = frame.meta["n"]
        self.events.append(f"call {n}")

        def later() -> None:
            self.deferred.set()
            self.release.wait(10)
            self.events.append(f"after reply {n}")
            if n == 2:
                raise RuntimeError("a deferred failure is logged, not sent")
        if not after_reply.defer(later):
            later()
        return {"n": n, "deferred": after_reply.deferrable()}, {}


def _tcp(handlers: dict[str, Handler]) -> tuple[CarrierServer, CarrierServer, Channel]:
    tcp = serve("tcp", ServeConfig(TASK, "127.0.0.1:0", {SERVICE: handlers}, token=TOKEN))
    tcp.start()
    where: Handler = lambda frame: ({TCP_PORT_KEY: tcp.port}, {})  # noqa: E731
    grpc = serve("grpc", ServeConfig(TASK, "127.0.0.1:0", {SERVICE: {TRANSPORT_METHOD: where}}, token=TOKEN))
    grpc.start()
    channel = open_channel("tcp", TASK, f"127.0.0.1:{grpc.port}", SERVICE,
                           ConnectConfig(connect_timeout=30, rpc_timeout=30, token=TOKEN))
    return tcp, grpc, channel


def test_tcp_runs_the_work_after_the_reply_and_before_the_connections_next_call() -> None:
    recorder = Recorder()
    tcp, grpc, channel = _tcp({"Record": recorder.handler})
    try:
        reply = channel.call("Record", {"n": 1}, timeout=10)
        assert reply.meta == {"n": 1, "deferred": True}
        assert recorder.deferred.wait(10)
        assert recorder.events == ["call 1"]  # replied, the work not done yet

        second: list[Frame] = []
        caller = threading.Thread(target=lambda: second.append(channel.call("Record", {"n": 2}, timeout=10)))
        caller.start()
        caller.join(0.3)
        assert recorder.events == ["call 1"]  # the next call waits for the work of the one before
        recorder.release.set()
        caller.join(10)
        assert second and second[0].meta["n"] == 2
        third = channel.call("Record", {"n": 3}, timeout=10)
        assert third.meta["n"] == 3  # call 2's work raised: logged, the connection serves on
        assert recorder.events[:4] == ["call 1", "after reply 1", "call 2", "after reply 2"]
    finally:
        channel.close()
        tcp.stop(0)
        grpc.stop(0)


def test_in_process_the_handler_does_the_work_before_replying() -> None:
    recorder = Recorder()
    recorder.release.set()
    reply = InProcessChannel(TASK, {"Record": recorder.handler}).call("Record", {"n": 1})
    assert reply.meta == {"n": 1, "deferred": False}
    assert recorder.events == ["call 1", "after reply 1"]


def test_the_work_can_tell_whether_the_connections_next_request_has_arrived() -> None:
    """What a backup's applier asks before it writes entries kept for later (applier.py): over TCP, False while
    the client sends nothing, True once the next call's request waits unread; elsewhere always False."""
    seen: list[bool] = []
    looked, release = threading.Event(), threading.Event()

    def handler(frame: Frame) -> Reply:
        def later() -> None:
            seen.append(after_reply.request_waiting())
            looked.set()
            release.wait(10)
            deadline = time.monotonic() + 30  # until call 2's bytes are in this end's buffer
            while not after_reply.request_waiting() and time.monotonic() < deadline:
                time.sleep(0.01)
            seen.append(after_reply.request_waiting())
        if frame.meta["n"] == 1:
            after_reply.defer(later)
        return {"n": frame.meta["n"]}, {}
    tcp, grpc, channel = _tcp({"Call": handler})
    try:
        assert channel.call("Call", {"n": 1}, timeout=10).meta == {"n": 1}
        assert looked.wait(10)
        second: list[Frame] = []
        caller = threading.Thread(target=lambda: second.append(channel.call("Call", {"n": 2}, timeout=40)))
        caller.start()
        release.set()
        caller.join(40)
        assert second and second[0].meta == {"n": 2}
        assert seen == [False, True]
    finally:
        channel.close()
        tcp.stop(0)
        grpc.stop(0)
    assert not after_reply.request_waiting()  # no carrier's call in this thread
