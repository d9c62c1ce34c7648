"""LabelSpec: which labels a model accepts, checked by the readers as records are read.

A model declares its labels (:attr:`psflow.models.Model.labels`); the run hands
them to the readers (``DatasetConfig.labels``), which check every record's
label as it is parsed, vectorized, once per read block. A record whose label
the spec refuses is a bad record (:class:`~psflow.data.api.BadRecordError`
naming the file and the record, and the label), under the run's bad-record
policy: the run stops there, or with ``skip_bad_records`` the record is skipped
and counted. NaN and infinite labels are refused by every spec.

LIBSVM labels are read as binary classes (any label ``> 0`` is 1.0, so
``+1/-1`` and ``1/0`` files read the same): with a binary spec the written
label must be one of -1, 0 and +1, so a file of ``1/2`` or ``0..9`` classes is
refused instead of read as all positives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["LabelSpec", "BINARY_LABELS", "FINITE_LABELS"]


@dataclass(frozen=True)
class LabelSpec:
    """The labels a model accepts: finite numbers in ``[low, high]``, whole numbers only with ``integer``.

    Attributes:
        low, high: the accepted range, bounds included (infinite: unbounded).
        integer: only whole numbers (class indices).

    Raises:
        ValueError: ``low > high`` or a NaN bound.
    """

    low: float = -math.inf
    high: float = math.inf
    integer: bool = False

    def __post_init__(self) -> None:
        if math.isnan(self.low) or math.isnan(self.high) or self.low > self.high:
            raise ValueError(f"LabelSpec: want low <= high, got [{self.low}, {self.high}]")

    @property
    def binary(self) -> bool:
        """Whether only 0 and 1 are accepted (a binary classifier)."""
        return self.integer and self.low == 0 and self.high == 1

    def rejects(self, labels: npt.NDArray[np.floating], *, libsvm: bool = False) -> npt.NDArray[np.bool_]:
        """Which of ``labels`` the spec refuses (NaN and infinities always), as a bool array.

        ``libsvm``: ``labels`` are LIBSVM labels as written, before they are read as binary classes; a
        binary spec then accepts -1, 0 and +1, any other spec is applied to the classes read (0.0, 1.0).
        """
        if libsvm and self.binary:
            bad: npt.NDArray[np.bool_] = (labels != 1) & (labels != 0) & (labels != -1)
            return bad
        if libsvm:
            labels = (labels > 0).astype(np.float32)
        if self.binary:  # the common case in one pass (NaN compares unequal to both)
            binary: npt.NDArray[np.bool_] = (labels != 0) & (labels != 1)
            return binary
        bad = ~np.isfinite(labels)
        if self.low > -math.inf:
            bad |= labels < self.low
        if self.high < math.inf:
            bad |= labels > self.high
        if self.integer:
            bad |= labels != np.floor(labels)
        return bad

    def describe(self, *, libsvm: bool = False) -> str:
        """What the spec accepts, in words: ``"0 or 1"``, ``"an integer in [0, 9]"``, ``"a finite number"``."""
        if self.binary:
            return "-1, 0 or +1 (a binary model; LIBSVM's -1 reads as 0)" if libsvm else "0 or 1 (a binary model)"
        if self.low == -math.inf and self.high == math.inf:
            return "a whole number" if self.integer else "a finite number"
        kind = "an integer" if self.integer else "a finite number"
        return f"{kind} in [{self.low:g}, {self.high:g}]"


#: A binary classifier's labels: 0 and 1 (the built-in models).
BINARY_LABELS = LabelSpec(0.0, 1.0, integer=True)
#: Any finite label (the default of :class:`psflow.models.Model`).
FINITE_LABELS = LabelSpec()
