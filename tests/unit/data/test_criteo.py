"""Criteo TSV: per-column features, pinned stable hashing, missing and negative values, malformed lines, learnability."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import CRITEO_SYNTHETIC, require_native
from hypothesis import given
from hypothesis import strategies as st

from psflow.data import BadRecordError, Batch, DatasetConfig, batch_spec, native, open_dataset, read_all
from psflow.data import criteo as criteo_module
from psflow.data.criteo import CAT_FEATURES, INT_FEATURES, missing_ids, parse_criteo
from psflow.data.hashing import STRING_PAD, bucket_strings, hash_strings, name_salt, salted_ids, splitmix64

LINE = "1\t5\t-2\t\t0\t3\t1000000\t\t\t\t\t\t\t\t68fd1e64\t\tabc\t0123456789abcdef01\t" + "\t".join(["deadbeef"] * 22) + "\n"
_M = (1 << 64) - 1


@pytest.fixture(params=["c", "numpy"])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test with the C kernel, then with the numpy parser (see psflow.data.native)."""
    if request.param == "c":
        require_native()
    monkeypatch.setattr(criteo_module, "NATIVE", native.NATIVE if request.param == "c" else None)
    return str(request.param)


def _ref_splitmix64(x: int) -> int:
    """The documented arithmetic, in Python integers (independent of the numpy code)."""
    x = (x + 0x9E3779B97F4A7C15) & _M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M
    return x ^ (x >> 31)


def _ref_salt(name: str) -> int:
    h = 0xCBF29CE484222325
    for byte in name.encode("utf-8"):
        h = ((h ^ byte) * 0x100000001B3) & _M
    return _ref_splitmix64(h)


def _ref_hash(value: bytes, salt: int) -> int:
    h = salt
    for k in range(0, len(value), 8):
        h = _ref_splitmix64(h ^ int.from_bytes(value[k : k + 8].ljust(8, b"\0"), "little"))
    return _ref_splitmix64(h ^ len(value))


def test_hash_is_pinned() -> None:
    """The documented hash, pinned: changing it would silently change every model's feature ids."""
    assert int(splitmix64(np.array([0], dtype=np.uint64))[0]) == 0xE220A8397B1DCDAF
    assert int(name_salt("C1")) == 0x220BFBAAFBB2EB69
    data = np.frombuffer(b"68fd1e64" + b"0123456789abcdef01" + bytes(STRING_PAD), dtype=np.uint8)
    salts = np.array([name_salt("C1"), name_salt("C4"), name_salt("site")], dtype=np.uint64)
    got = hash_strings(data, np.array([0, 8, 0]), np.array([8, 18, 0]), salts)
    assert [int(h) for h in got] == [0x5F15BC2242BDE82B, 0x0AD90465FD38F470, 0xFB4000C70B3394AA]
    assert int(missing_ids(1 << 62)[1]) == 0x31E03A226E41A007 % (1 << 62)  # C2's "missing": splitmix64(~salt)


@given(st.lists(st.binary(max_size=40), min_size=1, max_size=20), st.text(max_size=5))
def test_vectorized_hash_follows_the_documented_arithmetic(values: list[bytes], name: str) -> None:
    assert int(name_salt(name)) == _ref_salt(name)
    ids = bucket_strings(values, name, 1000003)
    assert ids.tolist() == [_ref_hash(v, _ref_salt(name)) % 1000003 for v in values]


def test_hash_refuses_ranges_without_padding() -> None:
    data = np.frombuffer(b"abcdefgh", dtype=np.uint8)
    with pytest.raises(ValueError, match="outside the 8-byte buffer"):
        hash_strings(data, np.array([0]), np.array([3]), np.uint64(1))


def test_one_line_by_hand(parser: str) -> None:
    parsed = parse_criteo(LINE.encode(), 1 << 20)
    batch = parsed.batch
    batch.validate()
    assert parsed.errors == [] and batch.num_examples == 1 and batch.labels.tolist() == [1.0]
    assert list(batch.dense) == list(INT_FEATURES) and list(batch.sparse) == list(CAT_FEATURES)
    ints = [5, -2, None, 0, 3, 1000000] + [None] * 7
    for name, v in zip(INT_FEATURES, ints, strict=True):
        want = 0.0 if v is None else float(np.float32(np.sign(v) * np.log1p(abs(v))))
        assert batch.dense[name].dtype == np.float32 and batch.dense[name].tolist() == [want], name
    for column in batch.sparse.values():
        assert column.indptr.tolist() == [0, 1] and column.values.tolist() == [1.0]
    ids = {name: int(batch.sparse[name].ids[0]) for name in CAT_FEATURES}
    assert ids["C1"] == _ref_hash(b"68fd1e64", _ref_salt("C1")) % (1 << 20)
    assert ids["C1"] == int(bucket_strings([b"68fd1e64"], "C1", 1 << 20)[0])  # = a TFRecord string feature "C1"
    assert ids["C2"] == int(missing_ids(1 << 20)[1])
    assert ids["C4"] == _ref_hash(b"0123456789abcdef01", _ref_salt("C4")) % (1 << 20)
    assert len({ids[name] for name in CAT_FEATURES[4:]}) == 22  # "deadbeef" in 22 columns: 22 ids
    small = parse_criteo(LINE.encode(), 1000).batch
    assert all(int(c.ids[0]) < 1000 for c in small.sparse.values())


