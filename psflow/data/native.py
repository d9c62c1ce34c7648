"""Which implementation runs the input pipeline's per-byte loops: C or numpy.

A handful of loops dominate reading TFRecord: walking the record headers, the
data CRC32C of every record, walking each Example's feature map, matching the
map's keys to the schema's, laying the wanted entries out by key and record,
decoding packed varints (the ids), gathering packed floats and splitting
string lists into items; reading Criteo TSV is one loop over each line
(fields, label, integers, hashed ids).  Each exists twice, with the same results:

* in C, in the extension ``psflow.data._native`` (``psflow/data/_native.c``),
  built by ``pip install`` when a C compiler is available; its loops run with
  the GIL released, so a prefetch thread's parsing overlaps the training
  step's Python code;
* in numpy, next to their callers (:mod:`~psflow.data.tfrecord`,
  :mod:`~psflow.data.example_wire`, :mod:`~psflow.data.criteo`): used when the extension was not built, or
  when the environment variable ``PSFLOW_NATIVE=0`` is set at import (to
  compare the two, or to rule the C code out; :mod:`psflow.native.loader`
  decides, for every extension of psflow).

The tests compare both on the same random and malformed input.
``PSFLOW_REQUIRE_NATIVE=1`` makes the test suite fail instead of skipping the
C side when the extension is missing (``scripts/test.sh`` sets it wherever a
C compiler and Python's headers exist).
"""

from __future__ import annotations

from types import ModuleType

from psflow.native.loader import load_extension

__all__ = ["NATIVE", "implementation"]

#: The extension module, or None when the numpy loops are in use.
NATIVE: ModuleType | None = load_extension("psflow.data._native")


def implementation() -> str:
    """``"c"`` or ``"numpy"``: which loops this process uses (for logs and benchmark reports)."""
    return "numpy" if NATIVE is None else "c"
