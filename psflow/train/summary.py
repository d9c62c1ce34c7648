"""TensorBoard summaries: writing scalars (chief) and reading them back (report).

Event files are written by :class:`SummaryWriter` (TFRecord-framed ``Event``
messages, as TensorFlow writes them; no TensorBoard or tensorboardX needed), in
the format TensorBoard reads (``events.out.tfevents.*``). Tags psflow writes:

=================================  =============================================
``train/loss``                     the chief's batch loss
``train/loss_ema``                 the cluster's loss (moving average, ps task 0)
``train/examples_per_sec``         cluster-wide examples/s since the last summary
``train/global_step_per_sec``      global steps/s since the last summary
``learning_rate``                  the run's learning rate in force (the next update's, at ps task 0's
                                   global_step, and written at that step, which other workers' pushes may
                                   have taken past the chief's; a schedule's value, see psflow.optim.schedules)
``ps/<i>/pulls_per_sec``           requests and bytes per second of ps task i
``ps/<i>/pushes_per_sec``
``ps/<i>/bytes_in_per_sec``
``ps/<i>/bytes_out_per_sec``
``eval/auc``, ``eval/logloss``,    periodic evaluation on the eval set
``eval/accuracy``
=================================  =============================================

A rate is left out (a gap in TensorBoard, never a negative or made-up value) for an interval in which the
cluster was restored from a checkpoint (``train/examples_per_sec``, ``train/global_step_per_sec``) or ps
task i restarted (its ``ps/<i>/*``): see :class:`psflow.train.summary_hook.SummarySaverHook`.

Reading needs no TensorBoard: :func:`read_scalars` (everything, once) and
:class:`ScalarTail` (what was appended since the last poll, for a live status
page) frame event files with psflow's TFRecord reader (length and data CRC32C
checks, :mod:`psflow.data.tfrecord`) and decode them with the scalar part of
TensorFlow's ``Event`` proto, built at run time (importing neither TensorBoard
nor tensorboardX, which imports PyTorch where it is installed: seconds, in every
chief and launcher). Both read the
scalars TensorBoard shows as scalars (``simple_value``).

Guarantees of both readers:
    * Every ``events.out.tfevents*`` file under the directory is read
      (recursively), including files that appear later (:class:`ScalarTail`).
    * Newest write wins: when several events hold the same tag and step (a
      restarted run), the one with the latest wall time is kept (on a tie, the
      one read last; files are read in path order).
    * A record still being written (the file ends inside it) is not an error:
      it is read on a later poll once complete (:func:`read_scalars` ignores it).
      A record whose data checksum is wrong is skipped; a file whose framing is
      damaged (a bad length checksum) is read up to the damage. Both are logged.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from psflow.data.api import BadRecordError, DataError
from psflow.data.tfrecord import TFRecordWriter, check_data_crcs, iter_record_chunks, looks_like_tfrecord

__all__ = ["REQUEST_COUNTERS", "ScalarTail", "SummaryWriter", "ps_restarted", "read_scalars", "set_back",
           "start_written"]

log = logging.getLogger(__name__)

_EVENTS_PREFIX = "events.out.tfevents"
_HEADER = 12  # a TFRecord header: uint64 length + masked CRC32C of it
_WRITERS = itertools.count()  # writers made by this process: part of each file's name


class SummaryWriter:
    """Writes scalar summaries into a new event file in ``logdir``, in the format TensorBoard reads.

    The file (``events.out.tfevents.<time>.<host>.<pid>.<n>``, unique per writer) is
    TFRecord-framed ``Event`` messages, the first holding the file version
    (``brain.Event:2``), as TensorFlow's own writer makes them. It is created by the
    first write, so a writer that writes nothing (a worker that could have been
    elected chief and was not) leaves no empty file. Thread-safe; each write is
    flushed to the file before it returns, so a reader (a live status page) sees it at once.

    TensorBoard reads a directory's files one after the other, in the order of their names, and a START
    (:meth:`session_start`) drops what it read before at the START's step or later. With a chief election every
    worker writes into the directory while it holds the duties, so a file is named, when it is created, to sort
    after every event file in the directory then; :meth:`continue_last` (on taking the duties over, and before a
    START) moves on to a new file where another writer's sorts after this one's: the files are read in the order
    they were written, and a START drops exactly the points written before it past its step.

    Raises:
        DataError: ``logdir``, or a file in it, cannot be created (names it); the event file itself, at the
            first write.
    """

    def __init__(self, logdir: str) -> None:
        os.makedirs(logdir, exist_ok=True)
        try:  # a file can be created there: refused now, not at the first write (after training, maybe)
            tempfile.TemporaryFile(dir=logdir).close()
        except OSError as e:
            raise DataError(f"summary directory {logdir}: cannot create a file there: {e.strerror or e}") from e
        self.logdir = logdir
        self.path = os.path.join(logdir, _file_name())  # made to sort last when the file is created
        self._lock = threading.Lock()
        self._file: TFRecordWriter | None = None
        self._closed = False
        self._event = _event_class()

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        """Writes each ``tag: value`` at ``step`` (one event; non-finite values are written as they are)."""
        event = self._event(wall_time=time.time(), step=int(step))
        for tag, value in values.items():
            event.summary.value.add(tag=tag, simple_value=float(value))
        self._append(event)

    def session_start(self, step: int, checkpoint: str | None = None, msg: str | None = None) -> None:
        """Writes a ``SessionLog`` START: training (re)starts from the model state of ``step``.

        TensorFlow's chief writes one when its session restores a checkpoint, and TensorBoard then drops the
        events of this directory's earlier files at the START's step or later. It is written at ``step + 1``,
        so TensorBoard drops the steps past ``step`` (which a resumed run trains and writes again) and keeps
        ``step`` itself: the history of the model restored, its loss and its evaluation (a finished run's
        final one), which the resumed run does not write again (TensorFlow writes it at ``step`` and loses
        them). psflow's own readers (:func:`read_scalars`, :class:`ScalarTail`) skip it: for them the newest
        write of a step wins, and older steps past it stay. ``msg`` (the SessionLog's): what the START is of, which
        :func:`start_written` finds.
        """
        event = self._event(wall_time=time.time(), step=int(step) + 1)
        event.session_log.status = 1  # SessionLog.START
        if checkpoint is not None:
            event.session_log.checkpoint_path = checkpoint
        if msg is not None:
            event.session_log.msg = msg
        self.continue_last()  # read after every point written before it, whichever writer wrote them
        self._append(event)

    def continue_last(self) -> None:
        """The next write goes to a file whose name sorts after every event file in the directory now: this
        writer's current file if it does, else a new one (another writer's was created since: a worker that held
        the chief duties meanwhile). Without it TensorBoard reads this writer's later points before the other's
        earlier ones, and a START in the later-sorting file drops this writer's later points at its step or past."""
        with self._lock:
            if self._file is None or _sorting_last(self.path) == self.path:
                return
            self._file.close()
            self._file = None
            self.path = os.path.join(self.logdir, _file_name())

    def _append(self, event: Any) -> None:
        with self._lock:
            if self._closed:
                raise ValueError(f"summary writer of {self.path}: closed")
            if self._file is None:
                self.path = _sorting_last(self.path)
                self._file = TFRecordWriter(self.path)
                self._file.write(self._event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
            self._file.write(event.SerializeToString())
            self._file.flush()

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self) -> None:
        """Flushes and closes; idempotent."""
        with self._lock:
            self._closed = True
            if self._file is not None:
                self._file.close()


