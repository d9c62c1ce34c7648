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

import io
import json
from pathlib import Path

import pytest

from psflow.checkpoint.manifest import Manifest
from psflow.data import open_dataset
from psflow.data.api import DatasetConfig, ReaderPosition
from psflow.train.build import model_record
from psflow.train.config import TrainConfig
from psflow.train.duties import claim_checkpoint_dir, resume_from_positions

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
    old = _positions(path, (8 + 1, 8 * 2 + 3, 8 + 2), workers=3)  # 30 records each per epoch: 8 batches
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


def _claim(ckpt: Path, positions: dict[str, ReaderPosition], workers: int) -> str:
    """What the launcher prints before a run of ``workers`` workers resumes a checkpoint holding ``positions``."""
    config = TrainConfig.flat(train=("unused",), num_features=124, num_workers=workers, checkpoint_dir=str(ckpt))
    manifest = Manifest(global_step=10, variables={}, shards=[], model=model_record(config),
                        reader_positions={name: p.to_json() for name, p in positions.items()})
    (ckpt / "ckpt-000000010").mkdir(parents=True)
    (ckpt / "ckpt-000000010" / "manifest.json").write_text(manifest.to_json())
    (ckpt / "checkpoint").write_text(json.dumps({"latest": "ckpt-000000010", "all": ["ckpt-000000010"]}))
    out = io.StringIO()
    _, lock = claim_checkpoint_dir(config, out=out)
    assert lock is not None
    lock.release()
    return out.getvalue()


def test_the_console_says_nothing_when_every_worker_resumes_its_own_position(tmp_path: Path) -> None:
    """A run resumed from 3 workers onto 2 leaves worker 2's old position in its checkpoints (no worker of the
    new run replaces it); resumed again with 2 workers, each resumes its own position exactly: no line (it said
    every worker starts epoch 1)."""
    new = {f"/job:worker/task:{i}": ReaderPosition(epoch=3, worker_index=i, num_workers=2, start_epoch=1,
                                                   resharded=1, file_index=1, path="train.libsvm") for i in (0, 1)}
    stale = ReaderPosition(epoch=1, worker_index=2, num_workers=3, path="")
    assert _claim(tmp_path / "ckpt", {**new, "/job:worker/task:2": stale}, 2) == ""


def test_the_console_names_the_workers_that_start_the_epoch_when_the_others_resume_their_own(tmp_path: Path) -> None:
    """Worker 0 of the new run had pushed when the checkpoint was taken, worker 1 had not: only worker 1 starts
    the epoch from its beginning."""
    positions = {"/job:worker/task:0": ReaderPosition(epoch=1, worker_index=0, num_workers=2, start_epoch=1,
                                                         resharded=1),
                 "/job:worker/task:1": ReaderPosition(epoch=2, worker_index=1, num_workers=3)}
    line = _claim(tmp_path / "ckpt", positions, 2)
    assert line.count("\n") == 1 and "(workers, shuffle buffer, seed) = (3, 0, 0); this run has (2, 0, 0)" in line
    assert "so worker 1 starts epoch 1 of its share from its beginning" in line, line
    # The same with 3 workers, worker 2 without a position at all: workers 1 and 2 start the epoch.
    three = {"/job:worker/task:0": ReaderPosition(epoch=1, worker_index=0, num_workers=3, start_epoch=1,
                                                     resharded=1),
             "/job:worker/task:1": ReaderPosition(epoch=2, worker_index=1, num_workers=2)}
    line = _claim(tmp_path / "three", three, 3)
    assert "(2, 0, 0); this run has (3, 0, 0)" in line and "so workers 1, 2 start epoch 1 of their shares" in line, line