def test_batch_spec_matches_the_batches(parser: str) -> None:
    spec = batch_spec("criteo", None, 1 << 10)
    batch = parse_criteo(LINE.encode(), 1 << 10).batch
    assert list(spec.sparse) == list(batch.sparse) and set(spec.sparse.values()) == {1 << 10}
    assert list(spec.dense) == list(batch.dense) and set(spec.dense.values()) == {1}


def test_malformed_lines_are_named(tmp_path: Path, parser: str) -> None:
    good = LINE.encode()
    cases = [
        (good.replace(b"\t", b"", 1), "has 39 tab-separated fields, want 40"),
        (b"2" + good[1:], "bad label '2' (want 0 or 1)"),
        (good.replace(b"\t5\t", b"\t5x\t", 1), "column I1: bad integer '5x'"),
        (good.replace(b"\t-2\t", b"\t--2\t", 1), "column I2: bad integer '--2'"),
    ]
    for line, message in cases:
        path = tmp_path / "day.tsv"
        path.write_bytes(good + b"\n" + line + good)
        with pytest.raises(BadRecordError) as info:
            read_all(str(path), "criteo")
        assert str(info.value) == f"{path}:3: {message}"
        skipped = read_all(str(path), "criteo", skip_bad_records=True)
        assert skipped.num_examples == 2
        skipped.validate()


def test_sample_file(criteo_file: Path, parser: str) -> None:
    """A whole file (the synthetic data, and the real sample where present): every row, label and feature."""
    lines = criteo_file.read_bytes().splitlines()
    rows, positives = len(lines), sum(line.startswith(b"1\t") for line in lines)
    if criteo_file.name == "criteo_1tb_day0_10k.txt":
        assert (rows, positives) == (10_000, 265)
    batch = read_all(str(criteo_file), "criteo")
    assert batch.num_examples == rows
    assert int(batch.labels.sum()) == positives
    assert batch.nnz == 26 * rows  # a missing value is an id too
    assert all(batch.dense[name].shape == (rows,) for name in INT_FEATURES)


def _auc(labels: np.ndarray, scores: np.ndarray) -> float:
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ranks = (np.bincount(inverse, weights=ranks) / counts)[inverse]  # ties share their mean rank
    positives = labels.sum()
    return float((ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * (len(labels) - positives)))


def _design(batch: Batch, num_features: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, weight index, value) of every entry: each column's ids offset into its own block, dense features last."""
    rows, cols, vals = [], [], []
    n = batch.num_examples
    for j, name in enumerate(CAT_FEATURES):
        column = batch.sparse[name]
        rows.append(np.repeat(np.arange(n), np.diff(column.indptr)))
        cols.append(column.ids + j * num_features)
        vals.append(column.values.astype(np.float64))
    for j, name in enumerate(INT_FEATURES):
        rows.append(np.arange(n))
        cols.append(np.full(n, len(CAT_FEATURES) * num_features + j))
        vals.append(batch.dense[name].astype(np.float64) / 10)
    return np.concatenate(rows), np.concatenate(cols), np.concatenate(vals)


def _logits(batch: Batch, w: np.ndarray, bias: float, num_features: int) -> np.ndarray:
    rows, cols, vals = _design(batch, num_features)
    return np.bincount(rows, weights=w[cols] * vals, minlength=batch.num_examples) + bias


def test_hashed_features_are_learnable(criteo_sample: Path) -> None:
    """Adagrad logistic regression on the real sample's first 8,000 rows scores AUC >= 0.70 on the last 2,000."""
    num_features = 1 << 14
    batch = read_all(str(criteo_sample), "criteo", num_features=num_features)
    assert _learned_auc(batch.slice(0, 8000), batch.slice(8000, 10_000), num_features) >= 0.70


