"""psflow.ps.memory: a ps task's large arrays stay out of forked children, and only while they live."""

from __future__ import annotations

import faulthandler
import gc
import os
import re
import signal
import sys

import numpy as np
import pytest
from support import in_fresh_process

from psflow.optim import OptimizerSpec
from psflow.ps.memory import MIN_BYTES, exclude_from_fork
from psflow.ps.optimizers import Optimizer, make_optimizer
from psflow.ps.store import ParameterStore

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_DONTFORK is Linux's")


def _dontfork_kib() -> int:
    """KiB of this process's mappings marked MADV_DONTFORK ("dc" in /proc/self/smaps)."""
    total, size = 0, 0
    with open("/proc/self/smaps") as f:
        for line in f:
            m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
            if m:
                size = (int(m.group(2), 16) - int(m.group(1), 16)) // 1024
            elif line.startswith("VmFlags") and " dc" in line:
                total += size
    return total


def _child_reads(array: np.ndarray) -> int:
    """Forks a child that sums ``array``; returns its wait status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        faulthandler.disable()  # pytest's: the expected SIGSEGV would print a traceback
        os._exit(0 if float(array.sum()) >= 0 else 1)
    _, status = os.waitpid(pid, 0)
    return status


def test_marked_pages_are_not_mapped_in_a_forked_child_and_unmarked_when_freed() -> None:
    # Forked in a fresh process, never from the pytest process: earlier tests may leave gRPC running there,
    # and a child forked then can die of SIGSEGV for gRPC's sake, not this test's.
    in_fresh_process(_marked_pages_are_not_mapped_in_a_forked_child_and_unmarked_when_freed)


def _marked_pages_are_not_mapped_in_a_forked_child_and_unmarked_when_freed() -> None:
    before = _dontfork_kib()
    array = np.ones(MIN_BYTES // 4 * 2, np.float32)
    assert exclude_from_fork(array)
    assert _dontfork_kib() - before >= array.nbytes // 1024 - 8  # all but the partial pages at the ends
    status = _child_reads(array)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSEGV
    del array
    gc.collect()
    assert _dontfork_kib() == before
    again = np.ones(MIN_BYTES // 4 * 2, np.float32)  # memory the allocator may hand out again: forks see it
    assert os.WIFEXITED(_child_reads(again)) and os.WEXITSTATUS(_child_reads(again)) == 0


def test_small_views_and_strided_arrays_are_left_alone() -> None:
    big = np.ones(MIN_BYTES // 4 * 2, np.float32)
    assert not exclude_from_fork(np.ones(16, np.float32))
    assert not exclude_from_fork(big[1:])  # a view: the buffer is not its own
    assert not exclude_from_fork(big.reshape(2, -1).T)


def test_the_store_marks_partitions_and_slots() -> None:
    before = _dontfork_kib()
    store = ParameterStore()
    part = store.create("emb", 0, (1 << 17, 8), 0, 1 << 17, "float32", {"name": "zeros"},
                        make_optimizer(OptimizerSpec("adagrad", {"learning_rate": 0.1})))
    assert _dontfork_kib() - before >= 2 * (part.value.nbytes // 1024 - 8)  # the value and its accumulator
    del part, store
    gc.collect()
    assert _dontfork_kib() == before


# ---- page size: a lazy partition's memory follows the rows touched (issue 29) ---------------------------------
def _thp_mode() -> str | None:
    """The kernel's transparent huge page mode ("always", "madvise"), or None where THP is unavailable or off."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            mode = f.read().split("[", 1)[1].split("]", 1)[0]
    except (OSError, IndexError):
        return None
    return None if mode == "never" else mode


def _mapping_of(address: int) -> dict[str, str]:
    """The /proc/self/smaps fields (VmFlags, THPeligible, Rss, ...) of the mapping that holds ``address``."""
    fields: dict[str, str] = {}
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
            if m:
                if inside:
                    break
                inside = int(m.group(1), 16) <= address < int(m.group(2), 16)
            elif inside:
                name, _, value = line.partition(":")
                fields[name] = value.strip()
    if not fields:
        raise AssertionError(f"no mapping holds address {address:#x}")
    return fields


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _adagrad() -> Optimizer:
    return make_optimizer(OptimizerSpec("adagrad", {"learning_rate": 0.1}))


