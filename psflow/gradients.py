"""Gradient types: what a model hands the runtime to push to the ps tasks.

A leaf module (it imports only numpy), so that models, the client and the ps
side can all name these types without importing each other.

* :class:`DenseGradient` -- a gradient for a whole variable (same shape).
* :class:`SparseGradient` -- a gradient for some rows of a variable along
  axis 0 (embedding tables): ``values[k]`` belongs to row ``rows[k]``.
  Rows should be unique; a ps task sums duplicates before applying them (as
  TensorFlow's optimizers sum an ``IndexedSlices``' duplicate indices), but
  every duplicate costs bandwidth.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["DenseGradient", "SparseGradient", "Gradient", "Gradients"]


@dataclass(frozen=True)
class DenseGradient:
    """A gradient for the whole variable."""

    values: np.ndarray


@dataclass(frozen=True)
class SparseGradient:
    """A gradient for some rows: ``values[k]`` belongs to row ``rows[k]`` (rows unique)."""

    rows: np.ndarray
    values: np.ndarray


Gradient = DenseGradient | SparseGradient
#: Variable name -> its gradient (a variable with no gradient this step is left out).
Gradients = Mapping[str, Gradient]
