"""Evaluation and prediction of any model: the one implementation every caller uses.

The chief's periodic evaluation (:class:`~psflow.train.hooks.EvalHook`), the
launcher's final evaluation, the in-process fast path, ``psflow export`` /
``psflow predict`` and users' scripts all call :func:`evaluate` or
:func:`predict`. They differ only in where the parameters come from (a
:class:`ParameterSource`):

* a :class:`~psflow.ps.client.ParameterClient` -- the live ps tasks;
* :class:`ArrayParameters` -- whole variables in memory (an exported model
  or a checkpoint read back), so scoring needs no cluster;
* :class:`LiveParameters` -- the variables, or their moving averages
  (``--eval-moving-averages``, :mod:`psflow.ps.averages`), on the live ps tasks,
  read only from ready ones (a task being restored refuses: :mod:`psflow.ps.ready_read`);
  :func:`parameters` makes it. :mod:`psflow.train.ready_eval` retries an evaluation
  a restore interrupted, and says one it could not make.

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

from psflow.checkpoint.variables import DYNAMIC_IDS
from psflow.data import Batch
from psflow.models.api import Lookups, Model, ModelError

__all__ = ["ParameterSource", "ArrayParameters", "LiveParameters", "parameters", "predict", "evaluate",
           "DEFAULT_CHUNK"]

#: Examples per chunk: large enough that the per-call cost vanishes, small enough to bound memory.
DEFAULT_CHUNK = 65536


class ParameterSource(Protocol):
    """Where evaluation reads parameters from (a client, or :class:`ArrayParameters`)."""

    def pull(self, requests: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
        """Variable name -> rows of the requested ids (or the whole variable for None)."""
        ...


class AveragesSource(Protocol):
    """A source that can read moving averages (a :class:`~psflow.ps.client.ParameterClient`)."""

    def pull(self, requests: Mapping[str, np.ndarray | None], *, create: bool = False,
             averages: bool = False, require_ready: bool = False) -> dict[str, np.ndarray]:
        """As :meth:`ParameterSource.pull`; ``averages``: the moving averages of the averaged variables;
        ``require_ready``: refused by a ps task that is not ready (:mod:`psflow.ps.ready_read`)."""
        ...


class LiveParameters:
    """The variables on the live ps tasks, read only from ready ones: every pull requires ready ps tasks, and one
    being restored refuses it (``FailedPreconditionError``, :mod:`psflow.ps.ready_read`), never answers with values
    of no model. ``averages``: an averaged variable reads as its moving average (TensorFlow's shadow variable), any
    other as its value. Blocking; each pull reads the newest values."""

    def __init__(self, client: AveragesSource, *, averages: bool = True) -> None:
        self.client = client
        self.averages = averages

    def pull(self, requests: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
        """Variable name -> rows of the requested ids (or the whole variable for None), averages where kept."""
        return self.client.pull(requests, averages=self.averages, require_ready=True)


def parameters(client: AveragesSource, *, moving_averages: bool) -> ParameterSource:
    """What evaluation reads from a client: its moving averages (``--eval-moving-averages``) or its variables, of
    ready ps tasks only (:class:`LiveParameters`)."""
    return LiveParameters(client, averages=moving_averages)


class ArrayParameters:
    """Whole variables held in memory, read as :meth:`ParameterClient.pull` reads them from ps tasks.

    A *dynamic table* (:mod:`psflow.ps.dynamic`) ``name`` is held as
    :func:`~psflow.checkpoint.variables.read_variables` gives it: its rows sorted
    by id as ``name`` ``[n, dim]`` and those ids as ``name@ids``
    (:data:`~psflow.checkpoint.variables.DYNAMIC_IDS`) ``[n]`` int64. Its rows are
    looked up by id (any int64 value, negative ones included); ids never seen
    read as zeros, as on the ps (an evaluation lookup creates no row).

    Args:
        arrays: variable name -> its whole value (and ``name@ids`` beside each dynamic table).
        what: names the source in errors (a file or directory).

    Raises:
        ModelError: a dynamic table whose ids are not 1-D int64, not sorted and distinct, or not one per row.
    """

    def __init__(self, arrays: Mapping[str, np.ndarray], *, what: str = "the parameters") -> None:
        self.arrays = dict(arrays)
        self.what = what
        #: dynamic table name -> its ids, sorted (``name@ids``).
        self.dynamic_ids: dict[str, np.ndarray] = {}
        for key, ids in self.arrays.items():
            if not key.endswith(DYNAMIC_IDS) or key.removesuffix(DYNAMIC_IDS) not in self.arrays:
                continue
            name = key.removesuffix(DYNAMIC_IDS)
            rows = self.arrays[name]
            if ids.dtype != np.int64 or ids.ndim != 1:
                raise ModelError(f"dynamic table {name!r} in {self.what}: {key!r} must be 1-D int64 ids, "
                                 f"got {ids.dtype} of shape {tuple(ids.shape)}")
            if rows.ndim != 2 or rows.shape[0] != ids.shape[0]:
                raise ModelError(f"dynamic table {name!r} in {self.what}: {ids.shape[0]} ids for rows of shape "
                                 f"{tuple(rows.shape)} (one id per row expected)")
            if ids.size > 1 and not bool(np.all(ids[1:] > ids[:-1])):
                raise ModelError(f"dynamic table {name!r} in {self.what}: {key!r} is not sorted and distinct")
            self.dynamic_ids[name] = ids

    def pull(self, requests: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
        """Copies of the requested rows or variables.

        A dynamic table's rows are looked up by id: ids never seen read as
        zeros, as on the ps. Its ids must be a 1-D int64 array; it cannot be
        pulled whole (None).

        Raises:
            ModelError: an unknown variable, an id outside a static variable's rows (names both), a dynamic
                table's ids not 1-D int64, or a dynamic table pulled whole (names it).
        """
        out = {}
        for name, ids in requests.items():
            value = self.arrays.get(name)
            if value is None:
                raise ModelError(f"{self.what} has no variable {name!r} (it has {', '.join(sorted(self.arrays))})")
            if name in self.dynamic_ids:
                out[name] = self._dynamic_rows(name, value, ids)
                continue
            if ids is None:
                out[name] = value.copy()
                continue
            ids = np.asarray(ids, dtype=np.int64)
            if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= value.shape[0]):
                bad = int(ids[(ids < 0) | (ids >= value.shape[0])][0])
                raise ModelError(f"variable {name!r}: id {bad} is out of range [0, {value.shape[0]}) in {self.what}")
            out[name] = value[ids]
        return out

    def _dynamic_rows(self, name: str, rows: np.ndarray, ids: np.ndarray | None) -> np.ndarray:
        """Rows of ``ids`` in dynamic table ``name`` (sorted ids ``self.dynamic_ids[name]``); zeros for ids never seen."""
        if ids is None:
            raise ModelError(f"dynamic table {name!r} in {self.what} cannot be pulled whole: "
                             "its rows are looked up by id")
        if not isinstance(ids, np.ndarray) or ids.dtype != np.int64 or ids.ndim != 1:
            got = f"{ids.dtype} of shape {tuple(ids.shape)}" if isinstance(ids, np.ndarray) else type(ids).__name__
            raise ModelError(f"dynamic table {name!r}: ids must be a 1-D int64 array, got {got}")
        known = self.dynamic_ids[name]
        out = np.zeros((ids.size, rows.shape[1]), rows.dtype)
        if known.size and ids.size:
            at = np.minimum(np.searchsorted(known, ids), known.size - 1)
            hit = known[at] == ids
            out[hit] = rows[at[hit]]
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
