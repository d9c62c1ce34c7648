"""Sharding: every record is read by exactly one worker per epoch."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from psflow.data import Batch, DataError, DatasetConfig, WorkerShard, expand_paths, open_dataset, shard_plan
from psflow.data.sharding import epoch_file_order

SIZES = {1: [23], 2: [17, 0], 7: [5, 9, 1, 0, 12, 7, 3]}  # some files empty or shorter than the worker count


@pytest.mark.parametrize("fmt", ["libsvm", "tfrecord"])
@pytest.mark.parametrize("num_files", [1, 2, 7])
@pytest.mark.parametrize("num_workers", [1, 2, 3, 5])
@pytest.mark.parametrize("shuffle", [0, 4])
def test_every_record_read_exactly_once_per_epoch(
    numbered_files: Callable[..., list[str]],
    example_keys: Callable[[Batch], list[int]],
    fmt: str,
    num_files: int,
    num_workers: int,
    shuffle: int,
) -> None:
    sizes = SIZES[num_files]
    paths = numbered_files(fmt, sizes, blank_every=3)
    seen: Counter[tuple[int, int]] = Counter()
    for worker in range(num_workers):
        config = DatasetConfig(
            (str(Path(paths[0]).parent / "part-*"),),
            fmt,
            batch_size=4,
            num_epochs=2,
            shuffle_buffer=shuffle,
            worker_index=worker,
            num_workers=num_workers,
            prefetch=1,
        )
        with open_dataset(config, start=True) as dataset:
            for batch in dataset:
                epoch = dataset.position().epoch  # the batch's epoch: a batch never spans two
                seen.update((epoch, k) for k in example_keys(batch))
    assert seen == Counter({(e, k): 1 for e in range(2) for k in range(sum(sizes))})


def test_plan_is_pure_and_documented() -> None:
    files = [f"f{i}" for i in range(7)]
    plan = shard_plan(list(reversed(files)), 3)
    assert [p.paths for p in plan] == [("f0", "f3", "f6"), ("f1", "f4"), ("f2", "f5")]
    assert all(p.record_stride == 1 for p in plan)
    small = shard_plan(["b", "a"], 5)
    assert all(p.paths == ("a", "b") and p.record_stride == 5 for p in small)
    assert [p.first_records for p in small] == [(0, 4), (1, 0), (2, 1), (3, 2), (4, 3)]
    owners = [[w for w in range(5) if small[w].owns(j, r)] for j in range(2) for r in range(12)]
    assert all(len(o) == 1 for o in owners)
    assert shard_plan(["a", "b"], 5) == small
    with pytest.raises(ValueError):
        shard_plan([], 2)


def test_file_order_is_seeded_per_epoch() -> None:
    shard = WorkerShard(0, 1, tuple(f"f{i}" for i in range(8)), tuple(range(8)), 1, (0,) * 8)
    assert epoch_file_order(shard, 0, shuffle=False, seed=1) == list(range(8))
    orders = [epoch_file_order(shard, e, shuffle=True, seed=1) for e in range(4)]
    assert all(sorted(o) == list(range(8)) for o in orders)
    assert len({tuple(o) for o in orders}) > 1
    assert orders == [epoch_file_order(shard, e, shuffle=True, seed=1) for e in range(4)]


def test_expand_paths(tmp_path: Path) -> None:
    for name in ("b.txt", "a.txt", "c.dat"):
        (tmp_path / name).write_text("1 1:1\n")
    got = expand_paths([str(tmp_path / "*.txt"), str(tmp_path / "a.txt")])
    assert got == [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    with pytest.raises(DataError, match="no files match"):
        expand_paths([str(tmp_path / "*.none")])
    with pytest.raises(DataError, match="no such file"):
        expand_paths([str(tmp_path / "missing.txt")])
