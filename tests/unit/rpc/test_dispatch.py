"""psflow.rpc.api.dispatch: the one mapping of a handler's outcome to a status and the error text on the wire.

Pure calls, no sockets: the carriers (gRPC, TCP, in-process) only move what
dispatch returns; tests/unit/rpc/test_carrier_contract.py checks that they do.
"""

from __future__ import annotations

import pytest

from psflow.rpc.api import (
    STATUS_ERRORS,
    DeadlineExceededError,
    FailedPreconditionError,
    FencedOff,
    FencedOffError,
    InvalidArgumentError,
    InvalidRequest,
    PreconditionFailed,
    Refusal,
    RemoteError,
    Reply,
    Status,
    TaskUnavailableError,
    UnauthenticatedError,
    dispatch,
    refusal,
)
from psflow.rpc.framing import Frame, FrameError, decode, encode

pytestmark = pytest.mark.timeout(30)

TASK = "/job:ps/task:3"


def _echo(frame: Frame) -> Reply:
    return {"seen": frame.meta.get("x")}, dict(frame.arrays)


def _raising(error: BaseException):  # type: ignore[no-untyped-def]
    def handler(frame: Frame) -> Reply:
        raise error
    return handler


def _as_frame(meta, arrays) -> Frame:  # type: ignore[no-untyped-def]
    return Frame(dict(meta), dict(arrays))


def test_a_handlers_reply_goes_through_the_carriers_reply_function() -> None:
    out = dispatch(TASK, "Echo", _echo, Frame({"x": 7}, {}), _as_frame)
    assert out == Frame({"seen": 7}, {})


def test_an_encoded_request_is_decoded_and_the_reply_encoded() -> None:
    out = dispatch(TASK, "Echo", _echo, encode({"x": "y"}), encode)
    assert isinstance(out, bytes)
    assert decode(out).meta == {"seen": "y"}


@pytest.mark.parametrize(("error", "status", "text"), [
    (InvalidRequest("bad shape"), Status.INVALID_ARGUMENT, f"{TASK}: Push: bad shape"),
    (FrameError("truncated"), Status.INVALID_ARGUMENT, f"{TASK}: Push: truncated"),
    (PreconditionFailed("other layout"), Status.FAILED_PRECONDITION, f"{TASK}: Push: other layout"),
    (FencedOff("epoch 5 refused"), Status.ABORTED, f"{TASK}: Push: epoch 5 refused"),
    (KeyError("w"), Status.INTERNAL, f"{TASK}: Push: internal error: KeyError: 'w'"),
])
def test_each_error_becomes_one_status_and_a_text_naming_task_and_method(
        error: Exception, status: Status, text: str) -> None:
    out = dispatch(TASK, "Push", _raising(error), Frame(), _as_frame)
    assert out == Refusal(status, text)
    assert isinstance(out, Refusal) and out.cause is error
    assert refusal(TASK, "Push", error) == out


def test_an_unexpected_error_is_logged_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    dispatch(TASK, "Push", _raising(RuntimeError("boom")), Frame(), _as_frame)
    assert any(r.exc_info and f"{TASK}: Push failed" in r.getMessage() for r in caplog.records)


def test_a_refusal_is_not_logged_as_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    dispatch(TASK, "Push", _raising(InvalidRequest("bad")), Frame(), _as_frame)
    assert not caplog.records


def test_an_unknown_method_and_a_malformed_request_are_invalid_arguments() -> None:
    assert dispatch(TASK, "Nope", None, Frame(), _as_frame) == \
        Refusal(Status.INVALID_ARGUMENT, f"{TASK}: Nope: unknown method 'Nope'")
    out = dispatch(TASK, "Echo", _echo, b"not a frame", encode)
    assert isinstance(out, Refusal) and out.status is Status.INVALID_ARGUMENT
    assert out.text.startswith(f"{TASK}: Echo: ")


def test_an_error_of_the_reply_function_is_mapped_too() -> None:
    def failing(meta, arrays) -> bytes:  # type: ignore[no-untyped-def]
        raise TypeError("not JSON")
    out = dispatch(TASK, "Echo", _echo, Frame(), failing)
    assert out == Refusal(Status.INTERNAL, f"{TASK}: Echo: internal error: TypeError: not JSON")


def test_interrupts_are_not_swallowed() -> None:
    with pytest.raises(KeyboardInterrupt):
        dispatch(TASK, "Push", _raising(KeyboardInterrupt()), Frame(), _as_frame)


def test_the_caller_sees_the_rpc_error_of_each_status() -> None:
    assert {s: STATUS_ERRORS.get(s) for s in Status if s is not Status.OK} == {
        Status.INVALID_ARGUMENT: InvalidArgumentError, Status.FAILED_PRECONDITION: FailedPreconditionError,
        Status.UNAUTHENTICATED: UnauthenticatedError, Status.INTERNAL: RemoteError,
        Status.UNAVAILABLE: TaskUnavailableError, Status.DEADLINE_EXCEEDED: DeadlineExceededError,
        Status.ABORTED: FencedOffError,
    }
    error = Refusal(Status.FAILED_PRECONDITION, f"{TASK}: Push: other layout").error()
    assert type(error) is FailedPreconditionError and str(error) == f"{TASK}: Push: other layout"
    assert type(Refusal(Status.OK, "?").error()) is RemoteError  # no status of its own: the catch-all


def test_the_tcp_wire_keeps_its_status_bytes() -> None:
    """The TCP carrier sends Status values as one byte: they are psflow's wire, they must not move."""
    assert [(s.name, int(s)) for s in Status] == [
        ("OK", 0), ("INVALID_ARGUMENT", 1), ("FAILED_PRECONDITION", 2), ("UNAUTHENTICATED", 3), ("INTERNAL", 4),
        ("UNAVAILABLE", 5), ("DEADLINE_EXCEEDED", 6), ("ABORTED", 7)]
