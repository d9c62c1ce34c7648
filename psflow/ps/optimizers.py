"""Server-side optimizers that reproduce TensorFlow's ``tf.compat.v1.train`` updates.

An optimizer updates one variable, or one partition of a variable, held in
float32 numpy arrays on a ps task. All optimizer state for that variable lives
in the ``slots`` dict that :meth:`Optimizer.create_slots` returns, so a
checkpoint can save and restore it. Every formula below is what TensorFlow 2.21
computes (the ``ApplyX``/``SparseApplyX`` kernels, or the v1 Python optimizer
where it does the work itself): float32 throughout, in the same order of
operations. ``tests/unit/ps/test_optimizers.py`` checks var and every slot after
every step against values that TensorFlow produced, to 1e-6 relative (see
"Rounding" below for the last bits).

Notation: ``g`` is the gradient (for a sparse update, its row values after
duplicates are summed) and ``lr`` the learning rate. Everything is elementwise.

Every optimizer's ``learning_rate`` may be a schedule instead of a number (a
:class:`~psflow.optim.schedules.ScheduleSpec`, or its JSON object
``{"schedule": NAME, ...}``): ``lr`` is then the schedule's value at the global
step the update is applied at, read before the step's increment (TF's order;
see :mod:`psflow.optim.schedules`). The apply methods take that step.

``sgd`` (GradientDescentOptimizer; no slots)::

    var -= lr * g

``momentum`` (MomentumOptimizer; slot ``"momentum"``, starts at 0)::

    momentum = momentum * m + g                  # m: the momentum hyperparameter
    var -= lr * momentum                         # use_nesterov=False
    var -= g * lr + momentum * m * lr            # use_nesterov=True

``adagrad`` (AdagradOptimizer; slot ``"accumulator"``, starts at
initial_accumulator_value)::

    accumulator += g * g
    var -= lr * g / sqrt(accumulator)

``adam`` (AdamOptimizer; slots ``"m"`` and ``"v"``, start at 0, plus the 0-d
arrays ``"beta1_power"`` and ``"beta2_power"``, which start at beta1 and beta2)::

    lr_t = lr * sqrt(1 - beta2_power) / (1 - beta1_power)
    dense:   m += (g - m) * (1 - beta1)
             v += (g * g - v) * (1 - beta2)
    sparse:  m = m * beta1;  m[rows] += g * (1 - beta1)
             v = v * beta2;  v[rows] += (g * g) * (1 - beta2)
    var -= lr_t * m / (sqrt(v) + epsilon)        # every row, sparse included
    beta1_power *= beta1;  beta2_power *= beta2

``ftrl`` (FtrlOptimizer, FTRL-Proximal; slots ``"accum"``, which starts at
initial_accumulator_value, and ``"linear"``, which starts at 0)::

    g_s = g + 2 * l2_shrinkage * var             # g_s = g when l2_shrinkage == 0
    new_accum = accum + g * g                    # the raw g, not g_s
    p(x) = sqrt(x) if learning_rate_power == -0.5 else x ** -learning_rate_power
    linear += g_s - (p(new_accum) - p(accum)) / lr * var
    quadratic = p(new_accum) / lr + 2 * l2
    var = (clip(linear, -l1, l1) - linear) / quadratic   # 0 where |linear| <= l1
    accum = new_accum

Here l1, l2 and l2_shrinkage are the ``*_regularization_strength``
hyperparameters. TF's v1 ``beta`` argument is not supported.

``rmsprop`` (TF1's RMSPropOptimizer; slots ``"rms"``, which starts at 1.0 as in
TF1 (TF2's Keras RMSprop starts it at 0), ``"momentum"``, which starts at 0, and,
when centered, ``"mg"``, which starts at 0). TF's dense and sparse kernels
write the same update in two ways, which round differently; psflow follows
each::

    dense (ApplyRMSProp):   rms += (g * g - rms) * (1 - decay)
                            mg += (g - mg) * (1 - decay)                    # centered only
                            momentum = momentum * m + (g * lr) / sqrt(d)
    sparse (SparseApply…):  rms = rms * decay + (g * g) * (1 - decay)
                            mg = mg * decay + g * (1 - decay)               # centered only
                            momentum = momentum * m + ((1 / sqrt(d)) * lr) * g
    var -= momentum

    d = rms + epsilon                       (centered: d = (rms - mg * mg) + epsilon)

Here m is the momentum hyperparameter (0.0: no momentum; the slot is kept
anyway, as in TF).

Hyperparameters use TF's argument names and defaults, and are checked when a
spec is made: the table and the ranges are in :mod:`psflow.optim.spec`.

Sparse updates (:meth:`Optimizer.apply_sparse`): duplicate rows are summed
first, as TF deduplicates ``IndexedSlices``. Then only the given rows of var
and of the row-shaped slots are read or written, in O(k) time for k rows. The
exception is Adam, which follows TF1's non-lazy ``AdamOptimizer``: m and v
decay on every row and every row of var moves, even for an update with no
rows. This is O(rows).

Differences from TF: TF keeps one ``beta1_power``/``beta2_power`` pair for all
variables of an optimizer and advances it once per ``apply_gradients``. Here
each variable, and each partition, has its own pair, which advances on each
apply to that variable or partition. The two agree when every partition of
every Adam variable gets one apply (possibly with no rows) per step.

Rounding: where TF's scalar code and its vectorized CPU code differ, psflow
follows the scalar code: ``1 / sqrt`` for Adagrad's and sparse RMSProp's rsqrt and
powf for FTRL with learning_rate_power != -0.5. On the golden data the sparse results match TF bit
for bit. The dense results (vectorized in TF) differ in the last bits. For
Adagrad that is under 1e-8 absolute. For FTRL with power -0.7 it is up to
1e-6 absolute, because the update subtracts two nearly equal powers.

C kernels: Adagrad, FTRL (learning_rate_power -0.5) and RMSProp run as one fused pass in
the extension ``psflow.ps._kernels`` where it was built (and ``PSFLOW_NATIVE`` is
not ``0``), with the GIL released for large updates only (see the extension's
header: small ones keep it, so the ps's request threads do not queue behind
each other). They do the numpy code's float32 operations
in the same order, so the results are the same bit for bit; the tests compare
the two.

Thread safety: none of these methods lock. Callers must hold a per-variable (or
per-partition) lock around every apply and around reads of var and slots that
must see a whole update. Optimizer objects hold only constants, so one
optimizer can serve many variables.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from psflow.native.ids import scan_ids
from psflow.native.loader import load_extension
from psflow.optim.schedules import ScheduleSpec
from psflow.optim.spec import (
    Hyperparameters,
    OptimizerError,
    OptimizerSpec,
    check_optimizer_name,
    resolve_hyperparameters,
)

__all__ = [
    "AdagradOptimizer",
    "AdamOptimizer",
    "FtrlOptimizer",
    "MomentumOptimizer",
    "Optimizer",
    "RmspropOptimizer",
    "SgdOptimizer",
    "make_optimizer",
]

#: The fused updates in C, or None: the numpy code below is then used (see "C kernels").
_KERNELS = load_extension("psflow.ps._kernels")

FloatArray = npt.NDArray[np.float32]
IndexArray = npt.NDArray[np.int64]


# Adam's final var update goes through scratch buffers of at most this many
# elements (256 KiB each in float32). This keeps memory use bounded for a 2^20-row
# variable, and chunks this size stay in cache.
_CHUNK_ELEMENTS = 1 << 16


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

        Raises:
            ValueError: the learning rate is a schedule and ``step`` is None or negative.
        """
        if self.schedule is None:
            return self._lr
        if step is None or step < 0:
            raise ValueError(f"{self.name}: the learning rate is a schedule ({self.schedule.name}); "
                             f"an update needs the global step it is applied at, got {step!r}")
        cached_step, rate = self._scheduled
        if cached_step != step:
            rate = self.schedule.value(step)
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