def _file_name() -> str:
    """A new event file's name, unique to this writer: ``events.out.tfevents.<time>.<host>.<pid>.<n>``."""
    return f"{_EVENTS_PREFIX}.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.{next(_WRITERS)}"


def _sorting_last(path: str) -> str:
    """``path``, or the same name with a later time, so that it sorts after every event file in its directory (other
    workers' writers made in the same second sort by host and pid; a clock behind another host's). A directory that
    cannot be listed, or a newest name not of this form, leaves ``path`` as it is (its order is not ours to make)."""
    logdir, name = os.path.split(path)
    try:
        newest = max((f for f in os.listdir(logdir) if f.startswith(_EVENTS_PREFIX) and f != name), default="")
    except OSError:
        return path
    if name > newest:
        return path
    theirs, mine = newest[len(_EVENTS_PREFIX) + 1:].split(".", 1)[0], name[len(_EVENTS_PREFIX) + 1:].split(".", 1)
    if not theirs.isdigit() or len(mine) != 2:
        return path
    return os.path.join(logdir, f"{_EVENTS_PREFIX}.{int(theirs) + 1}.{mine[1]}")


#: A ps task's request counters written as ``ps/<i>/<counter>_per_sec`` (a restarted task counts them from zero).
REQUEST_COUNTERS = ("pulls", "pushes", "bytes_in", "bytes_out")


