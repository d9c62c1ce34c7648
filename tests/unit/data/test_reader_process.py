"""ReaderProcess: parsing in a child process, batches through shared memory.

Every item exactly once and in order (through slots and through the pipe
fallback), errors re-raised, a killed child reported instead of a hang, the
child stopped by close() and gone when its parent dies; and a Dataset with
``reader_process`` gives the same batches and positions as with a thread.

Every fork here happens in a fresh process (``support.in_fresh_process``), never in
the pytest process: earlier tests may leave gRPC running there, and a reader
forked then died of SIGSEGV; ``start()`` now refuses that case (tested too).
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import same_batches
from support import in_fresh_process

from psflow.data import BadRecordError, Batch, DataError, DatasetConfig, open_dataset
from psflow.data.reader_process import ReaderProcess, Split, grpc_threads

Item = tuple[int, np.ndarray, np.ndarray]


def _take_apart(item: Item) -> tuple[list[np.ndarray], Any]:
    return [item[1], item[2]], item[0]


def _rebuild(arrays: list[np.ndarray], rest: Any) -> Item:
    return int(rest), arrays[0], arrays[1]


SPLIT: Split[Item] = (_take_apart, _rebuild)


def _items(count: int, *, big_every: int = 0, fail_at: int | None = None) -> Callable[[], Iterator[Item]]:
    def make() -> Iterator[Item]:
        for k in range(count):
            if k == fail_at:
                raise BadRecordError("file.tfrecord", "made-up damage", record=k, offset=10 * k)
            n = 5000 if big_every and k % big_every == 0 else k % 7 + 1  # 5000 int64 = 40 KB: over the slot
            yield k, np.arange(k, k + n, dtype=np.int64), np.full((n, 2), k, dtype=np.float32)
    return make


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, exited but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pid: int, bound_s: float = 30.0) -> bool:
    deadline = time.monotonic() + bound_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not _alive(pid)


def _read_all(big_every: int) -> list[Item]:
    reader = ReaderProcess(_items(300, big_every=big_every), 2, SPLIT, name="test-reader", start=True, slot_bytes=4096)
    got = []
    try:
        while True:
            try:
                got.append(reader.get())
            except StopIteration:
                break
        with pytest.raises(StopIteration):  # and it stays ended
            reader.get()
    finally:
        reader.close()
    return got


@pytest.mark.parametrize("big_every", [0, 3])
def test_every_item_exactly_once_in_order(big_every: int) -> None:
    got = in_fresh_process(_read_all, big_every)
    assert [k for k, _, _ in got] == list(range(300))
    for k, ids, values in got:
        n = 5000 if big_every and k % big_every == 0 else k % 7 + 1
        assert ids.tolist() == list(range(k, k + n))
        assert values.shape == (n, 2) and values.dtype == np.float32 and bool(np.all(values == k))


def _first_after_49_more() -> tuple[int, list[int], bool]:
    reader = ReaderProcess(_items(50), 1, SPLIT, name="test-reader", start=True)
    try:
        first = reader.get()
        for _ in range(49):
            reader.get()  # the one slot is rewritten 49 times
    finally:
        reader.close()
    return first[0], first[1].tolist(), bool(first[1].flags.owndata)


def test_items_are_copies_that_outlive_their_slot() -> None:
    assert in_fresh_process(_first_after_49_more) == (0, [0], True)


def test_error_is_raised_with_type_and_message_and_again_later() -> None:
    in_fresh_process(_error_is_raised_with_type_and_message_and_again_later)


def _error_is_raised_with_type_and_message_and_again_later() -> None:
    reader = ReaderProcess(_items(10, fail_at=4), 2, SPLIT, name="test-reader", start=True)
    try:
        assert [reader.get()[0] for _ in range(4)] == [0, 1, 2, 3]
        with pytest.raises(BadRecordError, match="made-up damage") as info:
            reader.get()
        assert info.value.record == 4
        with pytest.raises(BadRecordError):
            reader.get()
    finally:
        reader.close()


def test_a_killed_child_is_reported_not_waited_for() -> None:
    in_fresh_process(_a_killed_child_is_reported_not_waited_for)


def _a_killed_child_is_reported_not_waited_for() -> None:
    def forever() -> Iterator[Item]:
        yield 0, np.zeros(1, dtype=np.int64), np.zeros((1, 2), dtype=np.float32)
        while True:
            time.sleep(0.01)

    reader = ReaderProcess(forever, 2, SPLIT, name="test-reader", start=True)
    try:
        assert reader.get()[0] == 0
        pid = reader.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(DataError, match=f"pid {pid}.*died"):
            reader.get()
        with pytest.raises(DataError, match="died"):
            reader.get()
    finally:
        reader.close()


def test_close_stops_a_blocked_child_and_is_idempotent() -> None:
    in_fresh_process(_close_stops_a_blocked_child_and_is_idempotent)


def _close_stops_a_blocked_child_and_is_idempotent() -> None:
    reader = ReaderProcess(_items(10**6), 2, SPLIT, name="test-reader", start=True)
    reader.get()
    pid = reader.pid
    assert pid is not None and _alive(pid)
    reader.close()
    reader.close()
    assert _wait_gone(pid)
    with pytest.raises(DataError, match="closed"):
        reader.get()


def test_start_false_defers_the_fork() -> None:
    in_fresh_process(_start_false_defers_the_fork)


def _start_false_defers_the_fork() -> None:
    reader = ReaderProcess(_items(3), 1, SPLIT, name="test-reader", start=False)
    try:
        assert reader.pid is None
        assert reader.get()[0] == 0
        assert reader.pid is not None
    finally:
        reader.close()


def test_start_refuses_while_grpc_runs_in_the_process_and_forks_once_it_ended() -> None:
    """A fork with gRPC's threads alive gave a child that died of SIGSEGV about every other time (its log:
    "Other threads are currently calling into gRPC, skipping fork() handlers"): refused, naming why."""
    message = in_fresh_process(_refused_while_grpc_runs)
    assert message.startswith("cannot fork the reader process test-reader: gRPC runs in this process"), message


def _refused_while_grpc_runs() -> str:
    from psflow.rpc.api import ConnectConfig, ServeConfig
    from psflow.rpc.registry import open_channel, serve

    assert grpc_threads() == []  # a fresh process
    server = serve("grpc", ServeConfig("/job:ps/task:0", "127.0.0.1:0", {"psflow.Test": {}}, token=None))
    server.start()
    channel = open_channel("grpc", "/job:ps/task:0", f"127.0.0.1:{server.port}", "psflow.Test", ConnectConfig())
    channel.wait_ready(30)
    reader = ReaderProcess(_items(3), 1, SPLIT, name="test-reader", start=False)
    try:
        assert grpc_threads() != []
        with pytest.raises(DataError) as refused:
            reader.get()
        assert reader.pid is None  # nothing was forked
        channel.close()
        server.stop(0)
        del channel, server  # gRPC's timer thread ends with the server object
        gc.collect()
        deadline = time.monotonic() + 60  # a safety net: gRPC ends its threads about a second after the last close
        while grpc_threads() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert grpc_threads() == []
        assert reader.get()[0] == 0  # the same reader forks now
    finally:
        reader.close()
    return str(refused.value)


_ORPHAN = """
import sys, time
import numpy as np
sys.path[:0] = [{tests!r}, {support!r}]
from test_reader_process import SPLIT, _items
from psflow.data.reader_process import ReaderProcess
reader = ReaderProcess(_items(10**6), 2, SPLIT, name="orphan-reader", start=True)
reader.get()
print(reader.pid, flush=True)
time.sleep(600)
"""


def test_child_exits_when_its_parent_is_killed() -> None:
    script = _ORPHAN.format(tests=str(Path(__file__).parent), support=str(Path(__file__).parents[2]))
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child: int | None = None
    try:
        line = parent.stdout.readline() if parent.stdout else ""
        child = int(line)
        assert _alive(child)
    finally:
        parent.kill()  # by its pid, SIGKILL: no clean-up runs in the parent
        parent.wait()
    try:
        assert _wait_gone(child)
    finally:
        if _alive(child):  # the test failed: do not leave the reader running
            os.kill(child, signal.SIGKILL)


def _dataset_run(config: DatasetConfig) -> tuple[list[Batch], list[str], int]:
    with open_dataset(config, start=True) as dataset:
        batches, positions = [], []
        for batch in dataset:
            batches.append(batch)
            positions.append(dataset.position().to_json())
        return batches, positions, dataset.stats.records_read


@pytest.mark.parametrize("shuffle", [0, 9])
def test_dataset_with_a_reader_process_matches_the_thread(numbered_files: Callable[..., list[str]], shuffle: int) -> None:
    paths = numbered_files("tfrecord", [30, 11])
    config = DatasetConfig(tuple(paths), "tfrecord", batch_size=7, num_epochs=2, shuffle_buffer=shuffle, seed=1, prefetch=2)
    threaded = _dataset_run(config)
    forked = in_fresh_process(_dataset_run, replace(config, reader_process=True))
    assert forked[1] == threaded[1]
    assert forked[2] == threaded[2] == 82
    assert same_batches(forked[0], threaded[0])


def _prepare(batch: Batch) -> Batch:
    column = batch.column()
    return replace(batch, extras={"row_sums": np.add.reduceat(column.ids, column.indptr[:-1]), "n": np.array([batch.num_examples])})


def _prepared_batches(config: DatasetConfig) -> list[Batch]:
    with open_dataset(config, start=True, prepare=_prepare) as dataset:
        return list(dataset)


def test_prepare_runs_in_the_reader_process_and_its_extras_arrive(numbered_files: Callable[..., list[str]]) -> None:
    paths = numbered_files("tfrecord", [30, 11])
    config = DatasetConfig(tuple(paths), "tfrecord", batch_size=7, num_epochs=1, prefetch=2, reader_process=True)
    batches = in_fresh_process(_prepared_batches, config)
    assert sum(b.num_examples for b in batches) == 41
    for batch in batches:
        want = _prepare(replace(batch, extras={}))
        assert sorted(batch.extras) == ["n", "row_sums"]
        assert batch.extras["row_sums"].tolist() == want.extras["row_sums"].tolist()
        assert batch.extras["n"].tolist() == [batch.num_examples]


def test_dataset_reader_process_error_and_close(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("1 1:1\n" * 50 + "1 oops\n")
    in_fresh_process(_dataset_reader_process_error_and_close, path)


def _dataset_reader_process_error_and_close(path: Path) -> None:
    config = DatasetConfig((str(path),), "libsvm", batch_size=10, prefetch=2, reader_process=True)
    dataset = open_dataset(config, start=True)
    pid = dataset.reader_pid
    assert pid is not None
    with pytest.raises(BadRecordError) as info:
        list(dataset)
    assert str(info.value) == f"{path}:51: malformed token 'oops' (want <id>:<value>)"
    dataset.close()
    assert _wait_gone(pid)


def test_a_cluster_worker_refuses_a_reader_process() -> None:
    from psflow.cluster import ClusterSpec
    from psflow.train.config import ConfigError, TrainConfig
    from psflow.train.worker import run_worker

    config = TrainConfig.flat(train=("unused.libsvm",), num_ps=1, num_workers=1, reader_process=True)
    cluster = ClusterSpec({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]})
    with pytest.raises(ConfigError, match="in-process fast path only"):
        run_worker(config, cluster, 0)