def _fusable(rows: IndexArray | None, *arrays: FloatArray) -> bool:
    """True if the C kernel can take these arrays as they are (it reads and writes C-contiguous buffers)."""
    return _all_contiguous(*arrays) and (rows is None or rows.flags.c_contiguous)


def _check_float32(what: str, array: object) -> None:
    if not isinstance(array, np.ndarray) or array.dtype != np.float32:
        kind = array.dtype if isinstance(array, np.ndarray) else type(array).__name__
        raise ValueError(f"{what} must be a float32 numpy array, got {kind}")


class SgdOptimizer(Optimizer):
    """TF's GradientDescentOptimizer: ``var -= lr * g``."""

    name = "sgd"

    def _update(self, var: FloatArray, slots: Mapping[str, FloatArray], grad: FloatArray, lr: np.float32) -> None:
        var -= grad * lr


class MomentumOptimizer(Optimizer):
    """TF's MomentumOptimizer (ApplyMomentum kernel), optionally Nesterov."""

    name = "momentum"
    slot_names = ("momentum",)

    def __init__(self, hyperparameters: Hyperparameters | None = None) -> None:
        super().__init__(hyperparameters)
        self._momentum = self._f32("momentum")
        self._nesterov = bool(self.hyperparameters["use_nesterov"])

    def _update(self, var: FloatArray, slots: Mapping[str, FloatArray], grad: FloatArray, lr: np.float32) -> None:
        accum = slots["momentum"]
        accum *= self._momentum
        accum += grad
        if self._nesterov:
            step = accum * self._momentum
            step *= lr
            step += grad * lr
        else:
            step = accum * lr
        var -= step


