"""Where psflow reads and writes files: the local filesystem, or object storage through fsspec.

A *location* is a local path or a URL whose scheme names a store::

    runs/ckpt, /data/a9a           the local filesystem (also file:///data/a9a)
    s3://bucket/prefix             Amazon S3 or an S3-compatible store (s3fs; pip install 'psflow[cloud]')
    gs://bucket/prefix, gcs://...  Google Cloud Storage (gcsfs; pip install 'psflow[cloud]')
    hdfs://namenode:8020/path      HDFS through pyarrow's filesystem (pip install pyarrow; UNTESTED)

Any other scheme is refused with :class:`UnknownSchemeError`, one line naming
it and the schemes psflow knows (before this module existed,
``--checkpoint-dir gs://bucket/ckpt`` silently wrote to a local folder
``./gs:/bucket/ckpt``). A known scheme whose client library is not installed
stops with :class:`~psflow.extras.MissingExtraError` naming the extra.

Endpoints and credentials are the client's own, from its standard settings;
psflow passes none: s3fs reads ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``, ``AWS_PROFILE`` (botocore's
configuration); gcsfs reads ``GOOGLE_APPLICATION_CREDENTIALS`` (or the
machine's default credentials) and ``STORAGE_EMULATOR_HOST`` for an emulator
(``http://host:port``; with an emulator also set ``NO_GCE_CHECK=true`` and
``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``, or gcsfs probes the GCE metadata
server and asks the emulator for the bucket's layout over gRPC, which it does
not serve, retrying for minutes). Every task of a run reads them from its own
environment (the local launcher's tasks inherit the launcher's).

What each operation guarantees, local and remote:

* :func:`write_atomically`: a reader sees the old object or the whole new one,
  never part of one. Local: a temp file beside it, fsync, rename, fsync of the
  directory. Object stores have no rename: one PUT (s3fs sends one
  ``PutObject`` or a multipart upload, gcsfs one upload; either way the object
  appears only once complete). HDFS: a temp file then a rename.
* :func:`create_exclusive`: writes only if nothing is there, as one decision of
  the store: local ``O_CREAT | O_EXCL``; S3 ``If-None-Match: *``; GCS
  ``ifGenerationMatch=0``. A store that ignores the condition (the GCS
  emulator does) makes it a check-then-write: best effort.
* Listings are never cached (fsspec's listings cache is off): another process's
  writes are seen at the next call, as S3 and GCS list consistently.
* A "directory" in an object store is a prefix: it exists while an object lies
  under it; :func:`makedirs` does nothing there and :func:`sync_dir` neither.
* A call a store refuses or fails raises an ``OSError`` (as the same failure of
  a disk does) whose one line names the URL and what to set
  (:func:`~psflow.storage.client.client_errors`): a write into a bucket that does
  not exist (:class:`BucketMissingError`), no or refused credentials
  (:class:`StoreDeniedError`), an endpoint that did not answer within the
  client's own retries (:class:`StoreUnreachableError`); so do the reads and
  seeks of a stream :func:`open_for_read` opened. Before, some reached the user
  without the URL, and botocore's and google-auth's as a traceback.

Not here: the meaning of files (checkpoints: :mod:`psflow.checkpoint`;
the run lock over a store: :mod:`psflow.checkpoint.lock`).

Files: ``__init__.py`` -- the operations above, on any location; ``client.py`` -- a store's client: the
schemes and the library serving each (:data:`SCHEMES`, :func:`check_location`), the fsspec filesystem of a URL,
:class:`StorageError` and the store errors made one line (:func:`~psflow.storage.client.client_errors`).
"""

from __future__ import annotations

import glob as _glob
import os
import shutil
from typing import IO, Any, cast

from psflow.storage.client import (
    SCHEMES,
    URL,
    BucketMissingError,
    StorageError,
    StoreDeniedError,
    StoreError,
    StoreReader,
    StoreUnreachableError,
    UnknownSchemeError,
    check_location,
    client_errors,
    filesystem,
    scheme,
    url_prefix,
)

