"""The JSON psflow writes: standard JSON only, never ``NaN`` or ``Infinity``.

Python's :mod:`json` writes ``NaN``, ``Infinity`` and ``-Infinity`` for
non-finite floats by default; those are not JSON (RFC 8259), and ``jq``,
JavaScript's ``JSON.parse``, Go and most other readers refuse the whole file.
Every file, status line and RPC header psflow writes as JSON goes through
:func:`dumps` or :func:`dump`, which serialize with ``allow_nan=False`` after
applying one of two policies to a non-finite float:

* ``nonfinite="null"`` (measurements: metrics.json, worker results,
  faults.json, the ``psflow train`` summary): it becomes ``null``, read as "no
  value" (an AUC of a one-class eval set, a loss not known yet);
* ``nonfinite="error"`` (settings: config.json, checkpoint manifests,
  exported model descriptions): :class:`ValueError` naming the file and the
  key path, because writing ``null`` for a setting would silently change it.

numpy scalars and arrays are written as the Python numbers and lists they
hold. A leaf module: it imports only the standard library and numpy.
"""

from __future__ import annotations

import json
import math
from typing import IO, Any, Literal

import numpy as np

__all__ = ["NonFinite", "finite", "dumps", "dump"]

#: What to do with a NaN or an infinity: write ``null``, or refuse (ValueError).
NonFinite = Literal["null", "error"]


def finite(value: Any, *, nonfinite: NonFinite = "null", what: str = "JSON value", path: str = "") -> Any:
    """``value`` with every non-finite float replaced by ``None`` (or refused), numpy values made Python ones.

    Walks dicts, lists and tuples (tuples become lists); leaves other values as they are. Pure:
    returns new containers, never changes ``value``.

    Args:
        value: what is to be written.
        nonfinite: ``"null"`` or ``"error"`` (see the module docstring).
        what: names the output in errors (a file, "metrics.json").
        path: key path of ``value`` inside the output, for errors.

    Raises:
        ValueError: ``nonfinite="error"`` and a float is NaN or infinite (names ``what``, the key path and the value).
    """
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        if nonfinite == "error":
            raise ValueError(f"{what}: {path or 'the value'} is {value!r}, which JSON cannot hold (no NaN or Infinity)")
        return None
    if isinstance(value, dict):
        return {k: finite(v, nonfinite=nonfinite, what=what, path=f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v, nonfinite=nonfinite, what=what, path=f"{path}[{i}]") for i, v in enumerate(value)]
    return value


def dumps(value: Any, *, nonfinite: NonFinite = "null", what: str = "JSON value", **kwargs: Any) -> str:
    """:func:`json.dumps` of :func:`finite` ``(value)`` with ``allow_nan=False``: standard JSON.

    ``kwargs`` go to :func:`json.dumps` (``indent``, ``sort_keys``, ``separators``...).

    Raises:
        ValueError: a non-finite float under ``nonfinite="error"`` (names ``what`` and the key path).
        TypeError: a value JSON has no form for (as :func:`json.dumps`).
    """
    return json.dumps(finite(value, nonfinite=nonfinite, what=what), allow_nan=False, **kwargs)


def dump(value: Any, fp: IO[str], *, nonfinite: NonFinite = "null", what: str = "JSON value", **kwargs: Any) -> None:
    """:func:`dumps` into an open text file. The text is made in full before the first write, so a
    refused value leaves the file untouched."""
    fp.write(dumps(value, nonfinite=nonfinite, what=what, **kwargs))
