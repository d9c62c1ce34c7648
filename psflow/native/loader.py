"""How psflow loads one of its optional C extensions, or falls back to the extension's numpy twin.

psflow's per-byte and per-id loops exist twice, with the same results: in C, in an extension that
``pip install`` builds where a C compiler is available (``setup.py``), and in numpy beside their callers.
:func:`load_extension` is the one place that decides which runs:

* the extension, where it was built and imports;
* None, where it was not built, or where the environment variable ``PSFLOW_NATIVE=0`` is set when
  the caller's module is imported (to compare the two, or to rule the C code out): the caller then
  uses its numpy twin.

The extensions: ``psflow.native._ids`` (:mod:`psflow.native.ids`: a batch's distinct ids, the range and
order check of a request's ids), ``psflow.data._native`` (the input pipeline's parsing loops,
:mod:`psflow.data.native`), ``psflow.ps._kernels`` (the ps tasks' optimizer updates, row gathers,
dynamic-table index and sync merge), ``psflow.models._logistic`` (the logistic model's per-entry
products and gradient sums, :mod:`psflow.models.logistic`) and ``psflow.torch._lookup`` (a worker's embedding gathers and
gradient scatter-adds, :mod:`psflow.torch.lookup_rows`; its twins are torch ops).

``PSFLOW_REQUIRE_NATIVE=1`` makes the test suite fail instead of skipping the C side when an extension
is missing (``scripts/test.sh`` sets it wherever a C compiler and Python's headers exist); psflow
itself never reads it.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["ENV", "load_extension"]

#: Set to ``0`` to use the numpy loops even when the extensions are built.
ENV = "PSFLOW_NATIVE"


def load_extension(name: str) -> ModuleType | None:
    """Imports psflow's C extension ``name`` (e.g. ``"psflow.ps._kernels"``), or returns None
    when it was not built or ``PSFLOW_NATIVE=0`` is set: the caller then uses its numpy twin."""
    if os.environ.get(ENV, "1") == "0":
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