class AdagradOptimizer(Optimizer):
    """TF's AdagradOptimizer (ApplyAdagrad kernel)."""

    name = "adagrad"
    slot_names = ("accumulator",)

    def _slot_initial_values(self) -> Mapping[str, float]:
        return {"accumulator": self._number("initial_accumulator_value")}

    def _fused(self, var: FloatArray, slots: Mapping[str, FloatArray], grad: FloatArray, rows: IndexArray | None,
               lr: np.float32) -> bool:
        accum = slots["accumulator"]
        if _KERNELS is None or not _fusable(rows, var, accum, grad):
            return False
        _KERNELS.adagrad(var, accum, grad, rows, var.shape[0], lr)
        return True

    def _update(self, var: FloatArray, slots: Mapping[str, FloatArray], grad: FloatArray, lr: np.float32) -> None:
        accum = slots["accumulator"]
        scratch = np.multiply(grad, grad)
        accum += scratch
        # TF computes grad * lr * rsqrt(accum), and its scalar rsqrt is 1 / sqrt.
        # This order matches TF's sparse kernel bit for bit on the golden data.
        np.sqrt(accum, out=scratch)
        np.divide(np.float32(1.0), scratch, out=scratch)
        scratch *= grad * lr
        var -= scratch


class AdamOptimizer(Optimizer):
    """TF1's AdamOptimizer, including its non-lazy sparse update."""

    name = "adam"
    slot_names = ("m", "v")
    state_names = ("beta1_power", "beta2_power")
    _sparse_touches_all_rows = True

    def __init__(self, hyperparameters: Hyperparameters | None = None) -> None:
        super().__init__(hyperparameters)
        self._beta1 = self._f32("beta1")
        self._beta2 = self._f32("beta2")
        self._epsilon = self._f32("epsilon")
        one = np.float32(1.0)
        self._one_minus_beta1 = one - self._beta1
        self._one_minus_beta2 = one - self._beta2

    def _state_initial_values(self) -> Mapping[str, float]:
        return {"beta1_power": float(self._beta1), "beta2_power": float(self._beta2)}

    def _update(self, var: FloatArray, slots: Mapping[str, FloatArray], grad: FloatArray, lr: np.float32) -> None:
        m, v = slots["m"], slots["v"]
        delta = grad - m
        delta *= self._one_minus_beta1
        m += delta
        np.multiply(grad, grad, out=delta)
        delta -= v
        delta *= self._one_minus_beta2
        v += delta
        self._finish(var, slots, lr)

    def _apply_sparse(self, var: FloatArray, slots: dict[str, FloatArray], rows: IndexArray, grad: FloatArray,
                      lr: np.float32) -> None:
        m, v = slots["m"], slots["v"]
        m *= self._beta1
        m[rows] += grad * self._one_minus_beta1
        v *= self._beta2
        v[rows] += (grad * grad) * self._one_minus_beta2
        self._finish(var, slots, lr)

    def _finish(self, var: FloatArray, slots: Mapping[str, FloatArray], lr: np.float32) -> None:
        """``var -= lr_t * m / (sqrt(v) + epsilon)`` over all rows, then advances the beta powers."""
        one = np.float32(1.0)
        beta1_power, beta2_power = slots["beta1_power"], slots["beta2_power"]
        lr_t = lr * np.sqrt(one - beta2_power[()]) / (one - beta1_power[()])
        m, v = slots["m"], slots["v"]
        if var.size <= _CHUNK_ELEMENTS:
            _adam_step(var, m, v, lr_t, self._epsilon, None, None)
        else:
            rows_per_chunk = max(1, _CHUNK_ELEMENTS // (var.size // var.shape[0]))
            denominator = np.empty((rows_per_chunk,) + var.shape[1:], dtype=np.float32)
            step = np.empty_like(denominator)
            for start in range(0, var.shape[0], rows_per_chunk):
                chunk = slice(start, start + rows_per_chunk)
                n = min(rows_per_chunk, var.shape[0] - start)
                _adam_step(var[chunk], m[chunk], v[chunk], lr_t, self._epsilon, denominator[:n], step[:n])
        np.multiply(beta1_power, self._beta1, out=beta1_power)
        np.multiply(beta2_power, self._beta2, out=beta2_power)


def _adam_step(
    var: FloatArray,
    m: FloatArray,
    v: FloatArray,
    lr_t: np.float32,
    epsilon: np.float32,
    denominator: FloatArray | None,
    step: FloatArray | None,
) -> None:
    """``var -= (m * lr_t) / (sqrt(v) + epsilon)``, using the scratch buffers when given."""
    denominator = np.sqrt(v, out=denominator)
    denominator += epsilon
    step = np.multiply(m, lr_t, out=step)
    step /= denominator
    var -= step


class FtrlOptimizer(Optimizer):
    """TF's FtrlOptimizer (ApplyFtrl, or ApplyFtrlV2 when l2_shrinkage > 0)."""

    name = "ftrl"
    slot_names = ("accum", "linear")

    def __init__(self, hyperparameters: Hyperparameters | None = None) -> None:
        super().__init__(hyperparameters)
        self._power = self._f32("learning_rate_power")
        self._l1 = self._f32("l1_regularization_strength")
        two = np.float32(2.0)
        self._two_l2 = two * self._f32("l2_regularization_strength")
        self._two_shrinkage = two * self._f32("l2_shrinkage_regularization_strength")

    def _slot_initial_values(self) -> Mapping[str, float]:
        return {"accum": self._number("initial_accumulator_value")}

    def _powered(self, accum: FloatArray) -> FloatArray:
        """``accum ** -learning_rate_power`` in float32, as TF's scalar code computes it.

        For power -0.5 TF takes sqrt, which is exact. Otherwise TF's scalar
        code calls the C library's powf, which is accurate to within 1 ulp.
        numpy's float32 power can land on a different neighbouring float, and
        FTRL subtracts two nearly equal powers, which turns that 1 ulp into
        ~1e-5 relative error in ``linear``. So the power is taken in float64
        and rounded once to float32. On the golden values this matches TF's
        sparse kernel bit for bit. TF's dense kernel uses Eigen's vectorized
        pow, which can still differ by 1 ulp.
        """
        if self._power == np.float32(-0.5):
            return np.sqrt(accum)
        return np.power(accum, -np.float64(self._power)).astype(np.float32)

    def _fused(self, var: FloatArray, slots: Mapping[str, FloatArray], grad: FloatArray, rows: IndexArray | None,
               lr: np.float32) -> bool:
        accum, linear = slots["accum"], slots["linear"]
        if _KERNELS is None or self._power != np.float32(-0.5) or not _fusable(rows, var, accum, linear, grad):
            return False
        _KERNELS.ftrl(var, accum, linear, grad, rows, var.shape[0], lr, self._l1, self._two_l2,
                      self._two_shrinkage)
        return True

    def _update(self, var: FloatArray, slots: Mapping[str, FloatArray], grad: FloatArray, lr: np.float32) -> None:
        accum, linear = slots["accum"], slots["linear"]
        new_accum = grad * grad
        new_accum += accum
        powered_new = self._powered(new_accum)
        sigma_var = self._powered(accum)
        np.subtract(powered_new, sigma_var, out=sigma_var)
        sigma_var /= lr
        sigma_var *= var
        # TF adds (g_s - sigma * var) to linear as one term; keep that rounding.
        if self._two_shrinkage > 0:
            np.subtract(var * self._two_shrinkage + grad, sigma_var, out=sigma_var)
        else:
            np.subtract(grad, sigma_var, out=sigma_var)
        linear += sigma_var
        quadratic = powered_new
        quadratic /= lr
        quadratic += self._two_l2
        np.clip(linear, -self._l1, self._l1, out=var)
        var -= linear
        var /= quadratic
        accum[...] = new_accum


class RmspropOptimizer(Optimizer):
    """TF1's RMSPropOptimizer (ApplyRMSProp / ApplyCenteredRMSProp, and their sparse kernels).

    The dense and the sparse update differ in their order of operations, as
    TF's kernels do (see the module docstring): :meth:`_update` is the dense
    one, :meth:`_update_rows` the sparse one.
    """

    name = "rmsprop"

    def __init__(self, hyperparameters: Hyperparameters | None = None) -> None:
        super().__init__(hyperparameters)
        self._decay = self._f32("decay")
        self._one_minus_decay = np.float32(1.0) - self._decay
        self._momentum = self._f32("momentum")
        self._epsilon = self._f32("epsilon")
        self._centered = bool(self.hyperparameters["centered"])
        self.slot_names = ("rms", "momentum", "mg") if self._centered else ("rms", "momentum")

    def _slot_initial_values(self) -> Mapping[str, float]:
        return {"rms": 1.0}  # TF1's RMSPropOptimizer: ones

    def _fused(self, var: FloatArray, slots: Mapping[str, FloatArray], grad: FloatArray, rows: IndexArray | None,
               lr: np.float32) -> bool:
        rms, mom, mg = slots["rms"], slots["momentum"], slots.get("mg")
        state = (var, rms, mom, grad) if mg is None else (var, rms, mom, mg, grad)
        if _KERNELS is None or not _fusable(rows, *state):
            return False
        _KERNELS.rmsprop(var, rms, mom, mg, grad, rows, var.shape[0], lr, self._decay, self._momentum, self._epsilon)
        return True

    def _update(self, var: FloatArray, slots: Mapping[str, FloatArray], grad: FloatArray, lr: np.float32) -> None:
        rms, mom = slots["rms"], slots["momentum"]
        scratch = np.multiply(grad, grad)
        scratch -= rms
        scratch *= self._one_minus_decay
        rms += scratch
        if self._centered:
            mg = slots["mg"]
            np.subtract(grad, mg, out=scratch)
            scratch *= self._one_minus_decay
            mg += scratch
            denominator = np.multiply(mg, mg)
            np.subtract(rms, denominator, out=denominator)
            denominator += self._epsilon
        else:
            denominator = rms + self._epsilon
        np.sqrt(denominator, out=denominator)
        np.multiply(grad, lr, out=scratch)
        scratch /= denominator
        mom *= self._momentum
        mom += scratch
        var -= mom

    def _update_rows(self, var: FloatArray, slots: Mapping[str, FloatArray], grad: FloatArray,
                     lr: np.float32) -> None:
        rms, mom = slots["rms"], slots["momentum"]
        rms *= self._decay
        rms += (grad * grad) * self._one_minus_decay
        if self._centered:
            mg = slots["mg"]
            mg *= self._decay
            mg += grad * self._one_minus_decay
            denominator = np.multiply(mg, mg)
            np.subtract(rms, denominator, out=denominator)
            denominator += self._epsilon
        else:
            denominator = rms + self._epsilon
        # TF's sparse kernel: rsqrt(d) * lr * g, its scalar rsqrt being 1 / sqrt.
        np.sqrt(denominator, out=denominator)
        np.divide(np.float32(1.0), denominator, out=denominator)
        denominator *= lr
        denominator *= grad
        mom *= self._momentum
        mom += denominator
        var -= mom


_REGISTRY: Mapping[str, type[Optimizer]] = {
    "sgd": SgdOptimizer,
    "momentum": MomentumOptimizer,
    "adagrad": AdagradOptimizer,
    "adam": AdamOptimizer,
    "ftrl": FtrlOptimizer,
    "rmsprop": RmspropOptimizer,
}


def make_optimizer(spec: OptimizerSpec) -> Optimizer:
    """Returns a new optimizer for ``spec``; missing hyperparameters take TF's defaults.

    Raises:
        OptimizerError: the spec names an unknown optimizer or invalid
            hyperparameters (only possible if it bypassed ``OptimizerSpec``'s checks).
    """
    return _REGISTRY[check_optimizer_name(spec.name)](spec.hyperparameters)
