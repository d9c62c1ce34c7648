"""psflow.data: input pipeline -- TFRecord, LIBSVM and Criteo readers, sharding, batching.

Every format gives :class:`Batch` objects: float32 labels, named sparse
features (:class:`SparseColumn`, CSR rows of int64 ids and float32 values) and
named dense features.  LIBSVM gives one sparse feature
(:data:`DEFAULT_SPARSE_FEATURE`); Criteo TSV 13 dense (``I1``..``I13``) and 26
sparse (``C1``..``C26``) ones; TFRecord what its :class:`Schema` names.
:func:`batch_spec` says which features and sizes a dataset's batches have,
without reading it.

Classes and functions, by file:

* ``api.py`` -- :class:`DataError`, :class:`BadRecordError`,
  :class:`TooManyBadRecordsError`, :class:`DatasetConfig`,
  :class:`ReaderPosition`, :class:`ShuffleState`, :class:`DatasetStats`,
  :class:`FileStats`.
* ``dataset.py`` -- :class:`Dataset` (files -> reader -> shuffle -> batcher -> prefetch),
  :func:`open_dataset`, :func:`epoch_start` (where an epoch begins: a resume under another sharding),
  :func:`read_all`.
* ``checks.py`` -- :func:`require_records`, :func:`check_records` (the checks made before a run
  starts), :data:`~psflow.data.checks.HEAD_RECORDS`, :data:`~psflow.data.checks.COUNT_BYTES`.
* ``batch.py`` -- :class:`Batch` (labels, named sparse features as :class:`SparseColumn`,
  named dense features), :class:`BatchSpec` (feature names and sizes),
  :class:`BatchSource` (the files and record ranges a dataset's batch came from).
* ``labels.py`` -- :class:`LabelSpec`: the labels a model accepts (:data:`BINARY_LABELS`,
  :data:`FINITE_LABELS`), checked by the readers.
* ``hashing.py`` -- stable 64-bit hashing of ids and strings (splitmix64,
  per-feature salts, the string hash of string features and Criteo).
* ``sharding.py`` -- :func:`shard_plan`, :class:`WorkerShard`,
  :func:`expand_paths`, :func:`epoch_file_order`.
* ``shuffle.py`` -- the deterministic, resumable shuffle buffer.
* ``prefetch.py`` -- the background thread (:class:`Prefetcher`);
  ``reader_process.py`` -- the forked reader (:class:`ReaderProcess`).
* ``readers.py`` -- per-format file readers; ``source.py`` -- plain/gzip bytes.
* ``tfrecord.py`` -- :class:`TFRecordWriter`, :func:`read_records`, framing and CRCs.
* ``native.py`` -- which implementation runs the per-byte loops of TFRecord
  parsing: the optional C extension ``_native`` (``_native.c``) or numpy.
* ``schema.py`` -- :class:`Schema` (from YAML/JSON or ``--feature`` flags),
  :func:`default_sparse_schema`, :func:`batch_spec`; ``features.py`` -- the
  feature kinds :class:`FixedLenFeature`, :class:`VarLenFeature`,
  :class:`SparseFeature` (dense ones with a ``normalizer``, e.g. ``log1p``)
  and their YAML/JSON and flag forms; ``infer.py`` -- :func:`infer_schema`, a
  schema guessed from a TFRecord file's first records (what ``--format
  tfrecord`` uses without a schema), and ``psflow schema infer``.
* ``example.py`` + ``example.proto`` -- ``tf.train.Example`` decoding by
  schema (:func:`parse_examples`) into batches; ``example_wire.py`` -- the
  vectorized decoder's loops over the wire format (C or numpy);
  ``example_encode.py`` -- encoding (:func:`encode_example`, many at once);
  ``example_pb.py`` -- the same messages as protobuf classes, built at run
  time (the general decoding path; no generated code).
* ``libsvm.py``, ``criteo.py``, ``text.py`` -- vectorized text parsing.
* ``convert.py`` -- :func:`convert` (LIBSVM/Criteo -> sharded TFRecord plus
  the schema file that reads them back) and the ``psflow convert``
  command-line hooks.

Guarantees:

* **Exactly once.** Across the workers of a :func:`shard_plan`, every record
  of every file is read by exactly one worker per epoch.
* **Exact resume.** :meth:`Dataset.position` is the point just after the last
  batch handed out; a dataset opened with ``resume_from=`` that position (and
  the same config) yields exactly the remaining records in the same order --
  none skipped, none repeated -- with or without shuffling, across epochs.
* **Determinism.** Output depends only on the files and the config (seed
  included), never on timing, block sizes, prefetch depth, the reader process
  or which loops (C or numpy) run.
* **Stable ids.** Hashed ids (Criteo, string features) are defined by the
  arithmetic in ``hashing.py``: the same on every run, machine and numpy version.
* **Same features in every batch.** Every batch of a dataset has the same
  sparse and dense feature names, in the same order (:func:`batch_spec`).
* **Bad input is named.** Errors give the file and the 1-based line (text) or
  the 0-based record index and byte offset (TFRecord), and the feature when
  one is at fault.  A label the config's :class:`LabelSpec` refuses (NaN and
  infinities always; a binary model's anything but 0 and 1) makes a bad record
  too.  With ``skip_bad_records`` bad records are skipped and
  counted, up to ``max_bad_records`` per epoch.  Every batch a dataset hands
  out names its files and record ranges (:attr:`Batch.source`).  A schema feature that no
  record of a file's first chunk has is a :class:`DataError` naming it.
* **Bounded memory.** Files are read in blocks of ``block_size`` (1 MiB);
  at most ``prefetch`` batches wait in the queue; the shuffle buffer holds at
  most ``shuffle_buffer`` records.
* **Prompt shutdown.** :meth:`Dataset.close` is idempotent and never hangs.

Not guaranteed: balanced shards in file mode (a worker gets whole files);
resuming with a different ``num_workers``, ``shuffle_buffer``,
``min_after_dequeue`` or seed (refused with :class:`DataError`); that a
rare schema feature is caught as missing (the check looks at the first chunk
of each file only, so it depends on ``block_size``; mark such features
``optional``).  The library reads no environment variables.
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
from psflow.data.batch import DEFAULT_SPARSE_FEATURE, Batch, BatchSource, BatchSpec, SparseColumn
from psflow.data.checks import check_records, require_records
from psflow.data.convert import add_convert_arguments, convert, run_convert
from psflow.data.dataset import Dataset, epoch_start, open_dataset, read_all
from psflow.data.example import ParsedExamples, Ragged, encode_example, parse_examples
from psflow.data.infer import InferredSchema, infer_schema
from psflow.data.labels import BINARY_LABELS, FINITE_LABELS, LabelSpec
from psflow.data.schema import FixedLenFeature, Schema, SparseFeature, VarLenFeature, batch_spec, default_sparse_schema
from psflow.data.sharding import WorkerShard, epoch_file_order, expand_paths, shard_plan
from psflow.data.tfrecord import TFRecordWriter, read_records

__all__ = [
    "FORMATS",
    "BINARY_LABELS",
    "BadRecordError",
    "Batch",
    "BatchSource",
    "BatchSpec",
    "DEFAULT_SPARSE_FEATURE",
    "DataError",
    "Dataset",
    "DatasetConfig",
    "DatasetStats",
    "FINITE_LABELS",
    "FileStats",
    "FixedLenFeature",
    "InferredSchema",
    "LabelSpec",
    "ParsedExamples",
    "Ragged",
    "ReaderPosition",
    "Schema",
    "ShuffleState",
    "SparseColumn",
    "SparseFeature",
    "TFRecordWriter",
    "TooManyBadRecordsError",
    "VarLenFeature",
    "WorkerShard",
    "add_convert_arguments",
    "batch_spec",
    "check_records",
    "convert",
    "default_sparse_schema",
    "encode_example",
    "epoch_file_order",
    "epoch_start",
    "expand_paths",
    "infer_schema",
    "open_dataset",
    "parse_examples",
    "read_all",
    "require_records",
    "read_records",
    "run_convert",
    "shard_plan",
]
