"""The client of an object store: which library serves a URL's scheme, its fsspec filesystem, and its errors.

:mod:`psflow.storage` (the operations every location supports) asks here for the filesystem of a URL; nothing
else in psflow imports fsspec or a store's client library.
"""

from __future__ import annotations

import contextlib
import errno
import io
import re
import sys
import threading
from collections.abc import Iterator
from typing import Any

from psflow.errors import PsflowError

__all__ = ["SCHEMES", "URL", "StorageError", "UnknownSchemeError", "StoreError", "BucketMissingError",
           "StoreDeniedError", "StoreUnreachableError", "StoreReader", "scheme", "check_location", "filesystem",
           "client_errors", "url_prefix"]

#: Scheme -> (the module that serves it, how to install it, whether psflow's tests run it).
SCHEMES: dict[str, tuple[str, str, bool]] = {
    "s3": ("s3fs", "pip install 'psflow[cloud]'", True),
    "gs": ("gcsfs", "pip install 'psflow[cloud]'", True),
    "gcs": ("gcsfs", "pip install 'psflow[cloud]'", True),
    "hdfs": ("pyarrow", "pip install pyarrow (and a Hadoop client: libhdfs, CLASSPATH)", False),
}

#: A URL: a scheme, then ``://``.
URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


class StorageError(PsflowError):
    """A location psflow cannot use (the message names it)."""


class UnknownSchemeError(StorageError, ValueError):
    """A URL whose scheme psflow does not read or write (names the URL and the schemes it knows)."""


class StoreError(StorageError, OSError):
    """A store refused or failed a call (:func:`client_errors`): one line naming the URL and what to set. An
    ``OSError``, as the same failure of a local disk is, so every caller that copes with one (a checkpoint save
    counted as failed, a reader's retry) copes with it."""


class BucketMissingError(StoreError, FileNotFoundError):
    """A write into a bucket that does not exist."""


class StoreDeniedError(StoreError, PermissionError):
    """No credentials, or credentials the store refuses."""


class StoreUnreachableError(StoreError, ConnectionError):
    """The store's endpoint did not answer, or answered that it throttles or fails calls (503 SlowDown, 500,
    429), after the client's own retries: an outage, which passes."""


#: Scheme -> (the settings of its credentials, of its endpoint): what a refused call's line tells to set.
SETTINGS = {
    "s3": ("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE", "AWS_ENDPOINT_URL"),
    "gs": ("GOOGLE_APPLICATION_CREDENTIALS (a service account's key file)", "STORAGE_EMULATOR_HOST for an emulator"),
}
SETTINGS["gcs"] = SETTINGS["gs"]


def scheme(path: str) -> str | None:
    """The URL scheme of ``path`` (lower case), ``None`` for a local path (``file://`` included)."""
    match = URL.match(path)
    if match is None:
        return None
    name = match.group(1).lower()
    return None if name == "file" else name


def check_location(path: str) -> None:
    """Refuses a location psflow cannot use, without touching it.

    Raises:
        UnknownSchemeError: a URL of a scheme psflow does not know.
        MissingExtraError: the scheme's client library is not installed (names the extra).
    """
    name = scheme(path)
    if name is None:
        return
    known = SCHEMES.get(name)
    if known is None:
        tested = ", ".join(f"{s}://" for s, (_, _, ok) in SCHEMES.items() if ok)
        raise UnknownSchemeError(f"{path}: unknown scheme {name!r}: psflow reads and writes local paths, {tested} "
                                 "and hdfs:// (untested)")
    import importlib.util

    for module in ("fsspec", known[0]):
        if importlib.util.find_spec(module) is None:
            raise _missing(path, module)


def _missing(path: str, module: str) -> Exception:
    from psflow.extras import MissingExtraError

    name = scheme(path) or ""
    how = SCHEMES[name][1]
    extra = "cloud" if "psflow[cloud]" in how else ""
    return MissingExtraError(f"{path}: {name}:// paths need {module}: {how}", module=module, extra=extra)


_FS_LOCK = threading.Lock()


