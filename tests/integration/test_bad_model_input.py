"""Bad input to a model gets an error naming the feature, variable or id, and nothing stored changes.

Each case first trains a good run that leaves checkpoints, then starts a bad
run on the same checkpoint directory (the chief restores from it and trains
on: ``--epochs 2`` gives the worker, whose saved position is the end of the
good run's one epoch, a second epoch to read from the start of its data): the
run fails, the error names what is wrong, and every checkpoint file is
byte-for-byte what the good run left.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from support import A9A, run_cli

from psflow.data import TFRecordWriter, encode_example

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def stored(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def train(tmp_path: Path, name: str, *args: str) -> tuple[int, str]:
    r = run_cli("train", "--ps", "2", "--workers", "1", "--quiet", "--checkpoint-dir", str(tmp_path / "ckpt"),
                "--output", str(tmp_path / name), *args)
    return r.returncode, r.stderr


def write_records(path: Path, ids: list[list[int]]) -> None:
    """Examples with a label and one id-list feature C1 (4 examples per id list given, labels alternating)."""
    with TFRecordWriter(str(path)) as writer:
        for k, row in enumerate(ids * 4):
            writer.write(encode_example({"label": ("float32", [float(k % 2)]), "C1": ("int64", row)}))


def test_a_model_asking_for_a_variable_it_did_not_declare(tmp_path: Path) -> None:
    common = ("--train", str(A9A), "--num-features", "124")
    code, err = train(tmp_path, "good", *common, "--max-steps", "5")
    assert code == 0, err[-3000:]
    before = stored(tmp_path / "ckpt")
    bad = ("--max-steps", "20", "--model", "tests.integration.models_for_tests:AsksUndeclared")
    # On the good run's checkpoints: another model's checkpoint is refused before any task starts.
    code, err = train(tmp_path, "bad", *common, *bad)
    assert code == 1
    assert "was written with another model: --model 'logistic'" in err, err[-3000:]
    assert stored(tmp_path / "ckpt") == before
    # On a directory of its own: the lookup of the undeclared variable fails the run, naming it.
    code, err = train(tmp_path, "bad2", *common, *bad, "--checkpoint-dir", str(tmp_path / "ckpt2"))
    assert code == 1
    assert "model 'tests.integration.models_for_tests:AsksUndeclared' looks up variable 'embedding/nope', " \
           "which it did not declare (declared: weights, bias)" in err, err[-3000:]
    assert stored(tmp_path / "ckpt") == before


def test_an_id_outside_a_declared_vocabulary(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.tfrecord", tmp_path / "bad.tfrecord"
    write_records(good, [[1, 2], [3], [9]])
    write_records(bad, [[1, 2], [3, 12], [9]])
    common = ("--format", "tfrecord", "--feature", "C1:int64:10", "--num-features", "64", "--batch-size", "4")
    code, err = train(tmp_path, "good", *common, "--train", str(good))
    assert code == 0, err[-3000:]
    before = stored(tmp_path / "ckpt")
    code, err = train(tmp_path, "bad", *common, "--train", str(bad), "--epochs", "2")
    assert code == 1
    assert f"{bad}: record 1" in err and "'C1'" in err and "12" in err and "vocabulary" in err, err[-3000:]
    assert stored(tmp_path / "ckpt") == before


def test_an_id_outside_a_table(tmp_path: Path) -> None:
    """No vocabulary declared: the table has --num-features rows, and the model's lookup refuses a larger id."""
    good, bad = tmp_path / "good.tfrecord", tmp_path / "bad.tfrecord"
    write_records(good, [[1, 2], [3], [9]])
    write_records(bad, [[1, 2], [3, 150], [9]])
    common = ("--format", "tfrecord", "--feature", "C1:int64", "--num-features", "100", "--batch-size", "4",
              "--model", "examples.wide_deep_numpy:WideDeep", "--embedding-dim", "2", "--model-param", "hidden=[4]")
    code, err = train(tmp_path, "good", *common, "--train", str(good))
    assert code == 0, err[-3000:]
    before = stored(tmp_path / "ckpt")
    code, err = train(tmp_path, "bad", *common, "--train", str(bad), "--epochs", "2")
    assert code == 1
    assert "feature 'C1': id 150" in err and "outside the vocabulary of table 'wide/C1' (100 rows)" in err, err[-3000:]
    assert stored(tmp_path / "ckpt") == before


def test_a_schema_naming_a_feature_the_data_lacks(tmp_path: Path) -> None:
    data = tmp_path / "data.tfrecord"
    write_records(data, [[1, 2], [3], [9]])
    common = ("--format", "tfrecord", "--train", str(data), "--num-features", "64", "--batch-size", "4")
    code, err = train(tmp_path, "good", *common, "--feature", "C1:int64")
    assert code == 0, err[-3000:]
    before = stored(tmp_path / "ckpt")
    code, err = train(tmp_path, "bad", *common, "--feature", "C1:int64", "--feature", "C9:int64", "--seed", "1")
    assert code == 1
    assert "'C9'" in err and str(data) in err, err[-3000:]
    assert stored(tmp_path / "ckpt") == before


def test_a_schema_a_batch_cannot_hold_is_refused_before_anything_starts(tmp_path: Path) -> None:
    schema = tmp_path / "schema.yaml"
    schema.write_text("label: label\nfeatures:\n  label: {kind: fixed, dtype: float32}\n  w: {kind: varlen, dtype: float32}\n")
    r = run_cli("train", "--format", "tfrecord", "--schema", str(schema), "--train", str(tmp_path / "none.tfrecord"),
                "--output", str(tmp_path / "run"))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert f"schema {schema}: feature 'w': a float32 VarLenFeature is not a batch feature" in r.stderr
    assert not (tmp_path / "run").exists()  # refused before a process or a file was made