__all__ = [
    "SCHEMES",
    "StorageError",
    "UnknownSchemeError",
    "StoreError",
    "BucketMissingError",
    "StoreDeniedError",
    "StoreUnreachableError",
    "NotLocalError",
    "local_only",
    "scheme",
    "is_remote",
    "check_location",
    "absolute",
    "is_under",
    "open_for_read",
    "read_bytes",
    "read_head",
    "write_atomically",
    "create_exclusive",
    "exists",
    "isfile",
    "isdir",
    "islink",
    "listdir",
    "subdirectories",
    "glob",
    "has_magic",
    "makedirs",
    "remove",
    "remove_tree",
    "sync_dir",
    "rename_dir",
    "version",
    "download",
]

#: Bytes fetched per request when a remote file is streamed (fsspec's readahead block).
READ_BLOCK = 8 << 20


class NotLocalError(StorageError, ValueError):
    """A URL given where psflow writes only to the local filesystem (names the flag and the URL)."""


def is_remote(path: str) -> bool:
    """``path`` is a URL of a store (not a local path or ``file://``)."""
    return scheme(path) is not None


def _local(path: str) -> str:
    """A local path as the OS takes it (``file://`` removed)."""
    return path[len("file://"):] if path[:7].lower() == "file://" else path


def local_only(path: str, flag: str, what: str) -> None:
    """Refuses a URL for a flag whose files psflow writes only to a local path, without touching it.

    Before, such a flag given a URL made a local folder of it (``--output s3://b/run``
    became ``./s3:/b/run``).

    Raises:
        NotLocalError: ``path`` is a URL of any scheme (``file://`` included: give the path itself):
            one line naming ``flag``, the URL, ``what`` is written there, and the flags that take
            object storage.
    """
    if URL.match(path) is None:
        return
    raise NotLocalError(f"{flag} {path}: {what} are written to a local directory, not to a URL: give a local "
                        "path (object storage, s3:// or gs://, is for --checkpoint-dir, --train, --eval and "
                        "--warm-start)")


def absolute(path: str) -> str:
    """A local path made absolute; a URL as it is."""
    return path if is_remote(path) else os.path.abspath(_local(path))


def is_under(root: str, path: str) -> bool:
    """``path`` lies inside ``root`` (both local, symlinks resolved; or both URLs of one store, no ``..``)."""
    if is_remote(root) != is_remote(path):
        return False
    if not is_remote(root):
        real_root = os.path.realpath(_local(root))
        real = os.path.realpath(_local(path))
        return os.path.commonpath([real_root, real]) == real_root
    if scheme(root) != scheme(path) or any(part in ("..", ".") for part in path.split("/")[3:]):
        return False
    return path.startswith(root.rstrip("/") + "/")


# ---- reading ------------------------------------------------------------------
def open_for_read(path: str) -> IO[bytes]:
    """``path`` opened for reading bytes (seekable); a remote object is streamed in :data:`READ_BLOCK` requests.

    Raises:
        OSError: missing or unreadable (FileNotFoundError when missing).
    """
    if not is_remote(path):
        return open(_local(path), "rb")
    fs, inner = filesystem(path)
    with client_errors(path):
        handle = fs.open(inner, "rb", block_size=READ_BLOCK, cache_type="readahead")
    return cast(IO[bytes], StoreReader(path, handle))  # its reads and seeks raise the store's errors in one line


def read_bytes(path: str) -> bytes:
    """The whole file. Raises OSError (FileNotFoundError when missing)."""
    if not is_remote(path):
        with open(_local(path), "rb") as f:
            return f.read()
    fs, inner = filesystem(path)
    with client_errors(path):
        data: bytes = fs.cat_file(inner)
    return data


def read_head(path: str, size: int) -> bytes:
    """The first ``size`` bytes (fewer for a shorter file), in one request. Raises OSError."""
    if not is_remote(path):
        with open(_local(path), "rb") as f:
            return f.read(size)
    fs, inner = filesystem(path)
    with client_errors(path):
        data: bytes = fs.cat_file(inner, start=0, end=size)
    return data