def test_the_synthetic_data_is_learnable() -> None:
    """The same on the bundled synthetic data (data/criteo_synthetic: labels from a hidden logistic model whose
    own eval AUC is 0.92): train.txt teaches eval.txt to AUC >= 0.70 (measured 0.745); its labels shuffled, to
    about 0.5 (the signal is in the rows' labels, not in the files' order or the label rate)."""
    num_features = 1 << 14
    train = read_all(str(CRITEO_SYNTHETIC), "criteo", num_features=num_features)
    test = read_all(str(CRITEO_SYNTHETIC.with_name("eval.txt")), "criteo", num_features=num_features)
    assert _learned_auc(train, test, num_features) >= 0.70
    shuffled = Batch(np.random.default_rng(0).permutation(train.labels), train.sparse, train.dense)
    assert abs(_learned_auc(shuffled, test, num_features) - 0.5) < 0.12


def _learned_auc(train: Batch, test: Batch, num_features: int) -> float:
    """Eval AUC of Adagrad logistic regression (5 epochs, batch 32) trained on ``train``, scored on ``test``."""
    size_w = len(CAT_FEATURES) * num_features + len(INT_FEATURES)
    w = np.zeros(size_w)
    accum = np.full(size_w, 0.1)
    bias, bias_accum = 0.0, 0.1
    lr, l2, size = 0.02, 0.05, 32
    for _ in range(5):
        for start in range(0, train.num_examples, size):
            mb = train.slice(start, start + size)
            grad = 1 / (1 + np.exp(-_logits(mb, w, bias, num_features))) - mb.labels
            rows, cols, vals = _design(mb, num_features)
            touched, inverse = np.unique(cols, return_inverse=True)
            g = np.bincount(inverse, weights=grad[rows] * vals, minlength=touched.size) + l2 * w[touched]
            accum[touched] += g * g
            w[touched] -= lr * g / np.sqrt(accum[touched])
            bias_accum += grad.sum() ** 2
            bias -= lr * grad.sum() / np.sqrt(bias_accum)
    return _auc(test.labels, _logits(test, w, bias, num_features))


# ---- num_features = 0: raw 64-bit ids (dynamic embedding tables) ----


def _signed(h: int) -> int:
    """A 64-bit unsigned value read as int64 (two's complement)."""
    return h - (1 << 64) if h >= 1 << 63 else h


