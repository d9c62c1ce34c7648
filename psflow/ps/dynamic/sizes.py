"""What a dynamic table's rows cost against ``capacity_bytes``: one row's bytes, and a table's fixed overhead.

Pure functions of a :class:`~psflow.ps.dynamic.spec.DynamicTableSpec` (they build no table), so a launcher can
check ``capacity_bytes`` before any ps task starts; :class:`~psflow.ps.dynamic.table.DynamicTable` sizes its row
limit by them.
"""

from __future__ import annotations

from psflow.ps.dynamic.id_index import INDEX_BYTES_PER_ROW
from psflow.ps.dynamic.spec import DynamicTableSpec
from psflow.ps.optimizers import make_optimizer

__all__ = ["FIXED_OVERHEAD_BYTES", "row_bytes"]

#: Python objects of one table (the object, its dicts, lock, generators): a generous upper bound.
FIXED_OVERHEAD_BYTES = 64 * 1024
# Per row besides values and slots: id, last step, frequency, free-list entry (int64 each), live flag.
_ROW_META_BYTES = 33


def row_bytes(spec: DynamicTableSpec) -> int:
    """Bytes one row of a table of ``spec`` takes against ``capacity_bytes``: values, optimizer slots, per-row
    metadata and its index entry. Pure (builds no table), so a launcher can check ``capacity_bytes`` before any
    ps task starts.

    Raises:
        OptimizerError: ``spec.optimizer`` names no optimizer.
    """
    slots = len(make_optimizer(spec.optimizer).slot_names) if spec.optimizer is not None else 0
    return 4 * spec.dim * (1 + slots) + _ROW_META_BYTES + INDEX_BYTES_PER_ROW
