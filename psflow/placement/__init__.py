"""psflow.placement: which ps task holds each variable, and each row of it.

Files:

* ``api.py``: :class:`VariableDef`, :class:`VariableLike`, the
  :data:`PlacementStrategy` and :data:`Partitioner` types, :data:`DTYPE_SIZES`,
  and the errors :class:`PlacementError`, :class:`LayoutMismatchError`.
* ``assignment.py``: :class:`Partition`, :class:`VariablePlacement` (with
  :meth:`~VariablePlacement.route` for lookups), :class:`RoutedRows`,
  :func:`split_rows`, :func:`placements_to_json`, :func:`placements_from_json`.
* ``hashing.py``: :func:`~psflow.placement.hashing.owner_of` (the ps task that owns
  each id of a dynamic table: splitmix64 mod the number of ps tasks), the
  splitmix64 mix and the id check; below the ps, which imports it.
* ``layout.py``: :func:`layout_mismatch`, :func:`check_layout`.
* ``strategies.py``: :class:`RoundRobinStrategy`,
  :class:`GreedyLoadBalancingStrategy`, :func:`byte_size_load_fn`.
* ``partitioners.py``: :func:`fixed_size_partitioner`,
  :func:`min_max_variable_partitioner`,
  :func:`variable_axis_size_partitioner` (TensorFlow's arithmetic).
* ``device_setter.py``: :func:`replica_device_setter`, :class:`DeviceSetter`.
* ``variables.py``: :class:`VariableSet`, TensorFlow-style declaration.

Guarantees:

* **Placement is a pure function** of the ordered variable definitions, the
  partitioners, explicit devices, the strategy and the number of ps tasks.
  Nothing random, no clock, no network: every client running the same model
  code with a fresh setter computes the same layout, and
  :meth:`VariableSet.to_json` gives byte-identical text.
* **Disagreement is detected, not trained through.** :func:`layout_mismatch`
  compares a client's layout with the one registered first and names the
  first differing variable and how (``variable 'w': shape (1024, 1) here,
  (2048, 1) registered by another client``); the ps refuses the client with
  :class:`LayoutMismatchError`.
* Partitioned variables split along axis 0 into contiguous row ranges as
  TensorFlow splits them (first ``rows % n`` partitions one row longer),
  stored as ``name/part_i``; each partition is placed like a variable, so
  round-robin spreads partitions over ps tasks.
* :meth:`VariablePlacement.route` sends each looked-up id to exactly the
  partition holding it, and only touched partitions appear in its result.

Non-guarantees: strategies and setters are not thread-safe; declaring the
same variables in a different order may give a different layout (which
:func:`layout_mismatch` then reports).
"""

from psflow.placement.api import (
    DTYPE_SIZES,
    LayoutMismatchError,
    Partitioner,
    PlacementError,
    PlacementStrategy,
    VariableDef,
    VariableLike,
)
from psflow.placement.assignment import (
    Partition,
    RoutedRows,
    VariablePlacement,
    placements_from_json,
    placements_to_json,
    split_rows,
)
from psflow.placement.device_setter import DeviceSetter, replica_device_setter
from psflow.placement.layout import check_layout, layout_mismatch
from psflow.placement.partitioners import (
    fixed_size_partitioner,
    min_max_variable_partitioner,
    variable_axis_size_partitioner,
)
from psflow.placement.strategies import (
    GreedyLoadBalancingStrategy,
    RoundRobinStrategy,
    byte_size_load_fn,
)
from psflow.placement.variables import VariableSet

__all__ = [
    "DTYPE_SIZES",
    "DeviceSetter",
    "GreedyLoadBalancingStrategy",
    "LayoutMismatchError",
    "Partition",
    "Partitioner",
    "PlacementError",
    "PlacementStrategy",
    "RoundRobinStrategy",
    "RoutedRows",
    "VariableDef",
    "VariableLike",
    "VariablePlacement",
    "VariableSet",
    "byte_size_load_fn",
    "check_layout",
    "fixed_size_partitioner",
    "layout_mismatch",
    "min_max_variable_partitioner",
    "placements_from_json",
    "placements_to_json",
    "replica_device_setter",
    "split_rows",
    "variable_axis_size_partitioner",
]
