"""The base of the ps's optimizers: what every update does around its formula.

:class:`Optimizer` takes an update to one variable, or one partition of it, held
in float32 numpy arrays on a ps task: it checks the arrays (unless the caller
already did), reads the learning rate (a number, or a schedule's value at the
update's global step), sums a sparse gradient's duplicate rows, gathers the
touched rows and scatters them back, or hands the whole update to a C kernel.
The subclasses in :mod:`psflow.ps.optimizers` supply TensorFlow's formulas
(``_update``, ``_update_rows``, ``_fused``); :func:`~psflow.ps.optimizers.make_optimizer`
picks one by name.

Sparse updates (:meth:`Optimizer.apply_sparse`): duplicate rows are summed
first, as TF deduplicates ``IndexedSlices``. Then only the given rows of var
and of the row-shaped slots are read or written, in O(k) time for k rows
(Adam, non-lazy as TF1's, is the exception: see :mod:`psflow.ps.optimizers`).
When the rows are already distinct and sorted (what clients send), nothing
is copied: one pass over the ids checks that.

Thread safety: none of these methods lock. Callers must hold a per-variable (or
per-partition) lock around every apply and around reads of var and slots that
must see a whole update. Optimizer objects hold only constants (and the newest
scheduled rate, replaced whole), so one optimizer can serve many variables.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from psflow.native.ids import scan_ids
from psflow.optim.schedules import ScheduleSpec
from psflow.optim.spec import Hyperparameters, OptimizerError, OptimizerSpec, resolve_hyperparameters

__all__ = ["FloatArray", "IndexArray", "Optimizer", "fusable"]

FloatArray = npt.NDArray[np.float32]
IndexArray = npt.NDArray[np.int64]


def _check_range(low: int, high: int, num_rows: int) -> None:
    """Raises ValueError unless the rows, whose least is ``low`` and greatest ``high``, lie in [0, num_rows)."""
    if low < 0 or high >= num_rows:
        raise ValueError(f"sparse update has row {low if low < 0 else high}; the variable has rows 0-{num_rows - 1}")


def _sum_duplicates(rows: IndexArray, values: FloatArray, num_rows: int) -> tuple[IndexArray, FloatArray]:
    """Returns rows without duplicates and their summed values; checks 0 <= rows < num_rows.

    When there are no duplicates, returns the inputs themselves, not copies.
    Duplicates are summed in an unspecified but deterministic order.
    """
    if rows.size == 0:
        return rows, values
    outside, increasing = scan_ids(rows, num_rows)
    if outside < 0 and increasing:
        # In range and strictly increasing (what clients send: sorted unique ids): no duplicates.
        # One O(n) pass instead of an O(n log n) sort.
        return rows, values
    # np.sort is several times faster than argsort and is enough to find
    # duplicates. argsort is needed only to sum them.
    sorted_rows = np.sort(rows)
    _check_range(int(sorted_rows[0]), int(sorted_rows[-1]), num_rows)
    is_first = np.empty(rows.shape, dtype=bool)
    is_first[0] = True
    np.not_equal(sorted_rows[1:], sorted_rows[:-1], out=is_first[1:])
    if is_first.all():
        return rows, values
    order = np.argsort(rows)
    starts = np.flatnonzero(is_first)
    return sorted_rows[starts], np.add.reduceat(values[order], starts, axis=0)


class Optimizer(ABC):
    """Applies one optimizer's updates to variables, in place, as TF would.

    Attributes:
        name: the registry name, one of :data:`OPTIMIZER_NAMES`.
        slot_names: TF's names of the slots shaped like var (per optimizer
            object: centered RMSProp has one more).
        state_names: names of 0-d state that is not row-shaped (Adam's beta powers).
        hyperparameters: every hyperparameter, defaults filled in.
        schedule: the learning rate's schedule, or None (a constant rate).

    The apply methods check shapes and dtypes before changing anything; they
    are not thread-safe (see the module docstring).
    """

    name: ClassVar[str]
    slot_names: tuple[str, ...] = ()
    state_names: ClassVar[tuple[str, ...]] = ()
    # True where TF's sparse update changes every row (non-lazy Adam).
    _sparse_touches_all_rows: ClassVar[bool] = False
    #: A scheduled rate below this is refused at the step it is reached (FTRL: see :meth:`learning_rate`).
    min_scheduled_rate: ClassVar[float] = 0.0

    @property
    def sparse_touches_all_rows(self) -> bool:
        """Whether a sparse update changes every row, not only the rows it names (non-lazy Adam)."""
        return self._sparse_touches_all_rows

    def __init__(self, hyperparameters: Hyperparameters | None = None) -> None:
        """Checks ``hyperparameters`` like :class:`OptimizerSpec` does.

        Raises:
            OptimizerError: a hyperparameter is unknown, missing or invalid.
        """
        self.hyperparameters: Hyperparameters = MappingProxyType(resolve_hyperparameters(self.name, hyperparameters or {}))
        lr = self.hyperparameters["learning_rate"]
        self.schedule: ScheduleSpec | None = lr if isinstance(lr, ScheduleSpec) else None
        self._lr = np.float32(0.0) if self.schedule is not None else self._f32("learning_rate")
        # (step, rate) of the newest step a schedule was evaluated at: the partitions of one step share it.
        # One tuple, replaced whole, so concurrent applies (other partitions' locks) read a consistent pair.
        self._scheduled: tuple[int, np.float32] = (-1, self._lr)

    def _number(self, key: str) -> float:
        value = self.hyperparameters[key]
        if isinstance(value, ScheduleSpec):  # pragma: no cover - only learning_rate may be one; read by learning_rate()
            raise OptimizerError(f"optimizer {self.name!r}: {key!r} is a schedule, not a number")
        return float(value)

    def _f32(self, key: str) -> np.float32:
        # TF turns Python hyperparameters into float32 tensors; so do we.
        return np.float32(self._number(key))

    def learning_rate(self, step: int | None = None) -> np.float32:
        """The learning rate of an update applied at global step ``step`` (read before its increment).

        A schedule's rate below :attr:`min_scheduled_rate` is refused (FTRL divides by its rate: a decay that
        falls below float32's smallest normal number, 1.2e-38, far out, would give NaN a few steps later; the
        check is made once per step, on its first update), and so is one that is not finite (a growing schedule,
        ``exponential_decay`` with ``decay_rate`` > 1, overflows float32 at some step).

        Raises:
            ValueError: the learning rate is a schedule and ``step`` is None or negative.
            OptimizerError: the schedule's rate at ``step`` is below :attr:`min_scheduled_rate` or not finite;
                nothing changed.
        """
        if self.schedule is None:
            return self._lr
        if step is None or step < 0:
            raise ValueError(f"{self.name}: the learning rate is a schedule ({self.schedule.name}); "
                             f"an update needs the global step it is applied at, got {step!r}")
        cached_step, rate = self._scheduled
        if cached_step != step:
            rate = self.schedule.value(step)
            if not np.isfinite(rate):  # a growing schedule overflowed float32: every variable it updates would too
                raise OptimizerError(
                    f"optimizer {self.name!r}: the learning rate of schedule {self.schedule.name!r} "
                    f"(--learning-rate-schedule) is {rate} at global_step {step}: not finite (the update would make "
                    "the variables infinite or NaN); end the run before that step (--max-steps) or choose a "
                    "schedule that stays finite")
            if rate < self.min_scheduled_rate:
                raise OptimizerError(
                    f"optimizer {self.name!r}: the learning rate of schedule {self.schedule.name!r} "
                    f"(--learning-rate-schedule) is {rate:.3g} at global_step {step}, below {self.min_scheduled_rate:.3g} "
                    f"({self.name} divides by its rate: NaN); end the run before that step (--max-steps) or "
                    "choose a schedule that stays above it")
            self._scheduled = (step, rate)
        return rate

    @property
    def spec(self) -> OptimizerSpec:
        """This optimizer as a spec, with every hyperparameter spelled out."""
        return OptimizerSpec(self.name, dict(self.hyperparameters))

    def _slot_initial_values(self) -> Mapping[str, float]:
        """The value each row-shaped slot starts at; 0 unless overridden."""
        return {}

    def _state_initial_values(self) -> Mapping[str, float]:
        """The value each 0-d state starts at."""
        return {}

    def create_slots(self, var: FloatArray) -> dict[str, FloatArray]:
        """Returns new optimizer state for ``var``: all of it, as float32 arrays.

        Each name in ``slot_names`` maps to an array shaped like ``var``, and
        each name in ``state_names`` to a 0-d array. ``var`` is not changed.

        Raises:
            ValueError: ``var`` is not float32.
        """
        _check_float32("var", var)
        initial = self._slot_initial_values()
        slots = {name: np.full(var.shape, initial.get(name, 0.0), dtype=np.float32) for name in self.slot_names}
        for name, value in self._state_initial_values().items():
            slots[name] = np.array(value, dtype=np.float32)
        return slots

    def apply_dense(self, var: FloatArray, slots: dict[str, FloatArray], grad: npt.ArrayLike, *,
                    checked: bool = False, step: int | None = None) -> None:
        """Applies one dense gradient to ``var`` and ``slots``, in place.

        ``checked``: the caller guarantees what the checks below would find (``var``
        and ``slots`` are this optimizer's state from :meth:`create_slots`, ``grad``
        a float32 array shaped like ``var``; a ps task's store, whose requests were
        validated on arrival): they are skipped (~3 us a call, 60 calls a step).
        ``step``: the global step the update is applied at, read before its
        increment; needed where the learning rate is a schedule (ignored otherwise).

        Raises:
            ValueError: ``var`` or a slot is not float32, a slot is missing or
                misshaped, ``grad`` is not shaped like ``var``, or a schedule has
                no step. Nothing is changed then.
        """
        lr = self.learning_rate(step)
        grad_f32: FloatArray
        if checked:
            grad_f32 = grad  # type: ignore[assignment]
        else:
            self._check_state(var, slots)
            grad_f32 = np.asarray(grad, dtype=np.float32)
            if grad_f32.shape != var.shape:
                raise ValueError(f"{self.name}: gradient has shape {grad_f32.shape}; var has {var.shape}")
        if var.ndim == 0:
            # numpy turns 0-d results into scalars, which cannot be updated in
            # place; work on 1-element views instead.
            var, grad_f32 = var.reshape(1), grad_f32.reshape(1)
            slots = {name: value.reshape(1) if name in self.slot_names else value for name, value in slots.items()}
        self._apply_dense(var, slots, grad_f32, lr)

    def apply_sparse(
        self, var: FloatArray, slots: dict[str, FloatArray], rows: npt.ArrayLike, values: npt.ArrayLike,
        *, distinct: bool = False, checked: bool = False, step: int | None = None,
    ) -> None:
        """Applies a gradient given for some rows of ``var`` (axis 0), in place.

        Args:
            var: the variable (or partition), at least 1-d.
            slots: its state, from :meth:`create_slots`.
            rows: int [k], local indices into ``var``'s axis 0; may repeat, and
                duplicates are summed first.
            values: [k, *var.shape[1:]], the gradient rows.
            distinct: the caller guarantees that ``rows`` has no duplicates (in
                any order): they are not looked for (an O(k log k) sort saved);
                the range is still checked. Duplicates given anyway are a
                caller's bug: each would be applied on its own.
            checked: the caller guarantees what the shape and dtype checks would
                find (``var`` and ``slots`` from :meth:`create_slots`, ``rows`` 1-d
                int64, ``values`` float32 of the right shape): they are skipped.
                Rows are still checked against the range and summed where repeated.
            step: the global step the update is applied at, read before its
                increment; needed where the learning rate is a schedule.

        Only the given rows of ``var`` and of its row-shaped slots are changed,
        except by Adam, which changes every row (see the module docstring).

        Raises:
            ValueError: bad dtypes or shapes, a missing slot, a row outside
                ``[0, var.shape[0])``, or a schedule without a step. Nothing is
                changed then.
        """
        lr = self.learning_rate(step)
        index: IndexArray
        grad: FloatArray
        if checked:
            index, grad = rows, values  # type: ignore[assignment]
        else:
            self._check_state(var, slots)
            index = np.asarray(rows)
            if index.ndim != 1 or index.dtype.kind not in "iu":
                raise ValueError(
                    f"{self.name}: rows must be a 1-d integer array, got dtype {index.dtype} shape {index.shape}"
                )
            grad = np.asarray(values, dtype=np.float32)
            if var.ndim == 0 or grad.shape != index.shape + var.shape[1:]:
                raise ValueError(
                    f"{self.name}: sparse values have shape {grad.shape} for {index.size} rows; var has {var.shape}"
                )
        if distinct:
            unique_rows, summed = index.astype(np.int64, copy=False), grad
            if unique_rows.size:
                _check_range(int(unique_rows.min()), int(unique_rows.max()), var.shape[0])
        else:
            unique_rows, summed = _sum_duplicates(index.astype(np.int64, copy=False), grad, var.shape[0])
        if unique_rows.size or self._sparse_touches_all_rows:
            self._apply_sparse(var, slots, unique_rows, summed, lr)

    def _check_state(self, var: FloatArray, slots: Mapping[str, FloatArray]) -> None:
        _check_float32("var", var)
        for name in self.slot_names + self.state_names:
            slot = slots.get(name)
            if slot is None:
                raise ValueError(f"{self.name}: slot {name!r} is missing; slots given: {sorted(slots)}")
            _check_float32(f"slot {name!r}", slot)
            want = var.shape if name in self.slot_names else ()
            if slot.shape != want:
                raise ValueError(f"{self.name}: slot {name!r} has shape {slot.shape}; expected {want}")

    def _apply_dense(self, var: FloatArray, slots: dict[str, FloatArray], grad: FloatArray, lr: np.float32) -> None:
        if not self._fused(var, slots, grad, None, lr):
            self._update(var, slots, grad, lr)

    def _apply_sparse(self, var: FloatArray, slots: dict[str, FloatArray], rows: IndexArray, grad: FloatArray,
                      lr: np.float32) -> None:
        if self._fused(var, slots, grad, rows, lr):
            return
        # Gather the k rows, update the copies, scatter them back: O(k) work and memory.
        if var.ndim == 2 and var.shape[1] == 1 and _all_contiguous(var, *(slots[n] for n in self.slot_names)):
            # [n, 1] tables (one weight per row): index 1-d views, ~30 % cheaper
            # gathers and scatters than [k, 1] fancy indexing; same values.
            var = var.reshape(-1)
            slots = {**slots, **{name: slots[name].reshape(-1) for name in self.slot_names}}
            grad = grad.reshape(-1)
        var_rows = var[rows]
        slot_rows = {name: slots[name][rows] for name in self.slot_names}
        self._update_rows(var_rows, slot_rows, grad, lr)
        var[rows] = var_rows
        for name, values in slot_rows.items():
            slots[name][rows] = values

    @abstractmethod
    def _update(self, var: FloatArray, slots: Mapping[str, FloatArray], grad: FloatArray, lr: np.float32) -> None:
        """The elementwise update of TF's kernel, in place on same-shaped arrays."""

    def _update_rows(self, var: FloatArray, slots: Mapping[str, FloatArray], grad: FloatArray, lr: np.float32) -> None:
        """The elementwise update of TF's sparse kernel on gathered rows; :meth:`_update` unless it differs."""
        self._update(var, slots, grad, lr)

    def _fused(self, var: FloatArray, slots: Mapping[str, FloatArray], grad: FloatArray, rows: IndexArray | None,
               lr: np.float32) -> bool:
        """Applies the update with the C kernel, all of ``var`` (``rows`` None) or the given
        distinct rows, and returns True; returns False (nothing changed) where there is none."""
        return False


def _all_contiguous(*arrays: FloatArray) -> bool:
    """True if every array is C-contiguous (so ``reshape(-1)`` is a view, and writes to it land)."""
    return all(a.flags.c_contiguous for a in arrays)


def fusable(rows: IndexArray | None, *arrays: FloatArray) -> bool:
    """True if the C kernel can take these arrays as they are (it reads and writes C-contiguous buffers)."""
    return _all_contiguous(*arrays) and (rows is None or rows.flags.c_contiguous)


def _check_float32(what: str, array: object) -> None:
    if not isinstance(array, np.ndarray) or array.dtype != np.float32:
        kind = array.dtype if isinstance(array, np.ndarray) else type(array).__name__
        raise ValueError(f"{what} must be a float32 numpy array, got {kind}")
