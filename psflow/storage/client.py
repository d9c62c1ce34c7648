"""The client of an object store: which library serves a URL's scheme, its fsspec filesystem, and its errors.

:mod:`psflow.storage` (the operations every location supports) asks here for the filesystem of a URL; nothing
else in psflow imports fsspec or a store's client library.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from psflow.errors import PsflowError

__all__ = ["SCHEMES", "URL", "StorageError", "UnknownSchemeError", "scheme", "check_location", "filesystem",
           "url_prefix"]

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
