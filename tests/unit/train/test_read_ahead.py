"""A worker's reader starts before the worker joins the cluster (psflow.train.read_ahead), and every record is
still trained on once: the early reader is used only where the worker's data starts at its beginning.

The ps task is in this process, behind in-process channels (no sockets); the workers are real
:func:`~psflow.train.worker.run_worker` calls on threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from psflow.cluster import ClusterSpec
from psflow.data import Batch, DatasetConfig, open_dataset
from psflow.ps.client import ParameterClient
from psflow.ps.service import ParameterService
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.build import build_model
from psflow.train.config import TrainConfig
from psflow.train.read_ahead import ReadAhead
from psflow.train.worker import WorkerResult, run_worker

pytestmark = pytest.mark.timeout(60)

WAIT_S = 20.0  # bounded waits for another thread: generous, never a measure of speed


def _libsvm(path: Path, lines: int, first: int = 0) -> str:
    path.write_text("".join(f"{(first + i) % 2} {1 + (first + i) % 50}:1 {60 + i % 7}:0.5\n" for i in range(lines)))
    return str(path)


def _wait_until(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {WAIT_S} s: {what}")
        time.sleep(0.005)


def _readers(worker_index: int) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"psflow-data-w{worker_index}" and t.is_alive()]


def _reader_alive(worker_index: int) -> bool:
    return bool(_readers(worker_index))


def _rows(batches: list[Batch]) -> list[list[int]]:
    return [b.labels.astype(int).tolist() + b.sparse["features"].ids.tolist() for b in batches]


def _config(path: str, worker_index: int = 0, num_workers: int = 1) -> DatasetConfig:
    return DatasetConfig((path,), "libsvm", batch_size=10, prefetch=2, worker_index=worker_index,
                         num_workers=num_workers)


def test_the_reader_prepares_batches_before_the_first_is_asked_for(tmp_path: Path) -> None:
    prepared: list[int] = []

    def prepare(batch: Batch) -> Batch:
        prepared.append(batch.num_examples)
        return batch

    with ReadAhead(_config(_libsvm(tmp_path / "a.libsvm", 95)), prepare, start=True) as early:
        _wait_until("the early reader prepared a batch", lambda: len(prepared) > 0)
        with early.open(None) as dataset:
            assert sum(b.num_examples for b in dataset) == 95
    assert prepared[0] == 10


def test_taken_at_the_start_it_hands_out_what_a_fresh_open_would(tmp_path: Path) -> None:
    config = _config(_libsvm(tmp_path / "a.libsvm", 95))
    with open_dataset(config, start=True) as fresh:
        want = _rows(list(fresh))
        end = fresh.position()
    with ReadAhead(config, None, start=True) as early:
        with early.open(None) as dataset:
            assert _rows(list(dataset)) == want
            assert dataset.position() == end
        with early.open(None) as again:  # handed over once: opened anew from the beginning
            assert again is not dataset
            assert _rows(list(again)) == want


def test_a_worker_resuming_elsewhere_gets_its_position_and_the_early_reader_stops(tmp_path: Path) -> None:
    config = _config(_libsvm(tmp_path / "a.libsvm", 95))
    with open_dataset(config, start=True) as first:
        next(first)
        next(first)
        resume = first.position()
        rest = _rows(list(first))
    with ReadAhead(config, None, start=True) as early:
        _wait_until("the early reader started", lambda: _reader_alive(0))
        (reader,) = _readers(0)
        with early.open(resume) as resumed:
            _wait_until("the early reader's thread ended", lambda: not reader.is_alive())
            assert _rows(list(resumed)) == rest


def test_not_started_it_reads_nothing_until_opened(tmp_path: Path) -> None:
    """A reader process (the in-process path) is not started early: the data is opened as before."""
    config = _config(_libsvm(tmp_path / "a.libsvm", 35))
    with open_dataset(config, start=True) as fresh:
        want = _rows(list(fresh))
    with ReadAhead(config, None, start=False) as data:
        assert not _reader_alive(0)
        with data.open(None) as dataset:
            assert _rows(list(dataset)) == want


def test_close_leaves_a_dataset_it_handed_over_open(tmp_path: Path) -> None:
    early = ReadAhead(_config(_libsvm(tmp_path / "a.libsvm", 35)), None, start=True)
    dataset = early.open(None)
    early.close()
    early.close()  # idempotent
    with dataset:
        assert sum(b.num_examples for b in dataset) == 35


def _client(service: ParameterService, cluster: ClusterSpec, config: TrainConfig, index: int) -> ParameterClient:
    _, variables = build_model(config, cluster)
    return ParameterClient(cluster, variables.placements(), client_name=f"/job:worker/task:{index}",
                           sync=config.sync_config(), channels={0: InProcessChannel("/job:ps/task:0", service.handlers())})


def test_a_waiting_worker_reads_ahead_and_then_trains_on_each_record_once(tmp_path: Path) -> None:
    """Worker 1 (not the chief) starts its reader while it waits for the chief's initialization; once the chief
    initialized, both workers train their whole shards: every record once, one global step per push."""
    train = (_libsvm(tmp_path / "train-0.libsvm", 73), _libsvm(tmp_path / "train-1.libsvm", 58, first=73))
    config = TrainConfig.flat(train=train, format="libsvm", num_features=128, num_ps=1, num_workers=2,
                              batch_size=10, epochs=1, log_every=1000)
    cluster = ClusterSpec({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]})
    service = ParameterService(0, holds_global_step=True)
    results: dict[int, WorkerResult | BaseException] = {}

    def worker(index: int) -> None:
        try:
            results[index] = run_worker(config, cluster, index, client=_client(service, cluster, config, index))
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            results[index] = e

    waiting = threading.Thread(target=worker, args=(1,), name="test-worker-1", daemon=True)
    waiting.start()
    try:
        _wait_until("worker 1's reader started while it waits for the chief", lambda: _reader_alive(1) or 1 in results)
        assert 1 not in results, results.get(1)
        assert not _client(service, cluster, config, 0).ps_stats().registered  # nobody initialized yet
        worker(0)  # the chief: it initializes, then trains its own shard
    finally:
        waiting.join(WAIT_S)
    assert not waiting.is_alive()
    done = {i: r for i, r in results.items() if isinstance(r, WorkerResult)}
    assert sorted(done) == [0, 1], results
    assert sorted(r.examples for r in done.values()) == [58, 73]
    assert done[0].local_steps + done[1].local_steps == 8 + 6
    assert max(r.last_step or 0 for r in done.values()) == 14  # one global step per push, none lost or repeated