def filesystem(path: str) -> tuple[Any, str]:
    """(the fsspec filesystem of URL ``path``, the path as that filesystem names it).

    Raises:
        UnknownSchemeError, MissingExtraError: see :func:`check_location`.
    """
    check_location(path)
    import fsspec.core

    with _FS_LOCK:  # fsspec builds one instance per (class, options) and caches it
        try:
            fs, inner = fsspec.core.url_to_fs(path, use_listings_cache=False)
        except ImportError as e:
            raise _missing(path, getattr(e, "name", None) or SCHEMES[scheme(path) or ""][0]) from e
    return fs, inner.rstrip("/") or inner


def url_prefix(url: str, inner: str) -> str:
    """What ``url`` has before the filesystem's own path ``inner`` (``s3://``, ``hdfs://nn:8020``)."""
    stripped = inner.rstrip("/")
    body = url.rstrip("/")
    return body[: len(body) - len(stripped)] if stripped and body.endswith(stripped) else f"{scheme(url)}://"


@contextlib.contextmanager
def client_errors(url: str, *, writing: bool = False) -> Iterator[None]:
    """Makes the errors of a call on URL ``url`` one line naming it and what to set.

    s3fs and gcsfs let some errors through without the URL (a missing bucket: ``The specified bucket does not
    exist``, or the emulator's own URL), or as no ``OSError`` at all: botocore's ``NoCredentialsError`` and
    ``EndpointConnectionError``, google-auth's errors; those reached the user as a traceback, and a save that
    met one was no failed save but the end of the chief. So did what gcsfs's retries give up on (``HttpError``:
    a 503, a 429, a 401 of credentials expired mid-run); s3fs's throttled call (SlowDown) was an ``OSError``
    without the URL, gcsfs's refused write (403) two lines naming the store's upload endpoint. The client's
    ``FileNotFoundError``, ``FileExistsError`` and other ``OSError`` are left as they are (callers take a missing
    file or a lock held by another from them).

    Args:
        writing: the call puts an object; a store has no directories, so its ``FileNotFoundError`` means the
            bucket is missing.

    Raises:
        BucketMissingError: a write into a bucket that does not exist (s3://, gs://).
        StoreDeniedError: no credentials, refused (expired) ones, or ones that may not read or write there.
        StoreUnreachableError: the endpoint did not answer, or throttles or fails calls (503, 429, 500).
        StoreError: another error of the client library that is no ``OSError``.
    """
    try:
        yield
    except StorageError:
        raise
    except FileNotFoundError as e:
        if writing and scheme(url) in SETTINGS:
            bucket = url.split("://", 1)[1].split("/", 1)[0]
            raise BucketMissingError(f"{url}: the bucket {bucket!r} does not exist: create it, or correct the URL "
                                     f"(or the store's endpoint, {SETTINGS[scheme(url) or ''][1]})") from e
        raise
    except Exception as e:
        kind = _client_error(e)
        if kind is None:
            raise
        credentials, endpoint = SETTINGS.get(scheme(url) or "", ("the store's credentials", "the store's endpoint"))
        if kind == "denied":
            raise StoreDeniedError(f"{url}: access denied ({_one_line(e)}): the credentials psflow's tasks find "
                                   f"({credentials}) may not {'write' if writing else 'read'} there") from e
        if kind == "credentials":
            raise StoreDeniedError(f"{url}: no credentials for {scheme(url)}:// ({_one_line(e)}): set {credentials}, "
                                   "in the environment of every psflow task") from e
        if kind == "refused":
            raise StoreDeniedError(f"{url}: the store refused the credentials ({_one_line(e)}): expired or "
                                   f"revoked: renew {credentials}, in the environment of every psflow task") from e
        if kind == "unreachable":
            raise StoreUnreachableError(f"{url}: the store did not answer ({_one_line(e)}): check the endpoint "
                                        f"({endpoint}) and the network") from e
        if kind == "unavailable":
            raise StoreUnreachableError(f"{url}: the store is unavailable ({_one_line(e)}) after the client's "
                                        "retries: it throttles or fails calls for now; a later call may go "
                                        "through") from e
        raise StoreError(f"{url}: {type(e).__name__}: {_one_line(e)}") from e


