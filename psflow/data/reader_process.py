"""Reading and parsing in a child process, batches handed over through shared memory.

A :class:`Prefetcher` thread overlaps parsing with training only where numpy
releases the GIL, which little of the parsing does: on one host the two
share a core. :class:`ReaderProcess` runs the same generator in a forked child
process instead, so parsing runs on another core, and hands each batch's
arrays over through a ring of ``depth`` slots in one anonymous shared mapping
(created before the fork, so no file in ``/dev/shm`` is left behind if either
side is killed). Only small control messages (slot, array layout, the item's
other fields) go through pipes.

Protocol (child = producer, parent = consumer):
    1. the child takes a free slot (all are free at the start; later it waits
       for the parent to hand one back through the ``free`` pipe), writes the
       item's arrays into it and sends ``("slot", index, layout, rest)``;
       an item whose arrays do not fit a slot is pickled whole through the
       pipe instead (``("inline", item)``): slower, never wrong;
    2. the parent copies the arrays out of the slot, hands the slot back and
       returns the item;
    3. at the end the child sends ``("end",)``; if the generator raised,
       ``("error", exception)`` (a :class:`DataError` naming the original when
       the exception cannot be pickled).

Guarantees:
    * Items arrive in the generator's order, each exactly once; at most
      ``depth`` items are parsed ahead of the consumer.
    * An exception in the generator is raised again by the :meth:`get` that
      would have returned the next item (same type and message; not the same
      object), and by every later call.
    * If the child dies (killed, crashed), :meth:`get` raises
      :class:`DataError` naming its pid and exit code, never hangs.
    * If the parent dies, the child sees its pipes close and exits.
    * :meth:`close` is idempotent and returns within about ``join_timeout_s``:
      it closes the pipes (the child exits at its next message), then
      terminates and finally kills the child by its pid.

Non-guarantees: the generator runs in the child, so side effects it has on
objects (counters, caches) stay there; callers pass what they need through
the items. Linux/Unix only (``fork``); the caller's threads are not copied,
so the generator must not rely on locks another thread may hold at the fork.
Not for a process where gRPC runs (a channel or server open, its threads
alive): gRPC is not fork-safe, and a child forked then dies of SIGSEGV about
every other time. :meth:`ReaderProcess.start` refuses with :class:`DataError`
while gRPC's threads run here (:func:`grpc_threads`); fork before the first
channel, or read in a thread. psflow forks a reader only in the in-process fast
path, which opens no gRPC channel or server; a cluster worker refuses
``reader_process`` before it connects.

:meth:`get` is for one consumer thread; :meth:`close` may be called from any thread.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import pickle
import select
import sys
import threading
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any, Generic, TypeVar

import numpy as np

from psflow.data.api import DataError
from psflow.waits import wait_woken

__all__ = ["ReaderProcess", "Split", "SLOT_BYTES", "grpc_threads"]

T = TypeVar("T")

#: Bytes per slot: a 512-example batch with 39 ids each needs ~250 KB; larger batches fall back to the pipe.
SLOT_BYTES = 4 << 20
_ALIGN = 64

#: How gRPC's core names its threads (Linux truncates a name to 15 characters): its event engine's pool and
#: that pool's lifeguard, its timer thread, and the executors of older releases.
_GRPC_THREAD_NAMES = ("event_engine", "lifeguard", "grpc", "default-executo", "resolver-execut")

#: Splits an item into (arrays to share, everything else) and rebuilds it.
Split = tuple[Callable[[T], tuple[list[np.ndarray], Any]], Callable[[list[np.ndarray], Any], T]]
_Layout = list[tuple[int, str, tuple[int, ...]]]  # (offset in slot, dtype, shape) per array


class ReaderProcess(Generic[T]):
    """Runs ``make()`` in a forked child process, at most ``depth`` items ahead of the consumer.

    Args:
        make: called in the child; returns the items' iterator.
        depth: slots in the ring (>= 1).
        split: ``(take_apart, rebuild)``: ``take_apart(item)`` returns the
            arrays to pass through shared memory and a picklable rest;
            ``rebuild(arrays, rest)`` makes the item again in the parent
            (it gets fresh copies of the arrays, owned by the item).
        name: the child process's name (for ``ps`` and error messages).
        start: fork the child now (otherwise at the first :meth:`get`).
        slot_bytes: capacity of one slot.
        join_timeout_s: how long :meth:`close` waits at each stage.
    """

    def __init__(self, make: Callable[[], Iterator[T]], depth: int, split: Split[T], *, name: str, start: bool,
                 slot_bytes: int = SLOT_BYTES, join_timeout_s: float = 2.0) -> None:
        if depth < 1:
            raise ValueError(f"reader process depth ({depth}) must be >= 1")
        if slot_bytes < _ALIGN:
            raise ValueError(f"slot_bytes ({slot_bytes}) must be >= {_ALIGN}")
        self._make = make
        self._take_apart, self._rebuild = split
        self._depth = depth
        self._slot_bytes = slot_bytes
        self._name = name
        self._join_timeout_s = join_timeout_s
        self._lock = threading.Lock()
        self._process: Any = None  # multiprocessing's fork Process (untyped)
        self._items: Connection | None = None
        self._free: Connection | None = None
        self._readable: select.poll | None = None  # the items pipe's read end, for get()'s waits
        self._ring: mmap.mmap | None = None
        self._final: BaseException | None = None
        self._ended = False
        self._closed = False
        if start:
            self.start()

    @property
    def pid(self) -> int | None:
        """The child's pid once started (None before)."""
        return None if self._process is None else int(self._process.pid)

    def start(self) -> None:
        """Forks the child if not yet started.  Idempotent.

        Raises:
            DataError: the reader process was closed, or gRPC runs in this process (see the module docstring).
        """
        with self._lock:
            if self._closed:
                raise DataError("the reader process was closed")
            if self._process is not None:
                return
            running = grpc_threads()
            if running:
                raise DataError(f"cannot fork the reader process {self._name}: gRPC runs in this process "
                                f"({len(running)} threads: {', '.join(sorted(set(running)))}) and is not fork-safe "
                                "(the child would die of SIGSEGV); start the reader before the first gRPC channel "
                                "or server, or read without reader_process")
            ctx = multiprocessing.get_context("fork")
            self._ring = mmap.mmap(-1, self._depth * self._slot_bytes)
            items_recv, items_send = ctx.Pipe(duplex=False)
            free_recv, free_send = ctx.Pipe(duplex=False)
            process = ctx.Process(target=self._child, name=self._name, daemon=True,
                                  args=(items_send, free_recv, (items_recv, free_send)))
            process.start()
            items_send.close()  # the child's ends: the parent keeps none, so the child's death reads as EOF
            free_recv.close()
            readable = select.poll()
            readable.register(items_recv.fileno(), select.POLLIN)
            self._process, self._items, self._free, self._readable = process, items_recv, free_send, readable

    # ---- child -------------------------------------------------------------
    def _child(self, out: Connection, free: Connection, parent_ends: tuple[Connection, Connection]) -> None:
        for conn in parent_ends:
            conn.close()  # so the parent's death closes the pipes for good
        ring = self._ring
        if ring is None:  # pragma: no cover - set before the fork
            return
        free_slots = list(range(self._depth))
        items: Iterator[T] | None = None
        try:
            items = self._make()
            for item in items:
                arrays, rest = self._take_apart(item)
                layout = _layout(arrays, self._slot_bytes)
                if layout is None:
                    out.send(("inline", item))
                    continue
                if not free_slots:
                    free_slots.append(free.recv())  # EOFError when the parent is gone or closed
                slot = free_slots.pop()
                base = slot * self._slot_bytes
                for (offset, _, _), array in zip(layout, arrays, strict=True):
                    view = np.ndarray(array.shape, array.dtype, buffer=ring, offset=base + offset)
                    view[...] = array
                out.send(("slot", slot, layout, rest))
            out.send(("end",))
        except (EOFError, BrokenPipeError, OSError):
            return  # the parent went away or closed: nothing to report to
        except BaseException as e:  # noqa: BLE001 - handed to the parent, which raises it
            try:
                out.send(("error", _picklable(e)))
            except (EOFError, BrokenPipeError, OSError):
                return
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001 - best effort while exiting
                    pass

    # ---- parent ------------------------------------------------------------
    def get(self) -> T:
        """Returns the next item; blocks until the child has produced it, in waits of
        :data:`~psflow.waits.WAKE_EVERY` s: a signal the kernel handed to another thread of a process waiting here
        on its main thread (``psflow train --in-process``) ran the handler only when the next item came, and from a
        reader stuck on its input (a store that stopped answering) never.

        Raises:
            StopIteration: the generator is exhausted.
            DataError: closed, or the child died without a word.
            BaseException: what the generator raised (re-created from a pickle).
        """
        if self._final is not None:
            raise self._final
        if self._ended:
            raise StopIteration
        self.start()
        items, free, ring, readable = self._items, self._free, self._ring, self._readable
        if items is None or free is None or ring is None or readable is None or self._closed:
            raise DataError("the reader process was closed")
        try:
            # (the main thread's signal handlers run meanwhile: psflow.waits). A poll object made once, not
            # Connection.poll, which builds a selector at each call: +35 us of CPU per batch, +60% of get()'s own.
            wait_woken(lambda timeout: bool(readable.poll(timeout * 1000.0)))
            message = items.recv()
        except (EOFError, OSError) as e:
            if self._closed:
                raise DataError("the reader process was closed") from None
            self._final = DataError(f"the reader process {self._name} (pid {self.pid}) died: {self._exit_text()}")
            raise self._final from e
        kind = message[0]
        if kind == "slot":
            _, slot, layout, rest = message
            base = slot * self._slot_bytes
            arrays = [np.ndarray(shape, np.dtype(dtype), buffer=ring, offset=base + offset).copy()
                      for offset, dtype, shape in layout]
            try:
                free.send(slot)
            except (BrokenPipeError, OSError):
                pass  # the child is gone; its death shows at the next recv
            return self._rebuild(arrays, rest)
        if kind == "inline":
            item: T = message[1]
            return item
        if kind == "end":
            self._ended = True
            raise StopIteration
        error = message[1]
        self._final = error if isinstance(error, BaseException) else DataError(f"reader process failed: {error!r:.200}")
        raise self._final

    def _exit_text(self) -> str:
        process = self._process
        if process is None:
            return "never started"
        process.join(timeout=self._join_timeout_s)
        code = process.exitcode
        return "still running" if code is None else f"exit code {code}"

    def close(self) -> None:
        """Stops the child and frees the ring.  Idempotent; returns within about 3 x ``join_timeout_s``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            process = self._process
        for conn in (self._items, self._free):
            if conn is not None:
                conn.close()
        if process is not None:
            process.join(timeout=self._join_timeout_s)
            if process.is_alive():
                process.terminate()
                process.join(timeout=self._join_timeout_s)
            if process.is_alive():
                os.kill(process.pid, 9)
                process.join(timeout=self._join_timeout_s)
        # The ring is left to the garbage collector: arrays handed out are copies, and a
        # consumer blocked in get() may still hold a reference to it.
        self._ring = None


def grpc_threads() -> list[str]:
    """The names of gRPC's own threads running in this process, sorted; empty while none runs.

    gRPC starts them with its first channel or server and ends them about a second after the last channel
    closed and the last server was stopped and released.
    Empty too where gRPC was never imported (nothing is read then) or where ``/proc`` is missing.
    """
    if "grpc" not in sys.modules:
        return []
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return []
    names = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8", errors="replace") as f:
                name = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name.startswith(_GRPC_THREAD_NAMES):
            names.append(name)
    return sorted(names)


def _layout(arrays: list[np.ndarray], capacity: int) -> _Layout | None:
    """Where each array goes in a slot, or None if they do not fit."""
    layout: _Layout = []
    offset = 0
    for array in arrays:
        layout.append((offset, array.dtype.str, tuple(array.shape)))
        offset += -(-array.nbytes // _ALIGN) * _ALIGN
        if offset > capacity:
            return None
    return layout


def _picklable(error: BaseException) -> BaseException:
    """``error`` itself if it survives a pickle round trip, else a DataError naming it."""
    try:
        copy = pickle.loads(pickle.dumps(error))
        if isinstance(copy, BaseException) and type(copy) is type(error) and str(copy) == str(error):
            return error
    except Exception:  # noqa: BLE001 - any failure means: send a description instead
        pass
    return DataError(f"reader process: {type(error).__name__}: {error}")
