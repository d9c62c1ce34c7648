"""`psflow convert` and `psflow train --format ...` end to end on real data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import A9A, A9A_T, SHARED_DATA, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CRITEO = SHARED_DATA / "criteo" / "criteo_1tb_day0_10k.txt"


def train_auc(out: Path, *args: str) -> dict[str, object]:
    r = run_cli("train", "--num-features", "124", "--ps", "2", "--workers", "2", "--epochs", "3", "--quiet",
                "--output", str(out), *args)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((out / "metrics.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_tfrecord_converted_from_a9a_matches_libsvm(tmp_path: Path, compression: str) -> None:
    for src, prefix, shards in [(A9A, "train", "4"), (A9A_T, "eval", "1")]:
        r = run_cli("convert", "--format", "libsvm", "--output-prefix", str(tmp_path / prefix), "--num-shards", shards,
                    "--compression", compression, str(src))
        assert r.returncode == 0, r.stderr
    train_files = sorted(tmp_path.glob("train-*"))
    assert len(train_files) == 4
    tf = train_auc(tmp_path / "tf", "--format", "tfrecord", "--train", str(tmp_path / "train-*"),
                   "--eval", str(next(tmp_path.glob("eval-*"))))
    svm = train_auc(tmp_path / "svm", "--train", str(A9A), "--eval", str(A9A_T))
    assert tf["examples"] == svm["examples"] == 3 * 32561
    assert abs(tf["eval"]["auc"] - svm["eval"]["auc"]) <= 0.002, (tf["eval"], svm["eval"])  # type: ignore[index]


@pytest.mark.skipif(not CRITEO.exists(), reason="the Criteo sample lives in ../shared/data (not bundled: its terms)")
def test_criteo_sample_trains_to_auc_070(tmp_path: Path) -> None:
    lines = CRITEO.read_text().splitlines(keepends=True)
    (tmp_path / "train.tsv").write_text("".join(lines[:8000]))
    (tmp_path / "eval.tsv").write_text("".join(lines[8000:]))
    r = run_cli("train", "--format", "criteo", "--train", str(tmp_path / "train.tsv"), "--eval", str(tmp_path / "eval.tsv"),
                "--ps", "2", "--workers", "2", "--epochs", "3", "--batch-size", "256", "--quiet", "--output",
                str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["eval"]["examples"] == 2000
    assert metrics["eval"]["auc"] >= 0.70, metrics["eval"]


def test_skip_bad_records_counts_and_reports(tmp_path: Path) -> None:
    lines = A9A.read_text().splitlines(keepends=True)[:4000]
    lines[100] = "+1 5:1 nonsense\n"
    lines[2000] = "-1 7:x\n"
    bad = tmp_path / "bad.libsvm"
    bad.write_text("".join(lines))
    metrics = train_auc(tmp_path / "run", "--train", str(bad), "--skip-bad-records", "--epochs", "1")
    assert metrics["bad_records_skipped"] == 2
    assert metrics["examples"] == 3998
    r = run_cli("train", "--train", str(bad), "--num-features", "124", "--ps", "1", "--workers", "1", "--quiet",
                "--skip-bad-records", "--max-bad-records", "1", "--output", str(tmp_path / "run2"))
    assert r.returncode != 0 and "bad records" in r.stderr.lower(), r.stderr[-2000:]


def test_custom_schema_file_names_the_features(tmp_path: Path) -> None:
    from psflow.data import TFRecordWriter, encode_example, read_all

    data = read_all([str(A9A)], "libsvm")
    features = data.column()
    with TFRecordWriter(str(tmp_path / "custom.tfrecord")) as writer:
        for i in range(data.num_examples):
            lo, hi = features.indptr[i], features.indptr[i + 1]
            writer.write(encode_example({"click": ("float32", [float(data.labels[i])]),
                                         "fid": ("int64", features.ids[lo:hi].tolist()),
                                         "fval": ("float32", features.values[lo:hi].tolist())}))
    schema = tmp_path / "schema.yaml"
    schema.write_text("label: click\nfeatures:\n  click: {kind: fixed, shape: [], dtype: float32}\n"
                      "  feat: {kind: sparse, ids_key: fid, values_key: fval}\n")
    metrics = train_auc(tmp_path / "run", "--format", "tfrecord", "--schema", str(schema), "--train",
                        str(tmp_path / "custom.tfrecord"), "--eval", str(tmp_path / "custom.tfrecord"))
    assert metrics["examples"] == 3 * 32561
    assert metrics["eval"]["auc"] >= 0.895  # type: ignore[index]


def test_tfrecord_without_a_schema_trains_on_the_inferred_one(tmp_path: Path) -> None:
    from psflow.data import Schema, TFRecordWriter, encode_example, read_all

    data = read_all([str(A9A)], "libsvm")
    features = data.column()
    path = tmp_path / "a9a.tfrecord"
    with TFRecordWriter(str(path)) as writer:
        for i in range(data.num_examples):
            lo, hi = features.indptr[i], features.indptr[i + 1]
            writer.write(encode_example({"label": ("float32", [float(data.labels[i])]),
                                         "fid": ("int64", features.ids[lo:hi].tolist()),
                                         "active": ("float32", [float(hi - lo)])}))
    out = tmp_path / "run"
    r = run_cli("train", "--format", "tfrecord", "--train", str(path), "--eval", str(path), "--num-features", "124",
                "--ps", "1", "--workers", "1", "--quiet", "--output", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"inferred TFRecord schema from {path} (first 1000 records)" in r.stderr
    assert "dense float32, normalizer log1p (1): active" in r.stderr and "ids int64, id space 124 (1): fid" in r.stderr
    schema = Schema.from_file(out / "schema.inferred.yaml")
    assert list(schema.features) == ["label", "active", "fid"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["examples"] == 32561 and metrics["eval"]["auc"] >= 0.89, metrics