#: HTTP statuses of a store's call that pass (a timeout, throttling, the store failing), as gcsfs retries them.
PASSING_STATUSES = frozenset({408, 429, 500, 502, 503, 504})

#: (module, its error classes, what they say) of a client library's errors that are no ``OSError``, asked in order.
_LIBRARY_ERRORS = (
    ("botocore.exceptions", ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"),
     "credentials"),
    ("botocore.exceptions", ("ConnectionError", "HTTPClientError"), "unreachable"),
    ("botocore.exceptions", ("BotoCoreError",), "other"),
    ("google.auth.exceptions", ("GoogleAuthError",), "credentials"),
    ("aiohttp", ("ClientError",), "unreachable"),
)

#: The same of a client library's ``OSError`` whose builtin type says nothing of what it is.
_LIBRARY_OS_ERRORS = (
    ("aiohttp", ("ClientConnectionError",), "unreachable"),  # gcsfs: an endpoint that does not answer
    ("requests.exceptions", ("ProxyError",), "unavailable"),  # a 502
)


def _client_error(error: Exception) -> str | None:
    """What ``error`` says: ``denied`` (the credentials may not), ``credentials`` (none), ``refused`` (expired or
    revoked), ``unreachable``, ``unavailable`` (throttling, the store failing: each passes), ``other``; or None
    to let it through as it is (the builtin ``OSError`` of its kind, or none of the client library's)."""
    if isinstance(error, PermissionError):
        return "denied"
    if isinstance(error, OSError):
        return _os_error(error)
    gcsfs = sys.modules.get("gcsfs.retry")
    if gcsfs is not None and isinstance(error, gcsfs.HttpError):  # what gcsfs's retries gave up on
        code = getattr(error, "code", None)
        return "refused" if code == 401 else "denied" if code == 403 else (
            "unavailable" if code in PASSING_STATUSES else "other")
    return _library_error(error, _LIBRARY_ERRORS)


def _os_error(error: OSError) -> str | None:
    """What a client library's ``OSError`` says that its type does not: s3fs's throttled or failed call
    (SlowDown, 503: ``EBUSY``, no URL), gcsfs's refusal (403: ``Forbidden: ENDPOINT``, two lines) or a 502
    (requests' ``ProxyError``); aiohttp's connection errors (gcsfs: an endpoint that does not answer)."""
    if type(error) is OSError:
        if error.errno == errno.EBUSY:
            return "unavailable"
        if str(error).startswith("Forbidden: "):
            return "denied"
    return _library_error(error, _LIBRARY_OS_ERRORS)


def _library_error(error: BaseException, known: tuple[tuple[str, tuple[str, ...], str], ...]) -> str | None:
    """What the first row of ``known`` (module, classes, what they say) whose classes ``error`` is one of says,
    or None. Only a library already loaded is asked (one not loaded raised nothing): none is imported here."""
    for module, classes, kind in known:
        library = sys.modules.get(module)
        if library is not None and isinstance(error, tuple(getattr(library, name) for name in classes)):
            return kind
    return None


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


class StoreReader(io.RawIOBase):
    """An object of a store opened for reading (the client's file ``handle``), whose every read and seek makes
    the client's errors one line (:func:`client_errors`): a stream asks the store again at each block, long
    after the open, and a store gone meanwhile raised botocore's ``EndpointConnectionError`` (no ``OSError``)
    from a reader's ``read``."""

    def __init__(self, url: str, handle: Any) -> None:
        super().__init__()
        self._url, self._handle = url, handle

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        with client_errors(self._url):
            data: bytes = self._handle.read(-1 if size is None else size)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        memoryview(buffer).cast("B")[:len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        with client_errors(self._url):
            return int(self._handle.seek(offset, whence))

    def tell(self) -> int:
        return int(self._handle.tell())

    def close(self) -> None:
        if self.closed:
            return
        try:
            with client_errors(self._url):
                self._handle.close()
        finally:
            super().close()