@pytest.mark.timeout(60)
def test_a_lazy_partitions_pages_are_not_huge_page_advised_and_an_eager_ones_keep_numpys_advice() -> None:
    if _thp_mode() is None:
        pytest.skip("transparent huge pages are unavailable or off here")
    store = ParameterStore()
    lazy = store.create("emb", 0, (1 << 20, 8), 0, 1 << 20, "float32", {"name": "zeros"}, _adagrad())
    # The row marks of incremental checkpoints (a byte per row, stamped sparsely): 4 MiB for 2^22 rows.
    wide = store.create("wide", 0, (1 << 22, 1), 0, 1 << 22, "float32", {"name": "zeros"}, _adagrad())
    assert lazy.lazy is not None and wide.lazy is not None and wide.marks is not None
    assert wide.marks.changed_at.nbytes >= MIN_BYTES
    for array in (lazy.value, lazy.slots["accumulator"], wide.value, wide.marks.changed_at):
        mapping = _mapping_of(array.ctypes.data + array.nbytes // 2)
        assert " nh" in " " + mapping["VmFlags"] and " hg" not in " " + mapping["VmFlags"], mapping["VmFlags"]
        assert mapping.get("THPeligible", "0") == "0"
    # Adam's sparse update moves every row: an eager partition, fully written at creation; numpy's advice stays.
    eager = store.create("dense", 0, (1 << 17, 8), 0, 1 << 17, "float32", {"name": "zeros"},
                         make_optimizer(OptimizerSpec("adam", {"learning_rate": 0.01})))
    assert eager.lazy is None
    flags = " " + _mapping_of(eager.value.ctypes.data + eager.value.nbytes // 2)["VmFlags"]
    assert " nh" not in flags
    if np.dtype(np.float32).itemsize * eager.value.size >= 4 << 20 and _thp_mode() == "madvise":
        assert " hg" in flags  # numpy advises huge pages for arrays of 4 MiB or more


@pytest.mark.timeout(120)
def test_touching_500_random_rows_of_a_lazy_table_commits_pages_near_them_not_the_table() -> None:
    grown, control = in_fresh_process(_touch_500_rows)
    # 500 rows in a 2^20 x 8 float32 table and its Adagrad accumulator: at most 500 x 2 pages of 4 KiB (~4 MiB),
    # plus the row marks (1 MiB). With 2 MiB pages the same rows commit all 2 x 32 MiB.
    assert grown < 12 << 10, f"RSS grew by {grown} KiB"
    if control is not None:  # the kernel backed numpy's default array with huge pages here: the advice matters
        assert control > 4 * grown, (control, grown)


def _touch_500_rows() -> tuple[int, int | None]:
    """(KiB of RSS a lazy partition's 500 touched rows took, KiB the same writes took in a numpy-default array
    backed by huge pages, or None where the kernel gave it none)."""
    store = ParameterStore()
    part = store.create("emb", 0, (1 << 20, 8), 0, 1 << 20, "float32", {"name": "random_uniform", "seed": 1},
                        _adagrad())
    rows = np.random.default_rng(0).choice(1 << 20, 500, replace=False).astype(np.int64)
    before = _rss_kib()
    ParameterStore.read(part, rows)  # builds the rows: value and accumulator written
    grown = _rss_kib() - before
    plain = [np.zeros((1 << 20, 8), np.float32), np.zeros((1 << 20, 8), np.float32)]
    before = _rss_kib()
    for array in plain:
        array[rows] = 1.0
    control = _rss_kib() - before
    huge = sum(int(_mapping_of(a.ctypes.data + a.nbytes // 2).get("AnonHugePages", "0 kB").split()[0]) for a in plain)
    return grown, control if huge > 0 else None
