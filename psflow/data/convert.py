"""Converting LIBSVM or Criteo text to sharded TFRecord files of ``tf.train.Example``.

Output files are named like TensorFlow's sharded outputs,
``<prefix>-00000-of-00004.tfrecord`` (``.tfrecord.gz`` with gzip), next to
the schema file ``<prefix>.schema.yaml`` that describes exactly what was
written (:func:`tfrecord_schema`), so that reading the shards with
``--format tfrecord --schema <prefix>.schema.yaml`` gives the examples that
reading the text gives, bit for bit, with the same ``num_features`` (Criteo's
hashed id space; one shard: the same batches too, in the same order; more:
record ``i`` is in shard ``i % num_shards``, so they are read in another order):

* LIBSVM: :func:`~psflow.data.schema.default_sparse_schema` form (``label``
  float, ``ids`` int64, ``values`` float), the bytes psflow always wrote;
* Criteo: ``label`` float, ``I1`` .. ``I13`` float (the dense values, already
  ``sign(v) * log1p(|v|)``), ``C1`` .. ``C26`` int64 (the hashed ids, one per
  example; ``vocabulary_size = num_features``).

Examples are serialized deterministically.  Record ``i`` of the input (in
sorted file order, bad records skipped if asked) goes to shard
``i % num_shards``, so shards differ in size by at most one record.  Each
output is written to a temporary name and renamed when complete, so a failed
run leaves no partial file behind.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from psflow.data.api import DataError, DatasetConfig
from psflow.data.criteo import CAT_FEATURES, INT_FEATURES
from psflow.data.dataset import open_dataset
from psflow.data.example_encode import encode_batch_examples
from psflow.data.schema import FixedLenFeature, Schema, VarLenFeature, default_sparse_schema, yaml
from psflow.data.tfrecord import TFRecordWriter

__all__ = ["convert", "shard_names", "schema_path", "tfrecord_schema", "add_convert_arguments", "run_convert"]

_READ_BATCH = 8192  # records encoded per step: amortizes numpy overhead, bounds memory


def shard_names(out_prefix: str, num_shards: int, compression: str = "none") -> list[str]:
    """The file names :func:`convert` writes."""
    suffix = ".tfrecord.gz" if compression == "gzip" else ".tfrecord"
    return [f"{out_prefix}-{k:05d}-of-{num_shards:05d}{suffix}" for k in range(num_shards)]


def schema_path(out_prefix: str) -> str:
    """The schema file :func:`convert` writes next to the shards."""
    return f"{out_prefix}.schema.yaml"


def tfrecord_schema(in_format: str, num_features: int) -> Schema:
    """The schema of the Examples :func:`convert` writes from ``in_format`` (see the module docstring).

    Raises:
        ValueError: ``in_format`` is not libsvm or criteo.
    """
    if in_format == "libsvm":
        return default_sparse_schema()
    if in_format != "criteo":
        raise ValueError(f"convert reads libsvm or criteo, got {in_format!r}")
    features: dict[str, FixedLenFeature | VarLenFeature] = {"label": FixedLenFeature((), "float32")}
    features.update((name, FixedLenFeature((), "float32")) for name in INT_FEATURES)
    features.update((name, VarLenFeature("int64", vocabulary_size=num_features)) for name in CAT_FEATURES)
    return Schema(features, "label")


def convert(
    inputs: Sequence[str],
    in_format: str,
    out_prefix: str,
    *,
    num_shards: int = 1,
    compression: str = "none",
    num_features: int = 1 << 20,
    skip_bad_records: bool = False,
    max_bad_records: int = 100,
    input_compression: str = "auto",
) -> list[str]:
    """Converts text files to sharded TFRecord plus a schema file; returns the shards written.

    Blocking; single-threaded.  The schema file is :func:`schema_path` of ``out_prefix``.

    Args:
        inputs: files or glob patterns (expanded and sorted).
        in_format: ``"libsvm"`` or ``"criteo"``.
        out_prefix: path prefix of the output files (its directory is created).
        num_shards: number of output files.
        compression: ``"none"`` or ``"gzip"`` for the outputs.
        num_features: Criteo: each categorical column's id space.
        skip_bad_records, max_bad_records: bad-record policy, as in DatasetConfig.
        input_compression: ``"auto"``, ``"none"`` or ``"gzip"`` for the inputs.

    Raises:
        ValueError: bad arguments.
        DataError, BadRecordError, TooManyBadRecordsError: reading failed
            (no output file is left behind).
    """
    schema = tfrecord_schema(in_format, num_features)
    if num_shards < 1:
        raise ValueError(f"num_shards ({num_shards}) must be >= 1")
    if compression not in ("none", "gzip"):
        raise ValueError(f"compression must be none or gzip, got {compression!r}")
    config = DatasetConfig(
        tuple(inputs),
        in_format,
        batch_size=_READ_BATCH,
        prefetch=0,
        num_features=num_features,
        skip_bad_records=skip_bad_records,
        max_bad_records=max_bad_records,
        compression=input_compression,
    )
    names = shard_names(out_prefix, num_shards, compression)
    directory = os.path.dirname(out_prefix)
    if directory:
        os.makedirs(directory, exist_ok=True)
    temporary = [name + ".tmp" for name in names] + [schema_path(out_prefix) + ".tmp"]
    try:
        _write_shards(config, schema, temporary[:-1], compression)
        _write_schema(schema, temporary[-1])
        for name in [*names, schema_path(out_prefix)]:
            os.replace(name + ".tmp", name)
    finally:
        for path in temporary:
            try:
                os.remove(path)  # only left over when something failed
            except OSError:
                pass
    return names


def _write_shards(config: DatasetConfig, schema: Schema, paths: list[str], compression: str) -> None:
    """Record ``i`` of the dataset to ``paths[i % len(paths)]``."""
    writers = [TFRecordWriter(path, compression) for path in paths]
    try:
        written = 0
        with open_dataset(config, start=False) as dataset:
            for batch in dataset:
                records = encode_batch_examples(batch, schema)
                for k, writer in enumerate(writers):
                    for record in records[(k - written) % len(paths) :: len(paths)]:
                        writer.write(record)
                written += len(records)
    finally:
        for writer in writers:
            writer.close()


def _write_schema(schema: Schema, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("# Written by psflow convert: the schema of the Examples in the shards next to this file.\n")
        data = schema.to_dict()
        f.write(yaml.safe_dump({"label": data["label"]}))
        f.write("features:\n")
        for name, entry in data["features"].items():
            f.write("  " + yaml.safe_dump({name: entry}, sort_keys=False, default_flow_style=True, width=1 << 16)[1:-2] + "\n")


def add_convert_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the ``psflow convert`` options to ``parser``."""
    parser.add_argument("inputs", nargs="+", help="input files or glob patterns")
    parser.add_argument("--format", required=True, choices=("libsvm", "criteo"), help="input format")
    parser.add_argument("--output-prefix", required=True, help="output path prefix, e.g. out/train")
    parser.add_argument("--num-shards", type=int, default=1, help="number of output files (default 1)")
    parser.add_argument("--compression", choices=("none", "gzip"), default="none", help="output compression")
    parser.add_argument("--num-features", type=int, default=1 << 20,
                        help="criteo: size of each categorical column's hashed id space (default 2**20)")
    parser.add_argument("--skip-bad-records", action="store_true", help="skip and count malformed input records")
    parser.add_argument("--max-bad-records", type=int, default=100, help="with skipping: most bad records allowed")


def run_convert(args: argparse.Namespace) -> int:
    """Runs ``psflow convert`` from parsed arguments; returns the exit status (0 ok, 1 error)."""
    try:
        names = convert(
            args.inputs,
            args.format,
            args.output_prefix,
            num_shards=args.num_shards,
            compression=args.compression,
            num_features=args.num_features,
            skip_bad_records=args.skip_bad_records,
            max_bad_records=args.max_bad_records,
        )
    except (DataError, ValueError) as e:
        print(f"psflow convert: {e}", file=sys.stderr)
        return 1
    for name in names:
        print(name)
    print(schema_path(args.output_prefix))
    return 0
