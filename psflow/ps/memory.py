"""Keeping a ps task's large arrays out of forked children (Linux ``MADV_DONTFORK``).

A process that holds variables and forks (``--in-process`` forks its input
reader, :mod:`psflow.data.reader_process`) would otherwise share every page of
its tables copy-on-write with the child: the first write to each page after the
fork copies it, and the kernel splits the tables' transparent huge pages into
4 KiB ones, so every later random row access costs more TLB misses. Measured on
the Wide & Deep benchmark (``--in-process``, 436 MiB of tables and slots):
huge-page memory 8 MiB instead of 319 MiB after the fork, and a median step of
11 ms instead of 10.

:func:`exclude_from_fork` marks an array's whole pages ``MADV_DONTFORK``: a
forked child does not map them at all. Guarantee for the caller: a child
forked later must never read or write such an array (it would fault); psflow's
only fork, the input reader, parses data and never touches a ps task's state.
``exec`` after ``fork`` (subprocess) is unaffected. The mark goes with the
array: when it is freed, its pages are inherited by forks again. Best effort:
other platforms, small arrays and failing calls are left as they are.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import weakref

import numpy as np

__all__ = ["exclude_from_fork", "MIN_BYTES"]

#: Arrays smaller than this are left alone (they hold no huge page, and a partial page at each end stays shared).
MIN_BYTES = 2 << 20
_MADV_DONTFORK = 10
_MADV_DOFORK = 11
_PAGE = mmap.PAGESIZE


def _madvise() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _madvise()


def exclude_from_fork(array: np.ndarray) -> bool:
    """Marks the pages that lie wholly inside ``array``'s buffer ``MADV_DONTFORK``; True if it did.

    For an array that owns its C-contiguous buffer (a ps partition's value or
    slot). The mark is taken back when the array is freed (``MADV_DOFORK``, before
    numpy releases the buffer), so memory the allocator hands out again is
    inherited by forks as usual.
    """
    if _MADVISE is None or array.nbytes < MIN_BYTES or array.base is not None or not array.flags.c_contiguous:
        return False
    start = array.ctypes.data
    first = -(-start // _PAGE) * _PAGE  # whole pages only: the ends may share a page with other memory
    length = (start + array.nbytes) // _PAGE * _PAGE - first
    if length <= 0 or _MADVISE(first, length, _MADV_DONTFORK) != 0:
        return False
    weakref.finalize(array, _MADVISE, first, length, _MADV_DOFORK)
    return True
