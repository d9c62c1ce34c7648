"""How the kernel backs a ps task's large arrays: out of forked children, and small pages where rows are sparse.

Two pieces of Linux memory advice (``madvise``), best effort: other platforms, small arrays and failing calls
are left as they are.

**Out of forked children** (``MADV_DONTFORK``, :func:`exclude_from_fork`). A process that holds variables and
forks (``--in-process`` forks its input reader, :mod:`psflow.data.reader_process`) would otherwise share every
page of its tables copy-on-write with the child: the first write to each page after the fork copies it, and
the kernel splits the tables' transparent huge pages into 4 KiB ones, so every later random row access costs
more TLB misses. Measured on the Wide & Deep benchmark (``--in-process``, 436 MiB of tables and slots): huge-page
memory 8 MiB instead of 319 MiB after the fork, and a median step of 11 ms instead of 10.

:func:`exclude_from_fork` marks an array's whole pages ``MADV_DONTFORK``: a
forked child does not map them at all. Guarantee for the caller: a child
forked later must never read or write such an array (it would fault); psflow's
only fork, the input reader, parses data and never touches a ps task's state.
``exec`` after ``fork`` (subprocess) is unaffected. The mark goes with the
array: when it is freed, its pages are inherited by forks again.

**Small pages for lazy tables** (``MADV_NOHUGEPAGE``, :func:`use_small_pages`). numpy advises the kernel
to back every array of 4 MiB or more with transparent huge pages (``MADV_HUGEPAGE``; it matters where THP
is in ``madvise`` mode, and in ``always`` mode THP applies anyway). A lazy partition
(:mod:`psflow.ps.lazy_rows`) is a zero-filled array whose pages are committed on first write: with 2 MiB
pages one touched row of an 8-float table commits the 65,536 rows around it, so a few hundred hashed ids
spread over a 2^20-row table commit all of it (issue 29's W&D ps: 1.9 GiB resident after an epoch that
touched ~2% of the rows). With 4 KiB pages a touched row commits the 128 rows around it. The price is
more TLB misses on random row access (a 13,000-row gather over four 32 MiB tables: ~0.21 ms against ~0.17
ms here) and more page faults, spread over the run instead of paid in its first steps; benchmarks/RESULTS.md
(section ``wd_small_pages``) has the end-to-end figures. Dense, fully initialized arrays keep numpy's
advice: they are committed whole at creation anyway. Measured and not kept (44b5ea2): putting a lazy table
whose pages nearly all hold built rows (90%) back in huge pages, collapsed at once (``MADV_COLLAPSE``); on the
W&D command it cost 0-15% more CPU than small pages alone in 8 alternated pairs (medians 1.07 and 1.04).
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import weakref

import numpy as np

__all__ = ["exclude_from_fork", "use_small_pages", "MIN_BYTES"]

#: Arrays smaller than this are left alone (they hold no huge page, and a partial page at each end stays shared).
MIN_BYTES = 2 << 20
_MADV_DONTFORK = 10
_MADV_DOFORK = 11
_MADV_HUGEPAGE = 14
_MADV_NOHUGEPAGE = 15
#: numpy advises huge pages for arrays of this many bytes or more (numpy/_core/src/multiarray/alloc.c).
_NUMPY_HUGEPAGE_BYTES = 4 << 20
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


def _whole_pages(array: np.ndarray) -> tuple[int, int] | None:
    """(start, length) of the pages that lie wholly inside ``array``'s own C-contiguous buffer of
    :data:`MIN_BYTES` or more, or None (no madvise here, a small array, a view, a strided array)."""
    if _MADVISE is None or array.nbytes < MIN_BYTES or array.base is not None or not array.flags.c_contiguous:
        return None
    start = array.ctypes.data
    first = -(-start // _PAGE) * _PAGE  # whole pages only: the ends may share a page with other memory
    length = (start + array.nbytes) // _PAGE * _PAGE - first
    return (first, length) if length > 0 else None


def _numpy_advises_huge_pages(nbytes: int) -> bool:
    """Whether numpy advised ``MADV_HUGEPAGE`` for a fresh buffer of ``nbytes`` (its switch, read at import
    from ``NUMPY_MADVISE_HUGEPAGE``)."""
    from numpy._core import multiarray

    enabled = getattr(multiarray, "_get_madvise_hugepage", None)
    return nbytes >= _NUMPY_HUGEPAGE_BYTES and enabled is not None and bool(enabled())


def use_small_pages(array: np.ndarray) -> bool:
    """Advises the kernel to back ``array``'s whole pages with small (4 KiB) pages only; True if it did.

    For a lazy partition's freshly allocated, zero-filled value or slot (:mod:`psflow.ps.lazy_rows`), before
    any of it is written: its resident memory then grows with the rows touched, not in 2 MiB steps. Pages
    already backed by a huge page stay so until the kernel splits it. Not blocking beyond the system call;
    calling it twice is harmless. When the array is freed, numpy's own advice is put back on its pages
    (``MADV_HUGEPAGE``, where numpy gave it), so memory the allocator hands out again is backed as numpy
    left it.
    """
    pages = _whole_pages(array)
    if pages is None or _MADVISE is None or _MADVISE(pages[0], pages[1], _MADV_NOHUGEPAGE) != 0:
        return False
    if _numpy_advises_huge_pages(array.nbytes):
        weakref.finalize(array, _MADVISE, pages[0], pages[1], _MADV_HUGEPAGE)
    return True


def exclude_from_fork(array: np.ndarray) -> bool:
    """Marks the pages that lie wholly inside ``array``'s buffer ``MADV_DONTFORK``; True if it did.

    For an array that owns its C-contiguous buffer (a ps partition's value or
    slot). The mark is taken back when the array is freed (``MADV_DOFORK``, before
    numpy releases the buffer), so memory the allocator hands out again is
    inherited by forks as usual.
    """
    pages = _whole_pages(array)
    if pages is None or _MADVISE is None or _MADVISE(pages[0], pages[1], _MADV_DONTFORK) != 0:
        return False
    weakref.finalize(array, _MADVISE, pages[0], pages[1], _MADV_DOFORK)
    return True