def set_back(prev: Mapping[str, Any], now: Mapping[str, Any], counts: tuple[str, ...]) -> bool:
    """Whether a restore came between two ``Stats`` of the ps task holding global_step: its generation changed,
    or one of ``counts`` went down (a restore sets them back to the checkpoint's)."""
    return now.get("generation") != prev.get("generation") or any(now[k] < prev[k] for k in counts)


def ps_restarted(prev: Mapping[str, Any], now: Mapping[str, Any]) -> bool:
    """Whether a ps task restarted between two of its ``Stats``, each with ``read_at`` (the reader's monotonic
    clock once read): a request counter went down, or, across a restore (the generation changed; a restarted
    task is restored), its ``uptime`` is shorter than the time between the two reads: it started after the
    first. Counters alone miss a restart whose new process has counted past the old one's figure (an
    interval that began with low counts: the session's start)."""
    if any(now[k] < prev[k] for k in REQUEST_COUNTERS):
        return True
    uptime, read, read_before = now.get("uptime"), now.get("read_at"), prev.get("read_at")
    return (now.get("generation") != prev.get("generation") and isinstance(uptime, (int, float))
            and isinstance(read, float) and isinstance(read_before, float) and uptime < read - read_before)


@dataclass
class _EventsFile:
    """How far one events file has been read: the next record's header offset and index."""

    offset: int = 0
    record: int = 0
    damaged: bool = False  # bad framing at ``offset``: nothing after it can be read


