"""Calls run side by side, each in a daemon thread of its own, their outcomes as futures (:func:`in_daemon_threads`).

A :class:`concurrent.futures.ThreadPoolExecutor`'s threads are joined when the interpreter exits (the module
registers that join), however the pool was left. A chief's save writes each ps task's shard side by side (with
``--checkpoint-transport rpc`` the chief writes the bytes itself), and a write stuck in an object store that
stopped answering never ends: once the save was given up (:mod:`psflow.checkpoint.bounded_save`) and the chief's
session ended, its process still never exited, waiting at exit for the pool thread. A daemon thread is never
waited for at exit; the caller still waits for every call as long as it chooses.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import TypeVar

__all__ = ["in_daemon_threads"]

K = TypeVar("K")
T = TypeVar("T")


def in_daemon_threads(calls: Mapping[K, Callable[[], T]], *, name: str) -> dict[K, Future[T]]:
    """Starts each of ``calls`` in a daemon thread (named ``name-<key>``); returns its future, by the same key.

    Does not block. A call's exception is its future's; nothing waits for a thread that never ends, the
    process's exit included.
    """
    started: dict[K, Future[T]] = {}
    for key, call in calls.items():
        future: Future[T] = Future()
        future.set_running_or_notify_cancel()
        threading.Thread(target=_run, args=(call, future), name=f"{name}-{key}", daemon=True).start()
        started[key] = future
    return started


def _run(call: Callable[[], T], future: Future[T]) -> None:
    try:
        future.set_result(call())
    except BaseException as e:  # noqa: BLE001 - the caller's to raise, through the future
        future.set_exception(e)
