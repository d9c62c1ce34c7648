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

from psflow.ps.memory import MIN_BYTES, exclude_from_fork
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
    from psflow.optim import OptimizerSpec
    from psflow.ps.optimizers import make_optimizer

    before = _dontfork_kib()
    store = ParameterStore()
    part = store.create("emb", 0, (1 << 17, 8), 0, 1 << 17, "float32", {"name": "zeros"},
                        make_optimizer(OptimizerSpec("adagrad", {"learning_rate": 0.1})))
    assert _dontfork_kib() - before >= 2 * (part.value.nbytes // 1024 - 8)  # the value and its accumulator
    del part, store
    gc.collect()
    assert _dontfork_kib() == before