class ScalarTail:
    """Reads the scalars appended under ``logdir`` since the last :meth:`poll`.

    Keeps, per events file, the byte offset of the next unread record, so each
    poll reads only what was appended; new files (a restarted chief, a new
    subdirectory) are picked up by the next poll. Remembers the wall time of
    each (tag, step) it has returned, O(points) memory, so that merging the
    polls in order, a later value replacing an earlier one at the same step,
    gives exactly :func:`read_scalars` (newest write wins).

    Not thread-safe: poll from one thread at a time. Blocking file reads only.
    """

    def __init__(self, logdir: str) -> None:
        self.logdir = logdir
        self._files: dict[str, _EventsFile] = {}
        self._latest: dict[str, dict[int, float]] = {}  # tag -> step -> wall time of the value returned
        self._event_type: Any = None

    def poll(self) -> dict[str, list[tuple[int, float]]]:
        """Scalars written since the last poll: tag -> [(step, value)], by step.

        A step appears once per poll (its newest write); a step returned by an
        earlier poll appears again only when a newer write of it was read (a
        restarted run writing the same steps again). Tags with nothing new are
        absent; the first poll returns everything written so far.

        Never raises for a file that vanished, cannot be read or is damaged:
        those are logged and skipped (see the module's guarantees).
        """
        fresh: dict[str, dict[int, tuple[float, float]]] = {}
        for path in self._find_files():
            state = self._files.setdefault(path, _EventsFile())
            try:
                size = os.path.getsize(path)
            except OSError:
                continue  # gone since it was listed
            if size < state.offset:  # replaced by a shorter file: read the new one from its start
                log.warning("%s: shrank below byte %d; reading it again from the start", path, state.offset)
                state.offset, state.record, state.damaged = 0, 0, False
            if state.damaged or size == state.offset:
                continue
            for wall, step, tag, value in self._read_new(path, state):
                newest = self._latest.setdefault(tag, {})
                if step not in newest or wall >= newest[step]:
                    newest[step] = wall
                    fresh.setdefault(tag, {})[step] = (wall, value)
        return {tag: [(step, v) for step, (_, v) in sorted(series.items())] for tag, series in fresh.items()}

    def _find_files(self) -> list[str]:
        found = [os.path.join(root, f) for root, _dirs, files in os.walk(self.logdir)
                 for f in files if f.startswith(_EVENTS_PREFIX)]
        return sorted(found)

    def _read_new(self, path: str, state: _EventsFile) -> list[tuple[float, int, str, float]]:
        """(wall time, step, tag, value) of each scalar in the complete records after ``state``; advances it."""
        out: list[tuple[float, int, str, float]] = []
        try:
            for chunk in iter_record_chunks(path, "none", start_offset=state.offset, start_record=state.record):
                rows = np.arange(len(chunk.lengths), dtype=np.int64)
                bad = set(check_data_crcs(chunk, rows).tolist())
                for i in rows.tolist():
                    if i in bad:
                        log.warning("%s: record %d at byte %d: data checksum mismatch; skipped", path,
                                    int(chunk.record_index[i]), int(chunk.offsets[i]))
                        continue
                    s = int(chunk.data_starts[i])
                    out.extend(self._scalars_of(path, chunk.buf[s : s + int(chunk.lengths[i])]))
                state.offset, state.record = chunk.end_offset, chunk.end_record
        except BadRecordError as e:
            # The file ends inside a record (a writer mid-append: read it next poll) or its framing is damaged.
            if e.offset is not None and _framing_damaged(path, e.offset):
                log.warning("%s; the rest of this file is not read", e)
                state.damaged = True
        except DataError as e:
            log.warning("%s", e)  # cannot be opened or read now: the next poll tries again
        return out

    def _scalars_of(self, path: str, data: bytes) -> list[tuple[float, int, str, float]]:
        if self._event_type is None:
            self._event_type = _event_class()
        event = self._event_type()
        try:
            event.ParseFromString(data)
        except Exception as e:  # protobuf's DecodeError: the checksum was right, so a writer's bug; skip the event
            log.warning("%s: an event that does not decode (%s); skipped", path, e)
            return []
        if not event.HasField("summary"):
            return []  # file_version, session logs, ...
        wall, step = float(event.wall_time), int(event.step)
        return [(wall, step, v.tag, float(v.simple_value)) for v in event.summary.value if v.HasField("simple_value")]


