"""The in-graph path's ``RunStep`` (a worker task's WorkerService, :mod:`psflow.train.in_graph`): a batch
slice in, the step's loss, outputs and gradients out. The gradients travel as a push's
(:func:`~psflow.ps.protocol.push.gradient_arrays`), so the client pushes what a worker computed
unchanged."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import field
from typing import ClassVar

import numpy as np

from psflow.ps.protocol.fields import flag, message, optional_int
from psflow.ps.protocol.push import gradient_arrays, gradients_of
from psflow.rpc.api import InvalidRequest
from psflow.rpc.framing import Frame

__all__ = ["RunStepReply", "RunStepRequest", "SparseArrays"]

# Array names: the labels, a sparse feature's CSR arrays, a dense feature, a model output.
_LABELS, _SPARSE, _DENSE, _OUTPUT = "labels", "s/", "d/", "o/"
_CSR = ("indptr", "ids", "values")

#: A sparse feature's CSR arrays: (indptr, ids, values).
SparseArrays = tuple[np.ndarray, np.ndarray, np.ndarray]


@message
class RunStepRequest:
    """Run the step function ``step_fn`` (an allowed import path) on a batch slice; ``push``: the worker
    pushes the gradient itself (else it returns it)."""

    METHOD: ClassVar[str] = "RunStep"
    step_fn: str
    push: bool
    labels: np.ndarray
    sparse: Mapping[str, SparseArrays] = field(default_factory=dict)
    dense: Mapping[str, np.ndarray] = field(default_factory=dict)

    def to_frame(self) -> Frame:
        arrays: dict[str, np.ndarray] = {_LABELS: self.labels}
        for name, csr in self.sparse.items():
            arrays.update({f"{_SPARSE}{name}/{part}": a for part, a in zip(_CSR, csr, strict=True)})
        arrays.update({_DENSE + name: value for name, value in self.dense.items()})
        return Frame({"step_fn": self.step_fn, "push": self.push, "sparse": list(self.sparse),
                      "dense": list(self.dense)}, arrays)

    @classmethod
    def from_frame(cls, frame: Frame) -> RunStepRequest:
        meta, arrays = frame.meta, frame.arrays
        sparse, dense = meta.get("sparse"), meta.get("dense")
        if not (isinstance(sparse, list) and isinstance(dense, list) and all(isinstance(n, str) for n in sparse + dense)):
            raise InvalidRequest("RunStep needs the batch's feature names: 'sparse' and 'dense' lists of strings")

        def array(name: str) -> np.ndarray:
            value = arrays.get(name)
            if value is None:
                raise InvalidRequest(f"bad batch: array {name!r:.80} missing")
            return value

        return cls(str(meta.get("step_fn")), flag(meta, "push"), array(_LABELS),
                   {n: (array(f"{_SPARSE}{n}/indptr"), array(f"{_SPARSE}{n}/ids"), array(f"{_SPARSE}{n}/values"))
                    for n in sparse},
                   {n: array(_DENSE + n) for n in dense})


@message
class RunStepReply:
    """The step's loss (NaN where it was not finite), the step its parameters were read at, the
    global_step its push produced (``push``), its outputs, and its gradients (unless it pushed)."""

    loss: float
    read_step: int | None
    step: int | None = None
    outputs: Mapping[str, np.ndarray] = field(default_factory=dict)
    grads: Mapping[str, tuple[np.ndarray, np.ndarray | None]] = field(default_factory=dict)

    def to_frame(self) -> Frame:
        meta: dict[str, object] = {"loss": self.loss, "read_step": self.read_step}
        if self.step is not None:
            meta["step"] = self.step
        arrays = {_OUTPUT + k: np.asarray(v) for k, v in self.outputs.items()}
        arrays.update(gradient_arrays(self.grads))
        return Frame(meta, arrays)

    @classmethod
    def from_frame(cls, frame: Frame) -> RunStepReply:
        meta = frame.meta
        loss = meta.get("loss")  # a loss that was not finite travels as null
        value = float(loss) if isinstance(loss, (int, float)) and not isinstance(loss, bool) else math.nan
        outputs = {k[len(_OUTPUT):]: v for k, v in frame.arrays.items() if k.startswith(_OUTPUT)}
        return cls(value, optional_int(meta, "read_step"), optional_int(meta, "step"), outputs, gradients_of(frame))
