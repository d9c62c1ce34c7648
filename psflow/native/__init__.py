"""psflow.native: how psflow's optional C extensions are loaded, and the id loops every layer shares.

A leaf: it imports nothing of psflow, so the input pipeline, the models, placement and the ps tasks all
use it without importing one another (a ps task never loads the input pipeline's extension).

Files:

* ``loader.py``: :func:`load_extension` (an extension, or None: use its numpy twin) and
  :data:`ENV` (``PSFLOW_NATIVE``: ``0`` turns every extension off at import).
* ``ids.py``: :func:`unique_inverse` (``np.unique(ids, return_inverse=True)`` in O(n)) and
  :func:`scan_ids` (a request's ids: the first one out of range, and whether they are sorted).
* ``_ids.c``: the C loops of ``ids.py`` (``psflow.native._ids``, typed in ``_ids.pyi``).
* ``buffers.h``: the buffer helpers (take an array's buffer, check its item type, release it) that
  ``_kernels.c``, ``_lookup.c`` and ``_logistic.c`` include.

The other extensions stay beside their one user: ``psflow/data/_native.c`` (parsing) and
``psflow/ps/_kernels.c`` (optimizer updates, row gathers, dynamic-table index, sync merge),
``psflow/torch/_lookup.c`` (a worker's embedding gathers and their gradients' scatter-adds),
``psflow/models/_logistic.c`` (the logistic model's per-entry products and gradient sums).

Guarantees: every C loop has a numpy twin giving the same results, used where the extension was not
built or ``PSFLOW_NATIVE=0``; the tests compare the two (and fail instead of skipping the C side under
``PSFLOW_REQUIRE_NATIVE=1``, which ``scripts/test.sh`` sets wherever a C compiler is present).
A C loop checks its arguments before it reads or writes an item.
"""

from psflow.native.ids import scan_ids, unique_inverse
from psflow.native.loader import ENV, load_extension

__all__ = ["ENV", "load_extension", "scan_ids", "unique_inverse"]
