"""Labels a model does not accept are bad records naming file and record; every batch names its source
(issue 25, item 7)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from support import in_fresh_process

from psflow.data import (
    BINARY_LABELS,
    BadRecordError,
    Batch,
    BatchSource,
    DatasetConfig,
    LabelSpec,
    TFRecordWriter,
    TooManyBadRecordsError,
    encode_example,
    open_dataset,
    read_all,
)
from psflow.data.schema import Schema

SCHEMA = Schema.from_flags(["C1:int64:100"])


def write_tfrecord(path: Path, labels: list[float]) -> str:
    with TFRecordWriter(str(path)) as writer:
        for k, label in enumerate(labels):
            writer.write(encode_example({"label": ("float32", [label]), "C1": ("int64", [k % 100])}))
    return str(path)


def write_libsvm(path: Path, labels: list[str]) -> str:
    path.write_text("".join(f"{label} {k % 7 + 1}:1 9:0.5\n" for k, label in enumerate(labels)))
    return str(path)


# ---- LabelSpec --------------------------------------------------------------------------------
def test_label_spec_refuses_non_finite_labels_always_and_the_rest_by_its_range() -> None:
    labels = np.array([0.0, 1.0, 7.0, -1.0, 0.5, np.nan, np.inf, -np.inf], dtype=np.float32)
    assert LabelSpec().rejects(labels).tolist() == [False, False, False, False, False, True, True, True]
    assert BINARY_LABELS.rejects(labels).tolist() == [False, False, True, True, True, True, True, True]
    classes = LabelSpec(0, 9, integer=True)
    assert classes.rejects(labels).tolist() == [False, False, False, True, True, True, True, True]
    assert BINARY_LABELS.binary and not classes.binary and not LabelSpec().binary
    assert classes.describe() == "an integer in [0, 9]" and LabelSpec().describe() == "a finite number"


def test_a_binary_spec_takes_libsvm_minus_one_as_written() -> None:
    written = np.array([-1.0, 0.0, 1.0, 2.0, 7.0, -3.0])
    assert BINARY_LABELS.rejects(written, libsvm=True).tolist() == [False, False, False, True, True, True]
    # Other specs see what the reader makes of LIBSVM labels (0.0/1.0).
    assert not LabelSpec(0, 1).rejects(written, libsvm=True).any()


def test_label_spec_refuses_a_backwards_range() -> None:
    with pytest.raises(ValueError, match="low <= high"):
        LabelSpec(1, 0)
    with pytest.raises(ValueError, match="labels must be a LabelSpec"):
        DatasetConfig(("x",), "libsvm", labels="binary")  # type: ignore[arg-type]


# ---- labels in files --------------------------------------------------------------------------
def test_a_nan_label_in_a_tfrecord_is_a_bad_record_naming_file_and_record(tmp_path: Path) -> None:
    path = write_tfrecord(tmp_path / "nan.tfrecord", [0.0, 1.0, 1.0, math.nan, 0.0])
    with pytest.raises(BadRecordError, match=r"nan.tfrecord: record 3 at byte \d+: label nan is not one the model "
                                             r"accepts: want a finite number") as caught:
        read_all(path, "tfrecord", schema=SCHEMA)
    assert caught.value.record == 3 and caught.value.path == path
    batch = read_all(path, "tfrecord", schema=SCHEMA, skip_bad_records=True)
    assert batch.labels.tolist() == [0.0, 1.0, 1.0, 0.0]
    assert batch.column("C1").ids.tolist() == [0, 1, 2, 4]  # the other features lose the same record


def test_a_label_of_7_is_refused_by_a_binary_model_only(tmp_path: Path) -> None:
    path = write_tfrecord(tmp_path / "seven.tfrecord", [0.0, 7.0, 1.0])
    assert read_all(path, "tfrecord", schema=SCHEMA).labels.tolist() == [0.0, 7.0, 1.0]  # any finite label
    with pytest.raises(BadRecordError, match=r"seven.tfrecord: record 1 at byte \d+: label 7 is not one the model "
                                             r"accepts: want 0 or 1 \(a binary model\)"):
        read_all(path, "tfrecord", schema=SCHEMA, labels=BINARY_LABELS)


def test_libsvm_labels_other_than_minus_one_zero_one_are_bad_records_for_a_binary_model(tmp_path: Path) -> None:
    path = write_libsvm(tmp_path / "a.libsvm", ["+1", "-1", "0", "1", "2", "-1"])
    assert read_all(path, "libsvm").labels.tolist() == [1, 0, 0, 1, 1, 0]  # read as binary classes, as before
    with pytest.raises(BadRecordError, match=r"a.libsvm:5: label 2 is not one the model accepts: want -1, 0 or \+1"):
        read_all(path, "libsvm", labels=BINARY_LABELS)
    kept = read_all(path, "libsvm", labels=BINARY_LABELS, skip_bad_records=True)
    assert kept.labels.tolist() == [1, 0, 0, 1, 0]


def test_bad_labels_count_against_max_bad_records(tmp_path: Path) -> None:
    path = write_libsvm(tmp_path / "b.libsvm", ["1", "7", "0", "3", "5"])
    config = DatasetConfig((path,), "libsvm", labels=BINARY_LABELS, skip_bad_records=True, max_bad_records=2)
    with pytest.raises(TooManyBadRecordsError, match=r"3 bad records in one epoch exceeds max_bad_records=2; "
                                                    r"last: .*b.libsvm:5: label 5"), open_dataset(config, start=False) as d:
        list(d)


def test_predict_reads_labels_unchecked(tmp_path: Path) -> None:
    path = write_tfrecord(tmp_path / "p.tfrecord", [math.nan, 7.0])
    assert read_all(path, "tfrecord", schema=SCHEMA, labels=None).num_examples == 2


# ---- batch sources ----------------------------------------------------------------------------
def sources(config: DatasetConfig, **kwargs: object) -> list[BatchSource]:
    with open_dataset(config, start=True, **kwargs) as dataset:  # type: ignore[arg-type]
        out = []
        for batch in dataset:
            assert batch.source is not None
            out.append(batch.source)
        return out


def test_each_batch_names_its_file_and_lines(tmp_path: Path) -> None:
    a = write_libsvm(tmp_path / "a.libsvm", ["1"] * 25)
    b = write_libsvm(tmp_path / "b.libsvm", ["0"] * 10)
    got = sources(DatasetConfig((a, b), "libsvm", batch_size=10, num_epochs=2))
    assert [s.spans for s in got[:4]] == [((a, 1, 10, 10),), ((a, 11, 20, 10),), ((a, 21, 25, 5), (b, 1, 5, 5)),
                                         ((b, 6, 10, 5),)]
    assert [s.epoch for s in got] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert got[2].describe() == f"{a} lines 21-25; {b} lines 1-5, epoch 0"


def test_tfrecord_batches_name_record_indices_and_a_worker_its_own_records(tmp_path: Path) -> None:
    path = write_tfrecord(tmp_path / "r.tfrecord", [0.0, 1.0] * 10)
    got = sources(DatasetConfig((path,), "tfrecord", schema=SCHEMA, batch_size=4, num_workers=2, worker_index=1))
    assert [s.spans for s in got] == [((path, 1, 7, 4),), ((path, 9, 15, 4),), ((path, 17, 19, 2),)]
    assert got[0].describe() == f"{path}: 4 records of records 1-7, epoch 0"


def test_a_shuffled_batch_names_each_file_with_its_range(tmp_path: Path) -> None:
    paths = [write_libsvm(tmp_path / f"{k}.libsvm", ["1"] * 30) for k in range(6)]
    config = DatasetConfig(tuple(paths), "libsvm", batch_size=64, shuffle_buffer=180, seed=3)
    with open_dataset(config, start=False) as dataset:
        batches = list(dataset)
    assert sum(b.num_examples for b in batches) == 180
    for batch in batches:
        source = batch.source
        assert source is not None and len(source.spans) <= BatchSource.MAX_SPANS
        assert sum(n for *_, n in source.spans) <= batch.num_examples and source.files >= len(source.spans)
        for path, first, last, count in source.spans:
            assert path in paths and 1 <= first <= last <= 30 and 1 <= count <= last - first + 1
    widest = max(batches, key=lambda b: b.source.files if b.source else 0).source
    assert widest is not None and widest.files > BatchSource.MAX_SPANS
    assert f"and {widest.files - BatchSource.MAX_SPANS} more files" in widest.describe()


def test_the_source_crosses_the_reader_process_and_a_prepare_that_builds_a_new_batch(tmp_path: Path) -> None:
    path = write_libsvm(tmp_path / "a.libsvm", ["1", "0"] * 10)

    def rebuild(batch: Batch) -> Batch:  # a user model's prepare that does not keep the source itself
        return Batch(batch.labels, batch.sparse, batch.dense, {"n": np.array([batch.num_examples])})

    config = DatasetConfig((path,), "libsvm", batch_size=8)
    want = [((path, 1, 8, 8),), ((path, 9, 16, 8),), ((path, 17, 20, 4),)]
    assert [s.spans for s in sources(config, prepare=rebuild)] == want
    forked = in_fresh_process(sources, DatasetConfig((path,), "libsvm", batch_size=8, reader_process=True))
    assert [s.spans for s in forked] == want


def test_psflow_predict_reads_an_unlabelled_file(tmp_path: Path) -> None:
    from psflow.export import ExportedModel
    from psflow.models import ModelConfig, create_model

    path = write_tfrecord(tmp_path / "p.tfrecord", [math.nan, 7.0])  # placeholders where there is no label
    model = create_model("logistic", ModelConfig(num_features=124))
    exported = ExportedModel(model, {}, 0, {"format": "tfrecord", "schema": SCHEMA.to_dict(), "num_features": 124})
    assert exported.read(path).num_examples == 2
