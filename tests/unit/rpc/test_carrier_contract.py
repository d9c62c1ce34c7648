"""The carrier contract: the same calls and refusals, with the same error text, over every carrier.

:class:`CarrierContract` is the mixin; each subclass says how to reach a set
of handlers over one carrier (gRPC and TCP through
:mod:`psflow.rpc.registry`, served on 127.0.0.1 in this process; in-process
directly). A new carrier gets a subclass here and passes the same cases.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping

import numpy as np
import pytest

from psflow.rpc.api import (
    Channel,
    ConnectConfig,
    FailedPreconditionError,
    FencedOff,
    FencedOffError,
    Handler,
    InvalidArgumentError,
    InvalidRequest,
    PreconditionFailed,
    RemoteError,
    Reply,
    RpcError,
    ServeConfig,
    UnauthenticatedError,
    gather,
)
from psflow.rpc.framing import Frame, FrameError
from psflow.rpc.inprocess import InProcessChannel
from psflow.rpc.registry import open_channel, serve
from psflow.rpc.tcp import TCP_PORT_KEY, TRANSPORT_METHOD

pytestmark = pytest.mark.timeout(60)

TASK = "/job:ps/task:0"
SERVICE = "psflow.ContractTest"
TOKEN = "contract-token"


def _echo(frame: Frame) -> Reply:
    return {"seen": frame.meta, "names": sorted(frame.arrays)}, {k: v * 2 for k, v in frame.arrays.items()}


def _bad(frame: Frame) -> Reply:
    raise InvalidRequest(f"field 'x' must be an integer, got {frame.meta.get('x')!r}")


def _conflict(frame: Frame) -> Reply:
    raise PreconditionFailed("another client registered a different layout")


def _fenced_off(frame: Frame) -> Reply:
    raise FencedOff("write from chief A with epoch 5 refused: 'chief' is fenced at epoch 9 (by chief B)")


def _malformed(frame: Frame) -> Reply:
    raise FrameError("array 'g/w' has 3 rows, ids 2")


def _boom(frame: Frame) -> Reply:
    raise RuntimeError("boom")


HANDLERS: dict[str, Handler] = {"Echo": _echo, "Bad": _bad, "Conflict": _conflict, "Malformed": _malformed,
                                "Boom": _boom, "FencedOff": _fenced_off}


class CarrierContract:
    """Cases every carrier passes; a subclass implements :meth:`open`."""

    #: Whether the carrier checks the cluster token (every network carrier does).
    checks_token = True
    #: What an unknown method raises: gRPC answers UNIMPLEMENTED itself (RemoteError), before any dispatch.
    unknown_method_error: type[RpcError] = InvalidArgumentError

    def open(self, stack: contextlib.ExitStack, handlers: Mapping[str, Handler], *,
             client_token: str | None = TOKEN) -> Channel:
        """Serves ``handlers`` (token TOKEN) and returns a channel to them; ``stack`` closes both."""
        raise NotImplementedError

    @pytest.fixture
    def channel(self) -> Iterator[Channel]:
        with contextlib.ExitStack() as stack:
            ch = self.open(stack, HANDLERS)
            ch.wait_ready(30)
            yield ch

    def test_meta_and_arrays_travel_both_ways(self, channel: Channel) -> None:
        values = np.arange(6, dtype=np.float32).reshape(2, 3)
        ids = np.array([5, 1 << 40], dtype=np.int64)
        reply = channel.call("Echo", {"x": 1, "name": "w"}, {"v": values, "ids": ids})
        assert reply.meta == {"seen": {"x": 1, "name": "w"}, "names": ["ids", "v"]}
        np.testing.assert_array_equal(reply.arrays["v"], values * 2)
        np.testing.assert_array_equal(reply.arrays["ids"], ids * 2)
        assert reply.arrays["v"].dtype == np.float32 and reply.arrays["ids"].dtype == np.int64

    def test_a_frame_of_many_arrays_and_a_big_one_travel_both_ways(self, channel: Channel) -> None:
        """More arrays than a ``sendmsg`` takes buffers (IOV_MAX, 1024, counting each array's padding), of odd
        byte lengths and none, and one array of 8 MiB (sent in several pieces by the kernel): the same bytes."""
        rng = np.random.default_rng(7)
        arrays = {f"a/{i}": rng.integers(0, 255, size=i % 13, dtype=np.uint8) for i in range(1500)}
        arrays["big"] = rng.normal(size=(1 << 21,)).astype(np.float32)
        reply = channel.call("Echo", {"n": len(arrays)}, arrays)
        assert reply.meta["names"] == sorted(arrays)
        for name, array in arrays.items():
            np.testing.assert_array_equal(reply.arrays[name], array * 2, err_msg=name)

    def test_a_call_in_flight_is_collected_and_its_refusal_raised_there(self, channel: Channel) -> None:
        """(One call in flight per channel: the TCP carrier serves one at a time per connection.)"""
        for i in range(3):
            assert gather({i: channel.call_async("Echo", {"i": i})})[i].meta["seen"] == {"i": i}
        pending = channel.call_async("Conflict")  # a refusal is raised by result(), not by call_async
        with pytest.raises(FailedPreconditionError):
            pending.result()

    def test_an_invalid_request_is_invalid_argument_naming_task_and_method(self, channel: Channel) -> None:
        with pytest.raises(InvalidArgumentError) as e:
            channel.call("Bad", {"x": "seven"})
        assert str(e.value) == f"{TASK}: Bad: field 'x' must be an integer, got 'seven'"

    def test_a_malformed_frame_is_invalid_argument(self, channel: Channel) -> None:
        with pytest.raises(InvalidArgumentError) as e:
            channel.call("Malformed")
        assert str(e.value) == f"{TASK}: Malformed: array 'g/w' has 3 rows, ids 2"

    def test_a_conflict_with_state_is_failed_precondition(self, channel: Channel) -> None:
        with pytest.raises(FailedPreconditionError) as e:
            channel.call("Conflict")
        assert str(e.value) == f"{TASK}: Conflict: another client registered a different layout"

    def test_a_write_fenced_off_is_its_own_refusal_and_still_a_failed_precondition(self, channel: Channel) -> None:
        """A fencing token refused (a newer leader's epoch seen) travels as its own status, so a caller tells it
        from any other conflict without reading the text; a caller catching FailedPreconditionError still gets it."""
        with pytest.raises(FencedOffError) as e:
            channel.call("FencedOff")
        assert isinstance(e.value, FailedPreconditionError)
        assert str(e.value) == (f"{TASK}: FencedOff: write from chief A with epoch 5 refused: 'chief' is fenced at "
                                "epoch 9 (by chief B)")
        with pytest.raises(FailedPreconditionError) as other:
            channel.call("Conflict")
        assert not isinstance(other.value, FencedOffError)

    def test_an_unexpected_error_is_a_remote_error_and_the_carrier_serves_on(self, channel: Channel) -> None:
        with pytest.raises(RemoteError, match=f"{TASK}: Boom: internal error: RuntimeError: boom"):
            channel.call("Boom")
        assert channel.call("Echo", {"after": True}).meta["seen"] == {"after": True}

    def test_an_unknown_method_is_refused_naming_task_and_method(self, channel: Channel) -> None:
        with pytest.raises(self.unknown_method_error) as e:
            channel.call("NoSuchMethod")
        assert str(e.value).startswith(f"{TASK}: NoSuchMethod: ")
        assert channel.call("Echo").meta["seen"] == {}

    def test_a_channel_closed_right_after_wait_ready_leaves_no_thread_that_raises(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A short-lived client (wait, close at once) is clean: gRPC's ``channel_ready_future`` left a
        connectivity poller running that raised ``ValueError: Channel closed!`` after the close (a traceback in
        the task's log, a PytestUnhandledThreadExceptionWarning here); waiting twice made it certain."""
        raised: list[str] = []
        monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(f"{args.thread}: {args.exc_value!r}"))
        with contextlib.ExitStack() as stack:
            ch = self.open(stack, HANDLERS)
            before = set(threading.enumerate())
            ch.wait_ready(30)
            ch.wait_ready(30)
            ch.close()
            started = set(threading.enumerate()) - before
        for thread in started:  # what the waits started (either side) ends with the channel and the server
            _join(thread, 30.0)
        assert raised == []

    def test_a_wrong_token_is_refused_and_runs_nothing(self) -> None:
        if not self.checks_token:
            pytest.skip("no token on this carrier (nothing leaves the process)")
        ran = threading.Event()

        def spy(frame: Frame) -> Reply:
            ran.set()
            return {}, {}

        with contextlib.ExitStack() as stack:
            ch = self.open(stack, {"Spy": spy}, client_token="wrong")
            with pytest.raises(UnauthenticatedError, match=f"{TASK}: .*missing or wrong cluster token"):
                ch.call("Spy")
        assert not ran.is_set()


def _join(thread: threading.Thread, bound_s: float) -> None:
    """Joins ``thread``, one that may still be starting (listed, not yet running); fails past ``bound_s``."""
    deadline = time.monotonic() + bound_s
    while True:
        try:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
            break
        except RuntimeError:  # "cannot join thread before it is started": it is about to run
            assert time.monotonic() < deadline, f"{thread} never started"
            time.sleep(0.01)
    assert not thread.is_alive(), f"{thread} still runs {bound_s:.0f} s after the channel and server closed"


def _connect(client_token: str | None) -> ConnectConfig:
    return ConnectConfig(connect_timeout=30, rpc_timeout=30, token=client_token)


class TestGrpcCarrier(CarrierContract):
    unknown_method_error = RemoteError

    def open(self, stack: contextlib.ExitStack, handlers: Mapping[str, Handler], *,
             client_token: str | None = TOKEN) -> Channel:
        server = serve("grpc", ServeConfig(TASK, "127.0.0.1:0", {SERVICE: handlers}, token=TOKEN))
        server.start()
        stack.callback(server.stop, 0)
        ch = open_channel("grpc", TASK, f"127.0.0.1:{server.port}", SERVICE, _connect(client_token))
        stack.callback(ch.close)
        return ch


class TestTcpCarrier(CarrierContract):
    def open(self, stack: contextlib.ExitStack, handlers: Mapping[str, Handler], *,
             client_token: str | None = TOKEN) -> Channel:
        tcp = serve("tcp", ServeConfig(TASK, "127.0.0.1:0", {SERVICE: handlers}, token=TOKEN))
        tcp.start()
        stack.callback(tcp.stop, 0)
        # As a ps task: its gRPC server says where the TCP carrier listens.
        where: Handler = lambda frame: ({TCP_PORT_KEY: tcp.port}, {})  # noqa: E731
        grpc = serve("grpc", ServeConfig(TASK, "127.0.0.1:0", {SERVICE: {TRANSPORT_METHOD: where}}, token=TOKEN))
        grpc.start()
        stack.callback(grpc.stop, 0)
        ch = open_channel("tcp", TASK, f"127.0.0.1:{grpc.port}", SERVICE, _connect(client_token))
        stack.callback(ch.close)
        return ch


class TestInProcessCarrier(CarrierContract):
    checks_token = False

    def open(self, stack: contextlib.ExitStack, handlers: Mapping[str, Handler], *,
             client_token: str | None = TOKEN) -> Channel:
        return InProcessChannel(TASK, handlers)

    def test_arrays_are_not_copied(self) -> None:
        """The in-process fast path: the handler gets the caller's arrays and the caller gets the handler's."""
        sent = np.zeros(4, dtype=np.float32)
        kept = np.ones(2, dtype=np.float32)

        def swap(frame: Frame) -> Reply:
            assert frame.arrays["a"] is sent
            return {}, {"b": kept}

        assert InProcessChannel(TASK, {"Swap": swap}).call("Swap", arrays={"a": sent}).arrays["b"] is kept

    def test_an_unexpected_error_keeps_its_cause(self) -> None:
        with pytest.raises(RemoteError) as e:
            InProcessChannel(TASK, HANDLERS).call("Boom")
        assert isinstance(e.value.__cause__, RuntimeError)
