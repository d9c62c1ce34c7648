"""The checks made of an input before a run starts: it holds records, and its first records parse.

:func:`require_records` refuses an input with no record in it (reading each file only up to its first
record); :func:`check_records` reads each file's first :data:`HEAD_RECORDS` records, and on to the end
while the whole input has cost no more than :data:`COUNT_BYTES`, so a malformed record near a file's start
is reported before anything starts and a small input's record count (a progress bar's total) is known.
Both read with the same readers and bad-record policy as training (:mod:`psflow.data.readers`), block,
and have no side effects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psflow.data.api import BadRecordError, DataError, DatasetConfig
from psflow.data.readers import holds_records, iter_file
from psflow.data.sharding import expand_paths

__all__ = ["COUNT_BYTES", "HEAD_RECORDS", "check_records", "require_records"]


def require_records(paths: Sequence[str] | str, format: str, *, what: str, **options: Any) -> None:
    """Refuses an input with nothing in it: none of the files ``paths`` match holds a record.

    Reads each file only up to its first record (blank lines are not records; a malformed record is
    one, left for the reading itself to report), stopping at the first file that has one, so it costs
    about one block for an input that is not empty. Blocking; no side effects.

    Args:
        paths: files or glob patterns (as for :func:`read_all`).
        format: ``"libsvm"``, ``"tfrecord"`` or ``"criteo"``.
        what: names the input in the error (a flag: ``"--train"``, ``"--eval"``).
        **options: other :class:`DatasetConfig` fields (``schema``, ``num_features``, ...).

    Raises:
        DataError: no record in any file (names the files), or a pattern matches no file, or a file cannot be read.
    """
    if isinstance(paths, str):
        paths = (paths,)
    config = DatasetConfig(tuple(paths), format, **{"batch_size": 1, "prefetch": 0, **options})
    files = expand_paths(config.paths)
    if any(holds_records(config, path) for path in files):
        return
    if len(files) == 1:
        raise DataError(f"{what} {files[0]}: the file holds no {format} records (it is empty, or only blank lines)")
    shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
    raise DataError(f"{what}: none of the {len(files)} files holds a {format} record ({shown}): the input is empty")


#: :func:`check_records` reads at least this many records of every file (a malformed one is reported before
#: anything starts) ...
HEAD_RECORDS = 1000
#: ... and goes on to the end of the files while it has read no more than this many bytes in all, so that the
#: record count of a small input is known (a progress bar's total) without reading a big one twice.
#: About 0.3 s of parsing for LIBSVM on one core.
COUNT_BYTES = 8 << 20
_CHECK_BLOCK = 256 << 10  # small blocks: a file's first HEAD_RECORDS cost little more than themselves


def check_records(paths: Sequence[str] | str, format: str, *, what: str, head_records: int = HEAD_RECORDS,
                  count_bytes: int = COUNT_BYTES, **options: Any) -> int | None:
    """Refuses an input that is empty, cannot be read, or has a malformed record near the start of a file.

    Reads each file ``paths`` matches (sorted) with the config's format and schema: its first
    ``head_records`` records (or all it has), and on to its end while no more than ``count_bytes``
    bytes (uncompressed) were read for the whole input. Malformed records follow the bad-record policy
    (``skip_bad_records``: skipped, not counted). Blocking; no side effects.

    Args:
        paths: files or glob patterns (as for :func:`read_all`).
        format: ``"libsvm"``, ``"tfrecord"`` or ``"criteo"``.
        what: names the input in errors (a flag: ``"--train"``, ``"--eval"``).
        head_records: records of each file read at least.
        count_bytes: bytes read in all, past each file's head, to count the records; 0: the heads only.
        **options: other :class:`DatasetConfig` fields (``schema``, ``num_features``, ``skip_bad_records``).

    Returns:
        The good records of the input when every file was read to its end, else None.

    Raises:
        DataError: no record in any file (as :func:`require_records`), a pattern matches no file, a file
            cannot be read, or (without ``skip_bad_records``) a malformed record; the message starts with
            ``what`` and names the file and the record.
    """
    if isinstance(paths, str):
        paths = (paths,)
    config = DatasetConfig(tuple(paths), format, **{"batch_size": 1, "prefetch": 0, "block_size": _CHECK_BLOCK,
                                                    **options})
    try:
        files = expand_paths(config.paths)
        seen, good, spent, complete = 0, 0, 0, True
        for path in files:
            file_seen, file_good, file_bytes, eof = _read_head(config, path, head_records, max(0, count_bytes - spent))
            seen, good, spent, complete = seen + file_seen, good + file_good, spent + file_bytes, complete and eof
    except DataError as e:
        raise DataError(f"{what}: {e}") from e
    if seen == 0:
        if len(files) == 1:
            raise DataError(f"{what} {files[0]}: the file holds no {format} records (it is empty, or only blank lines)")
        shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
        raise DataError(f"{what}: none of the {len(files)} files holds a {format} record ({shown}): the input is empty")
    return good if complete else None


def _read_head(config: DatasetConfig, path: str, head_records: int, budget: int) -> tuple[int, int, int, bool]:
    """Reads ``path`` up to ``head_records`` records, or on while ``budget`` bytes last; returns the records
    seen (bad ones included), the good ones, the bytes read and whether the file was read to its end."""
    bad = 0

    def on_bad(error: BadRecordError) -> None:
        nonlocal bad
        if not config.skip_bad_records:
            raise error
        bad += 1

    good, consumed = 0, 0
    pieces = iter_file(config, path, start_record=0, start_offset=0, stride=1, first=0, on_bad=on_bad)
    try:
        for piece in pieces:
            good, consumed = good + piece.batch.num_examples, piece.end_offset
            if piece.eof:
                return good + bad, good, consumed, True
            if good + bad >= head_records and consumed >= budget:
                break
    finally:
        close = getattr(pieces, "close", None)
        if close is not None:
            close()  # the file, now rather than at garbage collection
    return good + bad, good, consumed, False
