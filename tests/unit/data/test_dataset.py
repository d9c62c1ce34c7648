"""Dataset: epochs, batching, shuffle, exact resume, prefetch thread, bad-record policy."""

from __future__ import annotations

import gzip
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import same_batches
from support import in_fresh_process

from psflow.data import (
    BadRecordError,
    Batch,
    DataError,
    DatasetConfig,
    ReaderPosition,
    TooManyBadRecordsError,
    open_dataset,
    read_all,
)

Keys = Callable[[Batch], list[int]]


def _config(paths: list[str], fmt: str, **kw: Any) -> DatasetConfig:
    return DatasetConfig(tuple(paths), fmt, **kw)


def _run(config: DatasetConfig, **kw: Any) -> list[Batch]:
    with open_dataset(config, start=True, **kw) as dataset:
        return list(dataset)


def _same_batches(a: list[Batch], b: list[Batch]) -> bool:
    return same_batches(a, b)


def test_batches_epochs_and_remainder(numbered_files: Callable[..., list[str]], example_keys: Keys) -> None:
    paths = numbered_files("libsvm", [7, 6])
    batches = _run(_config(paths, "libsvm", batch_size=5, num_epochs=2))
    assert [b.num_examples for b in batches] == [5, 5, 3, 5, 5, 3]  # batches never span epochs
    assert [k for b in batches for k in example_keys(b)] == list(range(13)) * 2
    dropped = _run(_config(paths, "libsvm", batch_size=5, num_epochs=2, drop_remainder=True))
    assert [b.num_examples for b in dropped] == [5, 5, 5, 5]
    assert _run(_config(paths, "libsvm", num_epochs=0)) == []
    for batch in batches:
        batch.validate()


def test_unbounded_epochs(numbered_files: Callable[..., list[str]], example_keys: Keys) -> None:
    paths = numbered_files("tfrecord", [3])
    with open_dataset(_config(paths, "tfrecord", batch_size=2, num_epochs=None), start=True) as dataset:
        keys = [example_keys(next(dataset)) for _ in range(7)]
        assert dataset.position().epoch == 3
    assert keys == [[0, 1], [2], [0, 1], [2], [0, 1], [2], [0, 1]]


def test_unbounded_epochs_over_an_empty_share_fail_instead_of_spinning(numbered_files: Callable[..., list[str]]) -> None:
    paths = numbered_files("libsvm", [1])
    config = _config(paths, "libsvm", num_epochs=None, worker_index=1, num_workers=2)  # worker 1 owns nothing
    with pytest.raises(DataError, match="would never yield a batch"):
        _run(config)