def download(path: str, local_file: str) -> None:
    """Copies ``path`` (any location) to the local file ``local_file``. Raises OSError."""
    if not is_remote(path):
        shutil.copyfile(_local(path), local_file)
        return
    fs, inner = filesystem(path)
    with client_errors(path):
        fs.get_file(inner, local_file)


def version(path: str) -> tuple[Any, ...]:
    """What changes when the file is rewritten: (size, mtime) locally, (size, etag or generation) remotely.

    Raises:
        OSError: missing or unreadable.
    """
    if not is_remote(path):
        st = os.stat(_local(path))
        return (st.st_size, st.st_mtime_ns)
    fs, inner = filesystem(path)
    with client_errors(path):
        info = fs.info(inner)
    return (info.get("size"), str(info.get("ETag") or info.get("generation") or info.get("mtime") or ""))


# ---- writing ------------------------------------------------------------------
def write_atomically(path: str, data: bytes | memoryview, *, durable: bool = True) -> None:
    """Writes ``data`` to ``path`` so that ``path`` is either absent, as before, or complete (see the module docstring).

    Every file psflow replaces whole is written here (checkpoints, the run lock, the global_step journal,
    exports, a run's status and metrics files, a task's error file).

    Args:
        durable: locally, fsync the file before the rename and the directory after it, so the new
            content survives a crash of the machine. ``False`` for a file rewritten every second whose
            loss in a crash costs nothing (``status.json``): still never seen half written.

    Raises:
        OSError: the directory (or bucket) is not writable; locally the temp file is removed.
    """
    if is_remote(path):
        fs, inner = filesystem(path)
        with client_errors(path, writing=True):
            if scheme(path) == "hdfs":  # HDFS shows a file while it is written; its rename is atomic
                tmp = f"{inner}.tmp-{os.getpid()}"
                fs.pipe_file(tmp, bytes(data))
                fs.mv(tmp, inner)
            else:
                fs.pipe_file(inner, bytes(data))
        return
    path = _local(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    if durable:
        sync_dir(directory)


def create_exclusive(path: str, data: bytes) -> bool:
    """Writes ``path`` only if nothing is there; True if this call created it (see the module docstring).

    Raises:
        OSError: the location is not writable.
    """
    if is_remote(path):
        fs, inner = filesystem(path)
        try:
            with client_errors(path, writing=True):
                fs.pipe_file(inner, data, mode="create")
        except FileExistsError:
            return False
        return True
    try:
        fd = os.open(_local(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def makedirs(path: str) -> None:
    """Creates a local directory and its parents (as ``os.makedirs(exist_ok=True)``); nothing for a URL."""
    if not is_remote(path):
        os.makedirs(_local(path), exist_ok=True)


def sync_dir(path: str) -> None:
    """fsyncs a local directory (its entries are durable); nothing for a URL."""
    if is_remote(path):
        return
    fd = os.open(_local(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rename_dir(path: str, target: str) -> None:
    """Renames the local directory ``path`` to ``target`` in one step (one filesystem: a reader sees it under
    one name or the other); the caller syncs the parent (:func:`sync_dir`) where that must survive a crash.

    Raises:
        StorageError: ``path`` or ``target`` is in an object store (its "directories" are prefixes: no rename).
        OSError: as ``os.rename``.
    """
    if is_remote(path) or is_remote(target):
        raise StorageError(f"cannot rename {path} to {target}: an object store has no rename")
    os.rename(_local(path), _local(target))


def remove(path: str) -> None:
    """Deletes one file. Raises OSError (FileNotFoundError when missing)."""
    if not is_remote(path):
        os.unlink(_local(path))
        return
    fs, inner = filesystem(path)
    with client_errors(path):
        if not fs.isfile(inner):
            raise FileNotFoundError(f"{path}: no such file")
        fs.rm_file(inner)


def remove_tree(path: str, *, ignore_errors: bool = False) -> None:
    """Deletes a directory (a prefix: every object under it) and what it holds.

    Raises:
        OSError: unless ``ignore_errors``.
    """
    if not is_remote(path):
        shutil.rmtree(_local(path), ignore_errors=ignore_errors)
        return
    fs, inner = filesystem(path)
    try:
        with client_errors(path):
            fs.rm(inner + "/", recursive=True)
    except OSError:
        if not ignore_errors:
            raise


# ---- looking ------------------------------------------------------------------
def exists(path: str) -> bool:
    """A file or a directory (a prefix with objects under it) is there. Never raises for a missing one."""
    if not is_remote(path):
        return os.path.exists(_local(path))
    fs, inner = filesystem(path)
    with client_errors(path):
        return bool(fs.exists(inner))


def isfile(path: str) -> bool:
    """``path`` is a file (an object)."""
    if not is_remote(path):
        return os.path.isfile(_local(path))
    fs, inner = filesystem(path)
    with client_errors(path):
        return bool(fs.isfile(inner))


def isdir(path: str) -> bool:
    """``path`` is a directory (remotely: objects lie under the prefix)."""
    if not is_remote(path):
        return os.path.isdir(_local(path))
    fs, inner = filesystem(path)
    with client_errors(path):
        return bool(fs.isdir(inner))


def islink(path: str) -> bool:
    """``path`` is a local symlink (a store has none)."""
    return not is_remote(path) and os.path.islink(_local(path))


def listdir(path: str) -> list[str]:
    """The names directly inside directory ``path`` (files and directories), unsorted.

    Raises:
        OSError: FileNotFoundError when ``path`` is not there (remotely: nothing lies under it).
    """
    if not is_remote(path):
        return os.listdir(_local(path))
    fs, inner = filesystem(path)
    with client_errors(path):
        entries = fs.ls(inner, detail=False)
    names = [str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries if str(e).rstrip("/") != inner]
    return [n for n in names if n]


def subdirectories(path: str, prefix: str = "") -> list[str]:
    """The directories directly inside ``path`` whose names start with ``prefix``, as paths, sorted by name.

    Local symlinks are left out (they lead elsewhere). A missing ``path`` has none.
    """
    if not is_remote(path):
        try:
            names = sorted(n for n in os.listdir(_local(path)) if n.startswith(prefix))
        except FileNotFoundError:
            return []
        paths = [os.path.join(path, n) for n in names]
        return [p for p in paths if os.path.isdir(_local(p)) and not os.path.islink(_local(p))]
    fs, inner = filesystem(path)
    try:
        with client_errors(path):
            entries = fs.ls(inner, detail=True)
    except FileNotFoundError:
        return []
    names = sorted({str(e["name"]).rstrip("/").rsplit("/", 1)[-1] for e in entries
                    if e.get("type") == "directory" and str(e["name"]).rstrip("/") != inner})
    return [f"{path.rstrip('/')}/{n}" for n in names if n.startswith(prefix)]


def has_magic(pattern: str) -> bool:
    """``pattern`` holds glob characters (``*``, ``?``, ``[``)."""
    return _glob.has_magic(pattern)


def glob(pattern: str) -> list[str]:
    """The files ``pattern`` matches, sorted: local paths as :func:`glob.glob` gives them, URLs with their scheme.

    ``*`` and ``?`` do not cross ``/``; directories are left out. No match: an empty list.

    Raises:
        UnknownSchemeError, MissingExtraError: see :func:`check_location`.
    """
    if not is_remote(pattern):
        local = _local(pattern)
        found = [m for m in _glob.glob(local) if os.path.isfile(m)]
        return sorted(found if local == pattern else [f"file://{m}" for m in found])
    fs, inner = filesystem(pattern)
    head = url_prefix(pattern, inner)
    with client_errors(pattern):
        matches = fs.glob(inner, detail=True)
    return sorted(f"{head}{'' if name.startswith('/') or head.endswith('/') else '/'}{name}"
                  for name, info in matches.items() if info.get("type") == "file")

