"""Server-side optimizers that reproduce TensorFlow's ``tf.compat.v1.train`` updates: the formulas and the registry.

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

The checks, the learning rate's schedule, the duplicate rows and the
gather/scatter around these formulas are :class:`~psflow.ps.optimizer_base.Optimizer`'s
(``psflow/ps/optimizer_base.py``, re-exported here), and so is the thread safety:
none of these methods lock; callers hold a per-variable (or per-partition) lock.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from psflow.native.loader import load_extension
from psflow.optim.spec import Hyperparameters, OptimizerSpec, check_optimizer_name
from psflow.ps.optimizer_base import FloatArray, IndexArray, Optimizer, fusable

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

# Adam's final var update goes through scratch buffers of at most this many
# elements (256 KiB each in float32). This keeps memory use bounded for a 2^20-row
# variable, and chunks this size stay in cache.
_CHUNK_ELEMENTS = 1 << 16


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
        if _KERNELS is None or not fusable(rows, var, accum, grad):
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
    #: float32's smallest normal number: below it 1/rate overflows (a decayed rate far out).
    min_scheduled_rate = float(np.finfo(np.float32).tiny)

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
        if _KERNELS is None or self._power != np.float32(-0.5) or not fusable(rows, var, accum, linear, grad):
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
        if _KERNELS is None or not fusable(rows, *state):
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