def _raw_lines(count: int, seed: int) -> bytes:
    """``count`` well-formed lines with random categorical values, about a third of the fields empty."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(count):
        ints = [str(v) if rng.random() < 0.7 else "" for v in rng.integers(-5, 10**6, 13).tolist()]
        cats = [rng.bytes(int(rng.integers(1, 20))).hex()[: int(rng.integers(1, 30))] if rng.random() < 0.7 else ""
                for _ in CAT_FEATURES]
        lines.append("\t".join([str(int(rng.integers(0, 2))), *ints, *cats]) + "\n")
    return "".join(lines).encode()


def test_raw_ids_are_the_same_from_c_and_numpy() -> None:
    """num_features = 0: the C kernel and the numpy twin agree bit for bit, empty fields included."""
    require_native()
    empty = "0" + "\t" * 39 + "\n"  # every field empty: all 26 "missing" ids
    blob = (LINE + empty + "\n" + LINE.replace("\tabc\t", "\t\t") + "1\tbad\n").encode() + _raw_lines(50, 1)
    newlines = np.flatnonzero(np.frombuffer(blob, dtype=np.uint8) == 10).astype(np.int64)
    want = criteo_module._parse_numpy(blob, 0, None)
    assert want.batch.num_examples == 53 and [row for row, _ in want.errors] == [4]
    for got in (criteo_module._parse_native(blob, 0, None), criteo_module._parse_native(blob, 0, newlines)):
        assert got.rows.tolist() == want.rows.tolist() and got.errors == want.errors
        for name in CAT_FEATURES:
            assert got.batch.sparse[name].ids.dtype == np.int64
            assert got.batch.sparse[name].ids.tolist() == want.batch.sparse[name].ids.tolist(), name
        for name in INT_FEATURES:
            assert got.batch.dense[name].tobytes() == want.batch.dense[name].tobytes(), name
    missing = [int(want.batch.sparse[name].ids[1]) for name in CAT_FEATURES]
    assert missing == missing_ids(0).tolist() == [_signed(_ref_splitmix64(~_ref_salt(name) & _M)) for name in CAT_FEATURES]


def test_raw_id_is_the_hash_as_int64(parser: str) -> None:
    batch = parse_criteo(LINE.encode(), 0).batch
    batch.validate()
    ids = {name: int(batch.sparse[name].ids[0]) for name in CAT_FEATURES}
    for name, value in [("C1", b"68fd1e64"), ("C3", b"abc"), ("C4", b"0123456789abcdef01"), ("C26", b"deadbeef")]:
        data = np.frombuffer(value + bytes(STRING_PAD), dtype=np.uint8)
        h = hash_strings(data, np.array([0]), np.array([len(value)]), name_salt(name))
        assert ids[name] == int(h.view(np.int64)[0]) == _signed(_ref_hash(value, _ref_salt(name))), name
    assert ids["C2"] == int(missing_ids(0)[1]) == _signed(0x31E03A226E41A007)  # pinned in test_hash_is_pinned
    # Folding the raw ids gives the ids of num_features >= 1: nothing else changed.
    for num_features in (1000, 1 << 20, (1 << 63) + 5):
        folded = parse_criteo(LINE.encode(), num_features).batch
        for name in CAT_FEATURES:
            assert folded.sparse[name].ids.tolist() == [(ids[name] % (1 << 64)) % num_features], (name, num_features)


def test_raw_ids_cover_negative_values(parser: str) -> None:
    batch = parse_criteo(_raw_lines(200, 2), 0).batch
    ids = np.concatenate([batch.sparse[name].ids for name in CAT_FEATURES])
    assert batch.num_examples == 200 and ids.dtype == np.int64
    negative = float(np.mean(ids < 0))
    assert 0.3 < negative < 0.7, negative  # about half: the top bit of a 64-bit hash
    assert int(ids.max()) > 1 << 62 and int(ids.min()) < -(1 << 62)


def test_negative_num_features_is_refused(parser: str) -> None:
    for call in (lambda: parse_criteo(LINE.encode(), -1), lambda: missing_ids(-3)):
        with pytest.raises(ValueError, match="num_features must be >= 1, or 0 for raw 64-bit ids"):
            call()
    with pytest.raises(ValueError, match="num_features"):
        DatasetConfig(("x",), "criteo", num_features=-1)
    with pytest.raises(ValueError, match="num_features"):  # 0 means raw ids for Criteo only
        DatasetConfig(("x",), "libsvm", num_features=0)
    assert DatasetConfig(("x",), "criteo", num_features=0).num_features == 0


def test_salted_ids_raw() -> None:
    ids = np.array([0, 1, 7, -1, -(1 << 63), (1 << 63) - 1, 123456789], dtype=np.int64)
    salt = name_salt("C7")
    raw = salted_ids(ids, salt, 0)
    want = [_signed(_ref_splitmix64((i % (1 << 64)) ^ int(salt))) for i in ids.tolist()]
    assert raw.dtype == np.int64 and raw.tolist() == want
    assert raw.tolist() == splitmix64(ids.view(np.uint64) ^ salt).view(np.int64).tolist()
    assert min(want) < 0  # negative raw ids do occur
    for num_rows in (1, 1000, 1 << 20):
        assert salted_ids(ids, salt, num_rows).tolist() == [(w % (1 << 64)) % num_rows for w in want]
    with pytest.raises(ValueError, match="num_rows must be >= 1, or 0"):
        salted_ids(ids, salt, -1)


def test_raw_ids_from_a_real_file(criteo_file: Path, tmp_path: Path, parser: str) -> None:
    """1,000 lines of a file read through the dataset with num_features = 0: full 64-bit ids, no folding."""
    with open(criteo_file, "rb") as f:
        head = b"".join(f.readline() for _ in range(1000))
    path = tmp_path / "day0_1k.tsv"
    path.write_bytes(head)
    raw = read_all(str(path), "criteo", num_features=0)
    folded = read_all(str(path), "criteo", num_features=1000)
    assert raw.num_examples == folded.num_examples == 1000
    raw.validate()
    raw_ids = np.concatenate([raw.sparse[name].ids for name in CAT_FEATURES])
    folded_ids = np.concatenate([folded.sparse[name].ids for name in CAT_FEATURES])
    assert raw_ids.dtype == np.int64
    assert np.unique(raw_ids).size > np.unique(folded_ids).size  # 26 columns' values no longer collide in 1,000 rows
    assert int(raw_ids.min()) < -(1 << 62) and int(raw_ids.max()) > 1 << 62  # the whole int64 range
    assert (raw_ids.view(np.uint64) % np.uint64(1000)).astype(np.int64).tolist() == folded_ids.tolist()
    for name in CAT_FEATURES:  # within a column: one id per distinct value, missing included
        values = [line.split(b"\t")[1 + len(INT_FEATURES) + CAT_FEATURES.index(name)] for line in head.splitlines()]
        assert np.unique(raw.sparse[name].ids).size == len(set(values)), name
    # The same through a prefetching, batching dataset.
    config = DatasetConfig((str(path),), "criteo", num_features=0, batch_size=128, prefetch=2)
    with open_dataset(config, start=True) as dataset:
        batches = list(dataset)
    streamed = Batch.concat(batches)
    for name in CAT_FEATURES:
        assert streamed.sparse[name].ids.tolist() == raw.sparse[name].ids.tolist(), name
