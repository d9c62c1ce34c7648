"""Evaluation and prediction of any model: the one implementation every caller uses.

The chief's periodic evaluation (:class:`~psflow.train.hooks.EvalHook`), the
launcher's final evaluation, the in-process fast path, ``psflow export`` /
``psflow predict`` and users' scripts all call :func:`evaluate` or
:func:`predict`. They differ only in where the parameters come from (a
:class:`ParameterSource`):

* a :class:`~psflow.train.client.ParameterClient` -- the live ps tasks;
* :class:`ArrayParameters` -- whole variables in memory (an exported model
  or a checkpoint read back), so scoring needs no cluster.

Order, for each chunk of ``chunk_size`` examples: ``model.prepare``,
``model.lookups``, a pull of those rows from the source, ``model.predict``;
then the outputs of all chunks are concatenated (in example order) and, for
:func:`evaluate`, ``model.metrics(labels, outputs)``. The same model and
parameters give the same outputs from either source (same float32 values,
same arithmetic). Memory is bounded by one chunk's rows plus the outputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from psflow.data import Batch
from psflow.models.api import Lookups, Model, ModelError

__all__ = ["ParameterSource", "ArrayParameters", "predict", "evaluate", "DEFAULT_CHUNK"]

#: Examples per chunk: large enough that the per-call cost vanishes, small enough to bound memory.
DEFAULT_CHUNK = 65536


class ParameterSource(Protocol):
    """Where evaluation reads parameters from (a client, or :class:`ArrayParameters`)."""

    def pull(self, requests: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
        """Variable name -> rows of the requested ids (or the whole variable for None)."""
        ...


class ArrayParameters:
    """Whole variables held in memory, read as :meth:`ParameterClient.pull` reads them from ps tasks.

    Args:
        arrays: variable name -> its whole value.
        what: names the source in errors (a file or directory).
    """

    def __init__(self, arrays: Mapping[str, np.ndarray], *, what: str = "the parameters") -> None:
        self.arrays = dict(arrays)
        self.what = what

    def pull(self, requests: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
        """Copies of the requested rows or variables.

        Raises:
            ModelError: an unknown variable or an id outside its rows (names both).
        """
        out = {}
        for name, ids in requests.items():
            value = self.arrays.get(name)
            if value is None:
                raise ModelError(f"{self.what} has no variable {name!r} (it has {', '.join(sorted(self.arrays))})")
            if ids is None:
                out[name] = value.copy()
                continue
            ids = np.asarray(ids, dtype=np.int64)
            if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= value.shape[0]):
                bad = int(ids[(ids < 0) | (ids >= value.shape[0])][0])
                raise ModelError(f"variable {name!r}: id {bad} is out of range [0, {value.shape[0]}) in {self.what}")
            out[name] = value[ids]
        return out


def _chunk_outputs(model: Model, source: ParameterSource, batch: Batch) -> dict[str, np.ndarray]:
    prepared = model.prepare(batch)
    lookups: Lookups = model.lookups(prepared)
    return model.predict(prepared, source.pull(lookups))


def predict(model: Model, source: ParameterSource, batch: Batch, *, chunk_size: int = DEFAULT_CHUNK) -> dict[str, np.ndarray]:
    """The model's outputs for every example of ``batch``, in order (see the module docstring).

    Raises:
        ModelError: the model asked for a variable the source lacks, or an id outside it.
        RpcError: (a client) a ps task failed.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    parts = [_chunk_outputs(model, source, batch.slice(start, start + chunk_size))
             for start in range(0, max(batch.num_examples, 1), chunk_size)]
    if len(parts) == 1:
        return parts[0]
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


def evaluate(model: Model, source: ParameterSource, batch: Batch, *, chunk_size: int = DEFAULT_CHUNK) -> dict[str, float]:
    """``model.metrics`` of the model's outputs on ``batch`` (e.g. AUC, log-loss, accuracy, examples)."""
    return model.metrics(batch.labels, predict(model, source, batch, chunk_size=chunk_size))