# The part of TensorFlow's ``Event`` (tensorflow/core/util/event.proto) that scalars live in, built at run time
# as psflow.data.example_pb builds ``Example``: importing tensorboardX's generated Event imports the whole package,
# and with it PyTorch where that is installed (seconds, in the launcher, for every run). proto2, so that
# ``HasField`` tells a scalar from the value kinds left out here (images, histograms: unknown fields).
_EVENT_DESCRIPTOR_TEXT = """
name: "psflow/train/event_scalars.proto" package: "psflow.summary" syntax: "proto2"
message_type { name: "Value"
  field { name: "tag" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
  field { name: "simple_value" number: 2 label: LABEL_OPTIONAL type: TYPE_FLOAT } }
message_type { name: "Summary"
  field { name: "value" number: 1 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".psflow.summary.Value" } }
message_type { name: "Event"
  field { name: "wall_time" number: 1 label: LABEL_OPTIONAL type: TYPE_DOUBLE }
  field { name: "step" number: 2 label: LABEL_OPTIONAL type: TYPE_INT64 }
  field { name: "file_version" number: 3 label: LABEL_OPTIONAL type: TYPE_STRING }
  field { name: "summary" number: 5 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".psflow.summary.Summary" }
  field { name: "session_log" number: 7 label: LABEL_OPTIONAL type: TYPE_MESSAGE
          type_name: ".psflow.summary.SessionLog" } }
message_type { name: "SessionLog"
  field { name: "status" number: 1 label: LABEL_OPTIONAL type: TYPE_ENUM
          type_name: ".psflow.summary.SessionLog.SessionStatus" }
  field { name: "checkpoint_path" number: 2 label: LABEL_OPTIONAL type: TYPE_STRING }
  field { name: "msg" number: 3 label: LABEL_OPTIONAL type: TYPE_STRING }
  enum_type { name: "SessionStatus" value { name: "STATUS_UNSPECIFIED" number: 0 } value { name: "START" number: 1 }
              value { name: "STOP" number: 2 } value { name: "CHECKPOINT" number: 3 } } }
"""


@functools.cache
def _event_class() -> Any:
    """The ``Event`` message class (scalars only), in a private descriptor pool; cached, thread-safe."""
    descriptor_pb2 = importlib.import_module("google.protobuf.descriptor_pb2")
    descriptor_pool = importlib.import_module("google.protobuf.descriptor_pool")
    message_factory = importlib.import_module("google.protobuf.message_factory")
    text_format = importlib.import_module("google.protobuf.text_format")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(text_format.Parse(_EVENT_DESCRIPTOR_TEXT, descriptor_pb2.FileDescriptorProto()))
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("psflow.summary.Event"))


def _framing_damaged(path: str, offset: int) -> bool:
    """True if the record header at ``offset`` is complete and its length checksum is wrong.

    False for a header the file ends inside, or a good header whose record the file
    ends inside: a record still being appended.
    """
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            head = f.read(_HEADER)
    except OSError:
        return False
    return len(head) >= _HEADER and not looks_like_tfrecord(head)


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar under ``logdir`` (searched recursively): tag -> [(step, value)], by step.

    When several event files hold the same tag and step (a restarted run), the
    newest write wins. Blocking; needs no TensorBoard (see the module's guarantees).
    """
    return ScalarTail(logdir).poll()


def start_written(logdir: str, msg: str) -> bool:
    """Whether an event file in ``logdir`` (its own files, TensorBoard's run) holds a SessionLog START whose ``msg``
    is ``msg`` (:meth:`SummaryWriter.session_start`). Every write is flushed, so another worker's START is seen once
    its write returned. A file that cannot be read, or the part of it past damage, counts as holding none (logged)."""
    try:
        names = sorted(f for f in os.listdir(logdir) if f.startswith(_EVENTS_PREFIX))
    except OSError as e:
        log.warning("summary directory %s: not listed (%s): its STARTs are not known", logdir, e)
        return False
    event_type = _event_class()
    for name in names:
        path = os.path.join(logdir, name)
        try:
            for chunk in iter_record_chunks(path, "none"):
                for i in range(len(chunk.lengths)):
                    event = event_type()
                    s = int(chunk.data_starts[i])
                    try:
                        event.ParseFromString(chunk.buf[s : s + int(chunk.lengths[i])])
                    except Exception:  # protobuf's DecodeError (the checksum was right): not a START of ours
                        continue
                    if event.HasField("session_log") and event.session_log.status == 1 and event.session_log.msg == msg:
                        return True
        except (BadRecordError, DataError) as e:  # a record being appended, damage, or the file gone since
            log.info("%s: read up to %s", path, e)
    return False
