"""psflow.data: input pipeline -- TFRecord, LIBSVM and Criteo readers, sharding, batching.

Classes and functions, by file:

* ``api.py`` -- :class:`DataError`, :class:`BadRecordError`,
  :class:`TooManyBadRecordsError`, :class:`DatasetConfig`,
  :class:`ReaderPosition`, :class:`ShuffleState`, :class:`DatasetStats`,
  :class:`FileStats`.
* ``dataset.py`` -- :class:`Dataset`, :func:`open_dataset`, :func:`read_all`.
* ``batch.py`` -- :class:`SparseBatch` (CSR rows + labels + dense features).
* ``sharding.py`` -- :func:`shard_plan`, :class:`WorkerShard`,
  :func:`expand_paths`, :func:`epoch_file_order`.
* ``shuffle.py`` -- the deterministic, resumable shuffle buffer.
* ``prefetch.py`` -- the background thread (:class:`Prefetcher`).
* ``readers.py`` -- per-format file readers; ``source.py`` -- plain/gzip bytes.
* ``tfrecord.py`` -- :class:`TFRecordWriter`, :func:`read_records`, framing and CRCs.
* ``native.py`` -- which implementation runs the per-byte loops of TFRecord
  parsing: the optional C extension ``_native`` (``_native.c``) or numpy.
* ``example.py`` + ``example.proto`` -- ``tf.train.Example`` decoding by
  schema (:func:`parse_examples`) and encoding (:func:`encode_example`);
  ``example_pb.py`` -- the same messages as protobuf classes, built at run
  time (the general decoding path; no generated code).
* ``schema.py`` -- :class:`Schema`, :class:`FixedLenFeature`,
  :class:`VarLenFeature`, :class:`SparseFeature`, :func:`default_sparse_schema`.
* ``libsvm.py``, ``criteo.py``, ``text.py`` -- vectorized text parsing.
* ``convert.py`` -- :func:`convert` (LIBSVM/Criteo -> sharded TFRecord) and
  the ``psflow convert`` command-line hooks.

Guarantees:

* **Exactly once.** Across the workers of a :func:`shard_plan`, every record
  of every file is read by exactly one worker per epoch.
* **Exact resume.** :meth:`Dataset.position` is the point just after the last
  batch handed out; a dataset opened with ``resume_from=`` that position (and
  the same config) yields exactly the remaining records in the same order --
  none skipped, none repeated -- with or without shuffling, across epochs.
* **Determinism.** Output depends only on the files and the config (seed
  included), never on timing, block sizes or prefetch depth.
* **Bad input is named.** Errors give the file and the 1-based line (text) or
  the 0-based record index and byte offset (TFRecord).  With
  ``skip_bad_records`` bad records are skipped and counted, up to
  ``max_bad_records`` per epoch.
* **Bounded memory.** Files are read in blocks of ``block_size`` (1 MiB);
  at most ``prefetch`` batches wait in the queue; the shuffle buffer holds at
  most ``shuffle_buffer`` records.
* **Prompt shutdown.** :meth:`Dataset.close` is idempotent and never hangs.

Not guaranteed: balanced shards in file mode (a worker gets whole files);
resuming with a different ``num_workers``, ``shuffle_buffer``,
``min_after_dequeue`` or seed (refused with :class:`DataError`).
The library reads no environment variables.
"""

from psflow.data.api import (
    FORMATS,
    BadRecordError,
    DataError,
    DatasetConfig,
    DatasetStats,
    FileStats,
    ReaderPosition,
    ShuffleState,
    TooManyBadRecordsError,
)
from psflow.data.batch import SparseBatch
from psflow.data.convert import add_convert_arguments, convert, run_convert
from psflow.data.dataset import Dataset, open_dataset, read_all
from psflow.data.example import ParsedExamples, Ragged, encode_example, parse_examples
from psflow.data.schema import FixedLenFeature, Schema, SparseFeature, VarLenFeature, default_sparse_schema
from psflow.data.sharding import WorkerShard, epoch_file_order, expand_paths, shard_plan
from psflow.data.tfrecord import TFRecordWriter, read_records

__all__ = [
    "FORMATS",
    "BadRecordError",
    "DataError",
    "Dataset",
    "DatasetConfig",
    "DatasetStats",
    "FileStats",
    "FixedLenFeature",
    "ParsedExamples",
    "Ragged",
    "ReaderPosition",
    "Schema",
    "ShuffleState",
    "SparseBatch",
    "SparseFeature",
    "TFRecordWriter",
    "TooManyBadRecordsError",
    "VarLenFeature",
    "WorkerShard",
    "add_convert_arguments",
    "convert",
    "default_sparse_schema",
    "encode_example",
    "epoch_file_order",
    "expand_paths",
    "open_dataset",
    "parse_examples",
    "read_all",
    "read_records",
    "run_convert",
    "shard_plan",
]