def test_positions_left_by_a_run_before_the_last_resharding_do_not_count(tmp_path: Path) -> None:
    """3 workers, then 2 (worker 2's 3-worker position stays: no worker of the 2-worker run replaces it), then 3
    again: every worker starts the epoch the 2-worker run had reached. Before, worker 2 resumed its old position
    (epoch 1, which the 2-worker run had trained) and workers 0 and 1 started epoch 0 (that position's
    start_epoch 0 counted as where this sharding's workers started)."""
    path = _data(tmp_path)
    old = _positions(path, (8 + 1, 8 + 1, 8 + 1), workers=3)  # all 1 batch into epoch 1
    saved = dict(old)
    for worker in (0, 1):
        name = f"/job:worker/task:{worker}"
        start = resume_from_positions(old[name], old, _config(path, worker, 2), name)
        assert start is not None and start.epoch == 1 and start.resharded == 1
        saved[name] = _read(_config(path, worker, 2), start, 12 + 1)[1]  # all of epoch 1, 1 batch into epoch 2
    total = 0
    for worker in range(3):
        name = f"/job:worker/task:{worker}"
        start = resume_from_positions(saved.get(name), saved, _config(path, worker, 3), name)
        assert start is not None and (start.epoch, start.records_consumed, start.resharded) == (2, 0, 2), start
        total += _read(_config(path, worker, 3), start)[0]
    assert total == RECORDS  # epoch 2 alone


def test_a_worker_of_a_resharded_run_that_left_no_position_holds_the_epoch_back(tmp_path: Path) -> None:
    """2 workers, then 3 (only worker 0 had pushed when the checkpoint was taken), then 4: workers 1 and 2 of the
    3-worker run read nothing after the epoch it started (1), so the 4-worker run starts that epoch, not the
    one worker 0 had reached (2)."""
    path = _data(tmp_path)
    old = _positions(path, (12 + 1, 12 + 1))  # 2 workers, 1 batch into epoch 1
    start = resume_from_positions(old["/job:worker/task:0"], old, _config(path, 0, 3), "/job:worker/task:0")
    assert start is not None and start.epoch == 1
    saved = {**old, "/job:worker/task:0": _read(_config(path, 0, 3), start, 8 + 1)[1]}  # 1 batch into epoch 2
    start = resume_from_positions(None, saved, _config(path, 3, 4), "/job:worker/task:3")
    assert start is not None and start.epoch == 1 and start.resharded == 2


IN_GRAPH = "in-graph client"


@pytest.mark.parametrize("before, after", [("/job:worker/task:0", IN_GRAPH), (IN_GRAPH, "/job:worker/task:0")])
def test_the_same_share_under_another_client_name_resumes_exactly(tmp_path: Path, before: str, after: str) -> None:
    """A 1-worker between-graph run and an in-graph run (whose client reads alone) read the same share under
    the same sharding, their positions under different names: one resuming the other's checkpoint started at
    epoch 0 and trained every epoch again (a9a, 1 epoch then in-graph --epochs 2: 65,122 examples, not 32,561)."""
    path = _data(tmp_path)
    config = _config(path, 0, 1)
    read, position = _read(config, None, 30)  # the first epoch (23 batches) and 28 records into the second
    assert read == RECORDS + 28
    resumed = resume_from_positions(None, {before: position}, config, after)
    assert resumed is not None and resumed.to_json() == position
    assert _read(config, resumed)[0] == EPOCHS * RECORDS - read


def test_an_own_position_behind_the_same_share_read_further_under_another_name_is_not_taken(tmp_path: Path) -> None:
    """Between-graph to epoch 1, in-graph further (its own name), then between-graph again: the between-graph
    worker's own position is the older reading of the share; the newer one resumes."""
    path = _data(tmp_path)
    config = _config(path, 0, 1)
    _, older = _read(config, None, 10)
    _, newer = _read(config, ReaderPosition.from_json(older), 40)
    resumed = resume_from_positions(older, {"/job:worker/task:0": older, IN_GRAPH: newer}, config,
                                    "/job:worker/task:0")
    assert resumed is not None and resumed.to_json() == newer