def test_shuffle_is_a_seeded_permutation_per_epoch(numbered_files: Callable[..., list[str]], example_keys: Keys) -> None:
    paths = numbered_files("libsvm", [40, 25, 35])
    config = _config(paths, "libsvm", batch_size=16, num_epochs=3, shuffle_buffer=20, seed=7)
    runs = [[k for b in _run(config) for k in example_keys(b)] for _ in range(2)]
    assert runs[0] == runs[1]  # deterministic
    epochs = [runs[0][i * 100 : (i + 1) * 100] for i in range(3)]
    assert all(sorted(e) == list(range(100)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2] and epochs[0] != list(range(100))
    other = [k for b in _run(replace(config, seed=8)) for k in example_keys(b)]
    assert other != runs[0]
    one_in_one_out = _run(replace(config, min_after_dequeue=19))
    assert sorted(k for b in one_in_one_out for k in example_keys(b)) == sorted(runs[0])


def test_output_does_not_depend_on_block_size_or_prefetch(numbered_files: Callable[..., list[str]]) -> None:
    paths = numbered_files("tfrecord", [30, 11])
    config = _config(paths, "tfrecord", batch_size=7, num_epochs=2, shuffle_buffer=9)
    reference = _run(config)
    for block_size, prefetch in ((13, 0), (100, 1), (1 << 20, 5)):
        assert _same_batches(_run(replace(config, block_size=block_size, prefetch=prefetch)), reference)


def _files_for(fmt: str, tmp_path: Path, numbered_files: Callable[..., list[str]], criteo_line: str) -> tuple[list[str], str]:
    if fmt == "criteo":
        rng = np.random.default_rng(0)
        paths = []
        for i, n in enumerate((23, 17)):
            lines = [criteo_line.replace("\t5\t", f"\t{int(v)}\t", 1) for v in rng.integers(-5, 10**6, n)]
            path = tmp_path / f"day-{i}.tsv"
            path.write_text("".join(lines))
            paths.append(str(path))
        return paths, "criteo"
    if fmt == "tfrecord-gzip":
        paths = []
        for path in numbered_files("tfrecord", [23, 0, 17]):
            with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            paths.append(path + ".gz")
        return paths, "tfrecord"
    return numbered_files(fmt, [23, 0, 17], blank_every=4), fmt


CRITEO_LINE = "1\t5\t-2\t\t0\t3\t1000000\t\t\t\t\t\t\t\t68fd1e64\t\tabc\t0123456789abcdef01\t" + "\t".join(["deadbeef"] * 22) + "\n"


@pytest.mark.parametrize("fmt", ["libsvm", "tfrecord", "tfrecord-gzip", "criteo"])
@pytest.mark.parametrize("shuffle", [0, 6])
def test_resume_yields_exactly_the_rest(tmp_path: Path, numbered_files: Callable[..., list[str]], fmt: str, shuffle: int) -> None:
    paths, fmt = _files_for(fmt, tmp_path, numbered_files, CRITEO_LINE)
    config = _config(paths, fmt, batch_size=4, num_epochs=3, shuffle_buffer=shuffle, seed=3, block_size=64, prefetch=2)
    full = _run(config)
    assert sum(b.num_examples for b in full) == 120
    for stop in range(len(full) + 1):  # every batch boundary, epoch ends and the very end included
        with open_dataset(config, start=True) as dataset:
            head = [next(dataset) for _ in range(stop)]
            position = dataset.position()
        restored = ReaderPosition.from_json(position.to_json())
        assert restored == position
        tail = _run(config, resume_from=restored)
        assert _same_batches(head + tail, full), (stop, position)


def test_resume_twice_and_position_fields(numbered_files: Callable[..., list[str]], example_keys: Keys) -> None:
    paths = numbered_files("libsvm", [10, 10])
    config = _config(paths, "libsvm", batch_size=3, num_epochs=2)
    with open_dataset(config, start=False) as dataset:
        assert dataset.position() == ReaderPosition(path=paths[0])
        next(dataset)
        first = dataset.position()
    assert (first.epoch, first.file_index, first.path, first.record_index, first.records_consumed) == (0, 0, paths[0], 3, 3)
    assert first.offset == len("".join(f"{k % 2} " + " ".join(f"{10 * k + j}:1" for j in range(k % 3 + 1)) + "\n" for k in range(3)))
    with open_dataset(config, start=True, resume_from=first) as dataset:
        for _ in range(3):
            next(dataset)
        second = dataset.position()
    assert (second.file_index, second.record_index, second.records_consumed) == (1, 2, 12)
    rest = [k for b in _run(config, resume_from=second) for k in example_keys(b)]
    assert rest == list(range(12, 20)) + list(range(20))


def test_resume_refuses_a_different_setup(numbered_files: Callable[..., list[str]], tmp_path: Path) -> None:
    paths = numbered_files("libsvm", [10, 10])
    config = _config(paths, "libsvm", batch_size=3, shuffle_buffer=4)
    with open_dataset(config, start=True) as dataset:
        next(dataset)
        position = dataset.position()
    for change, message in (
        ({"num_workers": 2}, "num_workers=1"),
        ({"seed": 5}, "seed=0"),
        ({"shuffle_buffer": 8}, "shuffle_buffer=4"),
        ({"min_after_dequeue": 1}, "min_after_dequeue=2"),
    ):
        with pytest.raises(DataError, match=message):
            open_dataset(replace(config, **change), start=False, resume_from=position)
    moved = replace(position, path=str(tmp_path / "elsewhere.txt"))
    with pytest.raises(DataError, match="did the files change"):
        open_dataset(config, start=False, resume_from=moved)
    with pytest.raises(DataError, match="not a reader position"):
        ReaderPosition.from_json('{"epoch": "x"')


@pytest.mark.parametrize("prefetch", [0, 2])
def test_thread_error_keeps_type_and_message(tmp_path: Path, prefetch: int) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("1 1:1\n" * 50 + "1 oops\n")
    config = _config([str(path)], "libsvm", batch_size=10, prefetch=prefetch)
    with open_dataset(config, start=True) as dataset:
        with pytest.raises(BadRecordError) as info:
            list(dataset)
        assert str(info.value) == f"{path}:51: malformed token 'oops' (want <id>:<value>)"
        assert info.value.record == 51
        with pytest.raises(BadRecordError):  # and it keeps failing
            next(dataset)


def test_close_never_hangs_and_stops_the_thread(numbered_files: Callable[..., list[str]]) -> None:
    paths = numbered_files("libsvm", [200])
    config = _config(paths, "libsvm", batch_size=1, num_epochs=None, prefetch=2)
    dataset = open_dataset(config, start=True)
    name = f"psflow-data-w{config.worker_index}"
    next(dataset)
    time.sleep(0.1)  # the thread is now blocked on the full queue
    dataset.close()  # returns although the thread was blocked (a hang is caught by the test timeout)
    dataset.close()  # idempotent
    assert not any(t.name == name and t.is_alive() for t in threading.enumerate())
    with pytest.raises(DataError, match="closed"):
        next(dataset)


def test_start_false_defers_the_thread(numbered_files: Callable[..., list[str]]) -> None:
    paths = numbered_files("libsvm", [5])
    config = _config(paths, "libsvm", worker_index=0, prefetch=1)
    dataset = open_dataset(config, start=False)
    try:
        assert not any(t.name == "psflow-data-w0" for t in threading.enumerate())
        assert next(dataset).num_examples == 5
    finally:
        dataset.close()


def test_bad_record_limit_is_per_epoch(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("1 1:1\nx\n1 2:1\ny\n")
    config = _config([str(path)], "libsvm", num_epochs=3, skip_bad_records=True, max_bad_records=2)
    with open_dataset(config, start=True) as dataset:
        assert sum(b.num_examples for b in dataset) == 6
        stats = dataset.stats
    assert stats.bad_records == 6 and stats.records_read == 6 and stats.batches == 3
    assert stats.per_file[str(path)].bad_records == 6
    with pytest.raises(TooManyBadRecordsError) as info:
        _run(replace(config, max_bad_records=1))
    assert info.value.count == 2 and f"{path}:4:" in str(info.value)


def test_missing_required_feature_is_a_bad_record(tmp_path: Path) -> None:
    from psflow.data import TFRecordWriter, encode_example

    path = tmp_path / "x.tfrecord"
    with TFRecordWriter(str(path)) as writer:
        writer.write(encode_example({"label": ("float32", [1.0]), "ids": ("int64", [1]), "values": ("float32", [2.0])}))
        writer.write(encode_example({"ids": ("int64", [2]), "values": ("float32", [1.0])}))
    with pytest.raises(BadRecordError, match=r"x.tfrecord: record 1 at byte \d+: missing required feature 'label'"):
        read_all(str(path), "tfrecord")
    assert read_all(str(path), "tfrecord", skip_bad_records=True).column().ids.tolist() == [1]


def test_config_validation() -> None:
    with pytest.raises(TypeError, match="sequence of paths"):
        DatasetConfig("a.txt", "libsvm")  # type: ignore[arg-type]
    with pytest.raises(ValueError) as info:
        DatasetConfig(("a",), "csv", batch_size=0, worker_index=3, num_workers=2, shuffle_buffer=4, min_after_dequeue=4)
    for part in ("format 'csv'", "batch_size (0)", "worker_index (3)", "min_after_dequeue (4)"):
        assert part in str(info.value)
    assert DatasetConfig(("a",), "libsvm", shuffle_buffer=10).effective_min_after_dequeue == 5


def test_stats_count_records_per_file(numbered_files: Callable[..., list[str]]) -> None:
    paths = numbered_files("libsvm", [4, 6])
    with open_dataset(_config(paths, "libsvm", num_epochs=2), start=True) as dataset:
        list(dataset)
        stats = dataset.stats
    assert stats.records_read == 20
    assert Counter({p: s.records for p, s in stats.per_file.items()}) == Counter({paths[0]: 8, paths[1]: 12})


def _write_examples(path: Path, features: list[dict[str, tuple[str, Any]]]) -> None:
    from psflow.data import TFRecordWriter, encode_example

    with TFRecordWriter(str(path)) as writer:
        for f in features:
            writer.write(encode_example(f))


def test_a_schema_feature_the_data_lacks_is_named(tmp_path: Path) -> None:
    from psflow.data import Schema

    path = tmp_path / "x.tfrecord"
    _write_examples(path, [{"label": ("float32", [1.0]), "ids": ("int64", [k])} for k in range(5)])
    schema = Schema.from_flags(["ids:int64", "site:string:10"])
    with pytest.raises(DataError, match=r"x.tfrecord: the schema names feature 'site', but none of the 5 records of "
                                        r"the file's first chunk has it; .*optional: true"):
        read_all(str(path), "tfrecord", schema=schema)
    with pytest.raises(DataError, match="names feature 'q', but none .* has Example key 'qv'"):
        read_all(str(path), "tfrecord", schema=Schema.from_flags(["q:sparse:ids:qv"]))
    optional = Schema.from_dict({"features": {"label": {"kind": "fixed"}, "ids": {"kind": "varlen"},
                                              "site": {"kind": "varlen", "dtype": "string", "hash_buckets": 10, "optional": True}}})
    batch = read_all(str(path), "tfrecord", schema=optional)
    assert batch.sparse["site"].nnz == 0 and batch.sparse["ids"].ids.tolist() == [0, 1, 2, 3, 4]


def test_a_multi_feature_tfrecord_dataset_resumes_exactly(tmp_path: Path) -> None:
    from psflow.data import Schema

    rng = np.random.default_rng(5)
    path = tmp_path / "m.tfrecord"
    _write_examples(path, [{"label": ("float32", [k % 2]), "d": ("float32", rng.standard_normal(2)),
                            "a": ("int64", rng.integers(0, 50, k % 3)), "s": ("bytes", [b"x%d" % (k % 7)])} for k in range(60)])
    schema = Schema.from_flags(["d:float:2", "a:int64:50", "s:string:11"])
    config = _config([str(path)], "tfrecord", batch_size=7, num_epochs=2, shuffle_buffer=9, seed=2, block_size=200, schema=schema)
    full = _run(config)
    assert list(full[0].sparse) == ["a", "s"] and full[0].dense["d"].shape == (7, 2)
    for stop in (1, 5, 9, len(full) - 1):
        with open_dataset(config, start=True) as dataset:
            head = [next(dataset) for _ in range(stop)]
            position = dataset.position()
        assert _same_batches(head + _run(config, resume_from=position), full)
    # forked in a fresh process: never from the pytest process, where earlier tests may leave gRPC running
    assert _same_batches(in_fresh_process(_run, replace(config, reader_process=True, prefetch=2)), full)


@pytest.mark.parametrize("fmt", ["libsvm", "criteo", "tfrecord"])
def test_an_empty_file_reads_as_an_empty_batch_with_every_feature(tmp_path: Path, fmt: str) -> None:
    from psflow.data import BatchSpec, Schema, batch_spec

    path = tmp_path / "empty"
    path.write_bytes(b"")
    schema = Schema.from_flags(["d:float:2", "a:int64", "s:string:5"]) if fmt == "tfrecord" else None
    batch = read_all(str(path), fmt, schema=schema, num_features=64) if schema else read_all(str(path), fmt, num_features=64)
    spec = batch_spec(fmt, schema, 64)
    assert batch.num_examples == 0 and list(batch.sparse) == list(spec.sparse) and list(batch.dense) == list(spec.dense)
    assert spec != BatchSpec()
    if schema is not None:
        assert batch.dense["d"].shape == (0, 2) and batch.dense["d"].dtype == np.float32
    batch.validate()


def test_a_schema_that_does_not_fit_a_batch_is_refused_by_the_config() -> None:
    from psflow.data import FixedLenFeature, Schema, VarLenFeature

    schema = Schema({"label": FixedLenFeature(), "w": VarLenFeature("float32")})
    with pytest.raises(ValueError, match="invalid DatasetConfig: schema: feature 'w': a float32 VarLenFeature"):
        DatasetConfig(("a",), "tfrecord", schema=schema)


def test_garbage_records_are_bad_records_not_a_missing_feature(tmp_path: Path) -> None:
    from psflow.data import TFRecordWriter

    path = tmp_path / "g.tfrecord"
    with TFRecordWriter(str(path)) as writer:
        for _ in range(3):
            writer.write(b"\xff\xfe not an Example")
    with pytest.raises(BadRecordError, match=r"g.tfrecord: record 0 at byte 0: malformed Example"):
        read_all(str(path), "tfrecord")


@pytest.mark.parametrize("shuffled", [False, True])
def test_position_json_is_every_field_sorted(shuffled: bool) -> None:
    """to_json writes every field (the shuffle state's members as base64) with sorted keys, and reads back equal."""
    import base64
    import dataclasses
    import json

    from psflow.data.api import ReaderPosition, ShuffleState

    shuffle = ShuffleState(burst=3, first_seq=40, num_seqs=12, members=b"\x05\xff", taken=2) if shuffled else None
    position = ReaderPosition(2, 1, "/data/train-00001.tfrecord", 123456, 789, 1000, 1, 2, 64, 16, 7, shuffle)
    want = dataclasses.asdict(position)
    if shuffle is not None:
        want["shuffle"]["members"] = base64.b64encode(shuffle.members).decode("ascii")
    assert position.to_json() == json.dumps(want, sort_keys=True)
    assert ReaderPosition.from_json(position.to_json()) == position
