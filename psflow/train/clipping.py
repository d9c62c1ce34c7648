"""Gradient clipping by global norm: TensorFlow's ``tf.clip_by_global_norm`` over all of a step's gradients.

A worker clips the gradients of its step, every variable's together, before
it pushes them (:class:`psflow.train.step.TrainStep`; in sync mode each
worker clips its own gradient before the ps tasks average them, as TF users
write ``clip_by_global_norm`` between ``compute_gradients`` and
``apply_gradients``). TensorFlow's formulas:

* ``global_norm = sqrt(sum over every gradient of sum(values ** 2))``. A
  sparse gradient (:class:`~psflow.gradients.SparseGradient`, TF's
  ``IndexedSlices``) counts its values *as given*: a row that appears twice
  counts twice, its two values' squares, not the square of their sum (TF's
  ``global_norm`` of ``IndexedSlices`` reads ``.values`` without summing
  duplicate indices first).
* ``scale = clip_norm * min(1 / global_norm, 1 / clip_norm)``: 1 when the
  norm is at most ``clip_norm``, else ``clip_norm / global_norm``; every
  gradient's values are multiplied by it (sparse rows keep their ids).
* A non-finite global norm (an infinite or NaN gradient) gives NaN values,
  as TensorFlow's does.

Where the norm is at most ``clip_norm`` the gradients are returned as they
are (no copy; TensorFlow multiplies them by ``clip_norm * (1 / clip_norm)``,
which is 1 within an ulp). Pure numpy; thread-safe; never modifies its input.
"""

from __future__ import annotations

import math

import numpy as np

from psflow.gradients import DenseGradient, Gradient, Gradients, SparseGradient

__all__ = ["global_norm", "clip_by_global_norm", "valid_clip_norm"]


def valid_clip_norm(clip_norm: object) -> bool:
    """True for a finite number > 0 (a clip norm; callers raise their own error, naming the setting)."""
    return (isinstance(clip_norm, (int, float)) and not isinstance(clip_norm, bool) and math.isfinite(clip_norm)
            and clip_norm > 0)


def _sum_of_squares(values: np.ndarray) -> float:
    flat = np.ascontiguousarray(values).reshape(-1)
    if flat.dtype.kind != "f":
        flat = flat.astype(np.float64)
    return float(np.dot(flat, flat))  # BLAS dot in the values' own precision (float32: TF's l2_loss is too)


def global_norm(gradients: Gradients) -> float:
    """``sqrt`` of the sum of squares of every value of every gradient (see the module docstring)."""
    return math.sqrt(sum(_sum_of_squares(g.values) for g in gradients.values()))


def _scaled(gradient: Gradient, scale: float) -> Gradient:
    values = gradient.values
    dtype = values.dtype if values.dtype.kind == "f" else np.dtype(np.float32)
    out = np.multiply(values, dtype.type(scale), dtype=dtype)
    if isinstance(gradient, SparseGradient):
        return SparseGradient(gradient.rows, out)
    return DenseGradient(out)


def clip_by_global_norm(gradients: Gradients, clip_norm: float) -> tuple[Gradients, float]:
    """The gradients scaled to a global norm of at most ``clip_norm``, and their global norm before clipping.

    Args:
        gradients: variable name -> gradient (dense or sparse), every gradient of one step.
        clip_norm: the largest global norm let through (finite, > 0).

    Returns:
        ``(clipped, norm)``: ``clipped`` has the same names, rows and shapes;
        it is ``gradients`` itself when ``norm <= clip_norm``.

    Raises:
        ValueError: ``clip_norm`` is not a finite number > 0.
    """
    if not valid_clip_norm(clip_norm):
        raise ValueError(f"clip_by_global_norm: the clip norm must be a finite number > 0, got {clip_norm!r}")
    clip = float(clip_norm)
    norm = global_norm(gradients)
    if norm <= clip:
        return gradients, norm
    scale = clip / norm if math.isfinite(norm) else math.nan  # TF: clip * min(1/norm, 1/clip); inf or NaN -> NaN
    return {name: _scaled(g, scale) for name, g in gradients.items()}, norm
