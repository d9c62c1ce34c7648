"""Input pipeline throughput, one core: records parsed per second, per format.

    .venv/bin/python benchmarks/bench_input.py            # about a minute

Workload: the sparse-LR examples of benchmarks/workload.py (200,000 by
default, 39 sorted ids in 2^20 per example, value 1.0), written to a temporary
directory as LIBSVM text, TFRecord (plain and GZIP, default sparse schema), and
a Criteo-like TSV (label, 13 integer columns with negatives and ~10% missing,
26 8-hex-digit categorical columns with ~10% missing), and that TSV converted
by ``psflow convert`` to multi-feature TFRecord ("tfrecord criteo": 41 keys
per Example -- label, 13 float features I1..I13, 26 int64 id features
C1..C26 -- read with the schema file convert writes).

Measured, each in this one thread (prefetch off), best of --repeats runs:
    reader      the file reader alone: read, frame/split, check CRCs, parse
                into SparseBatch pieces -- the parse throughput
    dataset     open_dataset(...) end to end: reader + batching (batch 512)
    + shuffle   the same with a 10,000-record shuffle buffer
TFRecord rows are measured twice, with the C loops (psflow/data/_native.c) and
with their numpy versions ("numpy loops", as with PSFLOW_NATIVE=0), alternated.
For both TFRecord layouts also, on the first 20,000 records:
    vectorized decoder psflow's vectorized decoder alone (no file, framing or CRC)
    general decoder    psflow's fallback for unusual encodings: protobuf's
                       Example.FromString per record, then schema assembly
    protobuf loop      Example.FromString per record + numpy conversion of
                       label/ids/values: the usual Python way, for reference
Writes benchmarks/results/input.json (``--out``) and prints a markdown table,
which it also puts in benchmarks/RESULTS.md unless ``--no-results-md``;
``--skip-training`` leaves out the training comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_async import psflow_run  # noqa: E402
from results_md import replace_section  # noqa: E402
from workload import generate  # noqa: E402

from psflow.data import DatasetConfig, TFRecordWriter, native, open_dataset, read_records  # noqa: E402
from psflow.data import example_wire as wire_module  # noqa: E402
from psflow.data import tfrecord as tfrecord_module  # noqa: E402
from psflow.data.convert import convert, schema_path  # noqa: E402
from psflow.data.example import encode_sparse_examples, parse_examples  # noqa: E402
from psflow.data.example_pb import example_class  # noqa: E402
from psflow.data.readers import iter_file  # noqa: E402
from psflow.data.schema import Schema, default_sparse_schema  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "input.json")
SMALL = 20_000  # records for the slow per-record decoders


def write_files(root: str, n: int) -> dict[str, str]:
    ids, labels = generate(n, seed=20240531)
    indptr = np.arange(0, ids.size + 1, ids.shape[1], dtype=np.int64)
    paths = {name: os.path.join(root, name) for name in ("sparse.libsvm", "sparse.tfrecord", "sparse.tfrecord.gz", "day.tsv")}
    with open(paths["sparse.libsvm"], "w") as f:
        for s in range(0, n, 20_000):
            f.write(
                "".join(
                    f"{int(y)} {' '.join(f'{i}:1' for i in row)}\n"
                    for row, y in zip(ids[s : s + 20_000].tolist(), labels[s : s + 20_000].tolist(), strict=True)
                )
            )
    records = encode_sparse_examples(labels, indptr, ids.reshape(-1), np.ones(ids.size, dtype=np.float32))
    for name, compression in (("sparse.tfrecord", "none"), ("sparse.tfrecord.gz", "gzip")):
        with TFRecordWriter(paths[name], compression) as writer:
            for record in records:
                writer.write(record)
    rng = np.random.default_rng(7)
    ints = np.floor(rng.lognormal(2.0, 2.0, size=(n, 13))).astype(np.int64) - rng.integers(0, 2, size=(n, 13)) * 3
    cats = (ids[:, :26].astype(np.uint64) * np.uint64(2654435761)) & np.uint64(0xFFFFFFFF)
    missing = rng.random((n, 39)) < 0.1
    with open(paths["day.tsv"], "w") as f:
        for s in range(0, n, 20_000):
            rows = []
            for i in range(s, min(n, s + 20_000)):
                fields = [str(int(labels[i]))]
                fields += ["" if missing[i, j] else str(v) for j, v in enumerate(ints[i].tolist())]
                fields += ["" if missing[i, 13 + j] else f"{v:08x}" for j, v in enumerate(cats[i].tolist())]
                rows.append("\t".join(fields) + "\n")
            f.write("".join(rows))
    (paths["criteo.tfrecord"],) = convert([paths["day.tsv"]], "criteo", os.path.join(root, "criteo"))
    paths["criteo.schema"] = schema_path(os.path.join(root, "criteo"))
    return paths


def with_loops(impl: str, run: Callable[[], int]) -> Callable[[], int]:
    """``run`` with the C loops (``"c"``) or their numpy versions (``"numpy"``) in the TFRecord reader."""
    loops = native.NATIVE if impl == "c" else None

    def wrapped() -> int:
        saved = tfrecord_module.NATIVE, wire_module.NATIVE
        tfrecord_module.NATIVE = wire_module.NATIVE = loops
        try:
            return run()
        finally:
            tfrecord_module.NATIVE, wire_module.NATIVE = saved

    return wrapped


def best_rate(count: Callable[[], int], repeats: int) -> tuple[float, int]:
    """Runs ``count`` ``repeats`` times; returns (best records/s, records)."""
    best = 0.0
    records = 0
    for _ in range(repeats):
        start = time.perf_counter()
        records = count()
        best = max(best, records / (time.perf_counter() - start))
    return best, records


def reader_count(config: DatasetConfig, path: str) -> Callable[[], int]:
    def run() -> int:
        pieces = iter_file(config, path, start_record=0, start_offset=0, stride=1, first=0, on_bad=_raise)
        return sum(p.batch.num_examples for p in pieces)

    return run


def dataset_count(config: DatasetConfig) -> Callable[[], int]:
    def run() -> int:
        with open_dataset(config, start=False) as dataset:
            return sum(b.num_examples for b in dataset)

    return run


def _raise(error: Exception) -> None:
    raise error


def protobuf_loop(records: list[bytes]) -> Callable[[], int]:
    example = example_class()

    def run() -> int:
        labels, ids, values, lengths = [], [], [], []
        for record in records:
            feature = example.FromString(record).features.feature
            labels.append(feature["label"].float_list.value[0])
            got = feature["ids"].int64_list.value
            ids.append(np.asarray(got, dtype=np.int64))
            values.append(np.asarray(feature["values"].float_list.value, dtype=np.float32))
            lengths.append(len(got))
        np.concatenate(ids), np.concatenate(values), np.asarray(labels, dtype=np.float32)
        return len(records)

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("--skip-training", action="store_true", help="leave out the training comparison")
    parser.add_argument("--no-results-md", action="store_true", help="do not update benchmarks/RESULTS.md")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="psflow-bench-input-") as root:
        t0 = time.perf_counter()
        paths = write_files(root, args.examples)
        print(f"wrote {args.examples:,} examples per format in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        impls = ["c", "numpy"] if native.NATIVE is not None else ["numpy"]
        criteo_schema = Schema.from_file(paths["criteo.schema"])
        cases = [("libsvm", "sparse.libsvm", "libsvm", None), ("tfrecord", "sparse.tfrecord", "tfrecord", None)]
        cases += [("tfrecord gzip", "sparse.tfrecord.gz", "tfrecord", None), ("criteo", "day.tsv", "criteo", None)]
        cases += [("tfrecord criteo", "criteo.tfrecord", "tfrecord", criteo_schema)]
        for label, name, fmt, schema in cases:
            rows += file_rows(label, paths[name], fmt, schema, impls, args.repeats)
        for label, name, schema in (("tfrecord", "sparse.tfrecord", default_sparse_schema()),
                                    ("tfrecord criteo", "criteo.tfrecord", criteo_schema)):
            rows += decoder_rows(label, paths[name], schema, impls, args.repeats)
        training = []
        training_cases: list[tuple[str, str, dict[str, Any]]] = [
            ("libsvm", "sparse.libsvm", {"format": "libsvm"}),
            ("tfrecord", "sparse.tfrecord", {"format": "tfrecord"}),
            ("tfrecord criteo", "criteo.tfrecord", {"format": "tfrecord", "schema": paths["criteo.schema"]}),
        ]
        for label, name, extra in [] if args.skip_training else training_cases:
            run = psflow_run([paths[name]], paths[name], 1, root, **extra)
            training.append({"format": label, "examples_per_s": run["examples_per_sec"]})
            print(f"{label:14s} {'training 1ps+2w':18s} {run['examples_per_sec']:12,.0f} examples/s", file=sys.stderr)
    result = {
        "benchmark": "input",
        "examples": args.examples,
        "repeats": args.repeats,
        "machine": {"cpu": _cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__},
        "rows": rows,
        "training": training,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(markdown(result))
    if not args.no_results_md:
        replace_section("input", markdown(result))
    return 0


def file_rows(label: str, path: str, fmt: str, schema: Schema | None, impls: list[str], repeats: int) -> list[dict[str, Any]]:
    """The reader, dataset and dataset + shuffle stages on one file (TFRecord: once per loop implementation)."""
    rows = []
    size = os.path.getsize(path)
    base = DatasetConfig((path,), fmt, batch_size=512, prefetch=0, schema=schema)
    for stage, run in (
        ("reader", reader_count(base, path)),
        ("dataset", dataset_count(base)),
        ("dataset + shuffle", dataset_count(DatasetConfig((path,), fmt, batch_size=512, prefetch=0, shuffle_buffer=10_000,
                                                          schema=schema))),
    ):
        for impl in impls if fmt == "tfrecord" else ["-"]:
            rate, records = best_rate(with_loops(impl, run) if impl != "-" else run, repeats)
            rows.append({"format": label, "stage": stage, "loops": impl, "records": records, "records_per_s": rate, "file_mb": size / 1e6})
            print(f"{label:16s} {stage:18s} {impl:6s} {rate:12,.0f} records/s", file=sys.stderr)
    return rows


def decoder_rows(label: str, path: str, schema: Schema, impls: list[str], repeats: int) -> list[dict[str, Any]]:
    """The decoders alone on the first SMALL records of a file (the protobuf loop for sparse-LR records only)."""
    records = [r for _, r in zip(range(SMALL), read_records(path), strict=False)]
    runs: list[tuple[str, str, Callable[[], int]]] = [
        ("general decoder", "-", lambda: parse_examples(records, schema, fast=False).num_examples),
        *(("vectorized decoder", impl, with_loops(impl, lambda: parse_examples(records, schema).num_examples)) for impl in impls),
    ]
    if schema == default_sparse_schema():
        runs.append(("protobuf loop", "-", protobuf_loop(records)))
    rows = []
    for stage, impl, run in runs:
        rate, count = best_rate(run, repeats)
        rows.append({"format": label, "stage": stage, "loops": impl, "records": count, "records_per_s": rate, "file_mb": None})
        print(f"{label:16s} {stage:18s} {impl:6s} {rate:12,.0f} records/s", file=sys.stderr)
    return rows


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Input parsing, one core ({result['machine']['cpu']}), {result['examples']:,} sparse-LR examples "
        f"(39 ids each) and the same number of Criteo-like ones (text, and converted to TFRecord with 41 keys per "
        f"Example), best of {result['repeats']}; `benchmarks/bench_input.py`.",
        "",
        "TFRecord stages are measured with psflow's C loops (`c`) and with their numpy versions (`numpy`, as with "
        "`PSFLOW_NATIVE=0`), one after the other.",
        "",
        "| format | stage | loops | records/s | file MB |",
        "|---|---|---|---:|---:|",
    ]
    for row in result["rows"]:
        size = f"{row['file_mb']:.0f}" if row["file_mb"] else ""
        lines.append(f"| {row['format']} | {row['stage']} | {row.get('loops', '-')} | {row['records_per_s']:,.0f} | {size} |")
    if result.get("training"):
        lines += ["", "Input-only vs training, same file, same run (training: `psflow train`, 1 ps + 2 workers, "
                  "FTRL, batch 512, whole cluster, logistic regression over every feature; input: one core, "
                  "`dataset` stage):", "",
                  "| format | input records/s (1 core) | training examples/s (cluster) | input / training |",
                  "|---|---:|---:|---:|"]
        for t in result["training"]:
            inp = next(r["records_per_s"] for r in result["rows"]
                       if r["format"] == t["format"] and r["stage"] == "dataset" and r.get("loops") in ("-", "c", None))
            lines.append(f"| {t['format']} | {inp:,.0f} | {t['examples_per_s']:,.0f} | {inp / t['examples_per_s']:.1f}× |")
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
