"""Numerically stable pieces of a binary classifier's loss, shared by the built-in models."""

from __future__ import annotations

import numpy as np

__all__ = ["sigmoid", "sigmoid_cross_entropy", "binary_outputs"]


def sigmoid(z: np.ndarray) -> np.ndarray:
    """The logistic function, without overflow for large ``|z|``."""
    out = np.empty_like(z, dtype=np.float64)
    pos = z >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-z[pos]))
    ez = np.exp(z[~pos])
    out[~pos] = ez / (1.0 + ez)
    return out


def sigmoid_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per-example loss, as ``tf.nn.sigmoid_cross_entropy_with_logits``."""
    loss: np.ndarray = np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))
    return loss


def binary_outputs(logits: np.ndarray) -> dict[str, np.ndarray]:
    """A binary classifier's outputs: ``predictions`` (probability of class 1) and ``logits``."""
    return {"predictions": sigmoid(logits), "logits": logits}
