"""A run resumed with another number of workers (or another shuffle buffer or seed) keeps its completed epochs.

The reader positions a checkpoint holds were taken under its run's sharding; under another one they cannot say
which records each new worker has read. Before, every worker then started its data from the beginning of epoch
0: a run of ``--epochs 3`` stopped after 2.35 epochs (2 workers) and resumed with ``--workers 3`` trained 3 more
epochs, 5.35 in all, and metrics.json counted 174,068 examples for a 3-epoch run of 32,561 records, with one
WARNING in each worker's log and nothing on the console. Now each worker starts at the beginning of the epoch
every saved position had reached (its records read again, the epochs before it never), and a worker of a run
resumed with the same sharding that has no position of its own starts at epoch 0 as before.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from psflow.data import open_dataset
from psflow.data.api import DatasetConfig, ReaderPosition
from psflow.train.duties import resume_from_positions

pytestmark = pytest.mark.timeout(60)

RECORDS = 90
EPOCHS = 3


def _config(path: Path, worker: int, workers: int, **options: object) -> DatasetConfig:
    return DatasetConfig((str(path),), "libsvm", batch_size=4, num_epochs=EPOCHS, worker_index=worker,
                         num_workers=workers, prefetch=0, **options)  # type: ignore[arg-type]


def _data(tmp_path: Path) -> Path:
    path = tmp_path / "train.libsvm"
    path.write_text("".join(f"{i % 2} {i % 7 + 1}:1\n" for i in range(RECORDS)))
    return path


def _read(config: DatasetConfig, start: ReaderPosition | None, batches: int | None = None) -> tuple[int, str]:
    """(records read from ``start``, the position after them) of ``batches`` batches, or of all."""
    records = 0
    with open_dataset(config, start=False, resume_from=start) as dataset:
        for n, batch in enumerate(dataset):
            records += batch.num_examples
            if batches is not None and n + 1 == batches:
                break
        return records, dataset.position().to_json()


def _positions(path: Path, batches: tuple[int, ...], workers: int = 2, **options: object) -> dict[str, str]:
    """Each worker of a ``workers``-worker run, stopped after its ``batches[i]`` batches: its position."""
    return {f"/job:worker/task:{i}": _read(_config(path, i, workers, **options), None, n)[1]
            for i, n in enumerate(batches)}


def test_with_other_workers_every_worker_starts_the_epoch_all_positions_reached(tmp_path: Path) -> None:
    path = _data(tmp_path)
    # 2 workers, 45 records each per epoch (12 batches): worker 0 is 5 batches into epoch 2, worker 1 3 into epoch 1.
    saved = _positions(path, (12 * 2 + 5, 12 + 3))
    total = 0
    for worker in range(3):
        config = _config(path, worker, 3)
        own = saved.get(f"/job:worker/task:{worker}")
        start = resume_from_positions(own, saved, config, f"/job:worker/task:{worker}")
        assert start is not None and start.epoch == 1 and start.records_consumed == 0 and start.file_index == 0
        total += _read(config, start)[0]
    assert total == 2 * RECORDS  # epochs 1 and 2 of the data, once each: epoch 0 is not trained again


def test_a_position_past_the_last_epoch_leaves_nothing_to_read(tmp_path: Path) -> None:
    path = _data(tmp_path)
    saved = _positions(path, (10**6, 10**6))  # both finished all 3 epochs
    config = _config(path, 2, 3)
    start = resume_from_positions(None, saved, config, "/job:worker/task:2")
    assert start is not None and start.epoch == EPOCHS
    assert _read(config, start)[0] == 0


def test_another_seed_or_shuffle_buffer_keeps_the_completed_epochs_too(tmp_path: Path) -> None:
    path = _data(tmp_path)
    saved = _positions(path, (12 + 1, 12 + 2), shuffle_buffer=8, seed=1)
    for options in ({"shuffle_buffer": 8, "seed": 2}, {"shuffle_buffer": 0, "seed": 1}):
        config = _config(path, 0, 2, **options)
        start = resume_from_positions(saved["/job:worker/task:0"], saved, config, "/job:worker/task:0")
        assert start is not None and start.epoch == 1 and start.records_consumed == 0


def test_the_same_sharding_resumes_each_position_and_starts_a_worker_without_one_at_epoch_0(tmp_path: Path) -> None:
    path = _data(tmp_path)
    saved = _positions(path, (12 + 5,), workers=2)  # worker 1 had not pushed when the checkpoint was taken
    config0 = _config(path, 0, 2)
    start = resume_from_positions(saved["/job:worker/task:0"], saved, config0, "/job:worker/task:0")
    assert start is not None and start.to_json() == saved["/job:worker/task:0"]
    assert resume_from_positions(None, saved, _config(path, 1, 2), "/job:worker/task:1") is None
    assert resume_from_positions(None, {}, _config(path, 0, 2), "/job:worker/task:0") is None


def test_a_position_of_another_sharding_under_its_own_name_counts_too(tmp_path: Path) -> None:
    """Worker 0 of the new run pushed (its position fits), worker 1's is still the old run's: worker 1 starts
    at the epoch of the oldest position, not at epoch 0."""
    path = _data(tmp_path)
    old = _positions(path, (8 + 1, 8 * 2 + 3), workers=3)  # 30 records each per epoch: 8 batches
    config0 = _config(path, 0, 2)
    start0 = resume_from_positions(old["/job:worker/task:0"], old, config0, "/job:worker/task:0")
    assert start0 is not None and start0.epoch == 1
    new0 = _read(config0, start0, 2)[1]
    saved = {**old, "/job:worker/task:0": new0}
    start = resume_from_positions(saved["/job:worker/task:1"], saved, _config(path, 1, 2), "/job:worker/task:1")
    assert start is not None and start.epoch == 1


def test_a_worker_joining_after_the_others_resumed_starts_their_epoch(tmp_path: Path) -> None:
    """Workers 0 and 1 of 3 resumed 2-worker positions at epoch 1 and pushed before worker 2 joined: the ps
    tasks hold only their new positions (the old ones under their names are replaced). Worker 2 starts at
    epoch 1 too, not at 0 (seen in a real run: one worker's share trained an epoch more)."""
    path = _data(tmp_path)
    old = _positions(path, (12 + 4, 12 * 2 + 1))
    new = {}
    for worker in (0, 1):
        config = _config(path, worker, 3)
        start = resume_from_positions(old[f"/job:worker/task:{worker}"], old, config, f"/job:worker/task:{worker}")
        assert start is not None and start.epoch == 1 and start.start_epoch == 1
        records, new[f"/job:worker/task:{worker}"] = _read(config, start, 3)
        assert ReaderPosition.from_json(new[f"/job:worker/task:{worker}"]).start_epoch == 1  # kept as it reads
    config2 = _config(path, 2, 3)
    start = resume_from_positions(None, new, config2, "/job:worker/task:2")
    assert start is not None and start.epoch == 1
    assert _read(config2, start)[0] == 2 * 30  # its share of epochs 1 and 2
