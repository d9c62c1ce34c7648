"""What every message shares: the :func:`message` class decorator and the checked readers of one meta field.

Each reader raises :class:`~psflow.rpc.api.InvalidRequest` naming the field and
the value it got (cut to a few dozen characters). They never spell a key: the
messages pass theirs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from psflow.rpc.api import InvalidRequest

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**_: Any) -> Callable[[Any], Any]:
        return lambda decorator: decorator

__all__ = ["acked_counts", "flag", "list_field", "message", "optional_int", "optional_str", "refuse", "strict_bool", "string_map"]

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def message(cls: type[T]) -> type[T]:
    """Makes ``cls`` a message: a slotted dataclass, frozen for the type checker (``mypy --strict`` refuses
    any assignment to a field) and hashable.

    Not frozen at run time: a frozen dataclass sets each field through ``object.__setattr__`` and takes
    about four times as long to build, and a push builds a dozen messages on its way (client and ps);
    nothing in psflow assigns to one (the type check holds every module to that).
    """
    return dataclasses.dataclass(slots=True, unsafe_hash=True)(cls)


def refuse(key: str, want: str, value: Any) -> InvalidRequest:
    """The error for field ``key`` that is not ``want`` (e.g. ``a non-negative integer``)."""
    return InvalidRequest(f"{key!r} must be {want}, got {value!r:.60}")


def flag(meta: Mapping[str, Any], key: str) -> bool:
    """True only when the field is ``true`` (absent, null or anything else: False)."""
    return meta.get(key) is True


def strict_bool(meta: Mapping[str, Any], key: str, default: bool = False) -> bool:
    """A field that must be true or false when present."""
    value = meta.get(key, default)
    if not isinstance(value, bool):
        raise refuse(key, "true or false", value)
    return value


def list_field(meta: Mapping[str, Any], key: str) -> list[Any]:
    """A field that must be a list."""
    value = meta.get(key)
    if not isinstance(value, list):
        raise InvalidRequest(f"field {key!r} must be a list, got {value!r:.40}")
    return value


def optional_int(meta: Mapping[str, Any], key: str, *, minimum: int | None = None) -> int | None:
    """An integer field (not a bool) at least ``minimum``, or None when absent or null."""
    value = meta.get(key)
    if value is None or (type(value) is int and (minimum is None or value >= minimum)):  # (the hot path: one test)
        return value
    raise refuse(key, "an integer" if minimum is None else
                 "a non-negative integer" if minimum == 0 else f"an integer >= {minimum}", value)


def optional_str(meta: Mapping[str, Any], key: str, *, max_length: int | None = None) -> str | None:
    """A string field (at most ``max_length`` characters), or None when absent or null."""
    value = meta.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or (max_length is not None and len(value) > max_length):
        raise refuse(key, "a string" if max_length is None else f"a string of at most {max_length} characters", value)
    return value


def string_map(meta: Mapping[str, Any], key: str, what: str) -> dict[str, str] | None:
    """A field mapping strings to strings (``what`` says what the values are), or None when absent or null."""
    value = meta.get(key)
    if value is None:
        return None
    if not (isinstance(value, dict) and all(isinstance(v, str) for v in value.values())):
        raise InvalidRequest(f"{key} must map {what}")
    return dict(value)


def acked_counts(meta: Mapping[str, Any], key: str) -> tuple[int, ...] | None:
    """``meta[key]``: a client process's acknowledged pushes per shard, a list of non-negative integers in
    shard order (None when absent or null).

    Raises:
        InvalidRequest: any other value (names the field).
    """
    value = meta.get(key)
    if value is None:
        return None
    if not (type(value) is list and all(type(n) is int and n >= 0 for n in value)):
        raise refuse(key, "a list of non-negative integers (one per shard)", value)
    return tuple(value)
