"""Towers: replicas of a worker's module, one per device, that split each batch (TF's multi-GPU CIFAR-10 shape).

:class:`~psflow.torch.TorchModel` placed on more than the CPU's one replica
(``psflow train --device cuda``, ``--towers N``, ``--devices cuda:0,cuda:1``;
:meth:`TorchModel.place <psflow.torch.TorchModel.place>`) runs each step so:

1. the step's variables are pulled once (the runtime's pull, as without
   towers) and copied into every tower's parameters on its device;
2. the batch is cut into one contiguous slice per tower (sizes differ by at
   most one example; a tower without examples sits the step out), and every
   embedding group's lookup plan is cut to the slice's entries: each tower
   gets all the pulled rows and uses those of its own examples;
3. the towers run forward and backward at once, tower 0 on the calling
   thread, the others each on a thread of their own (CPU towers run in
   threads; PyTorch releases the GIL in its kernels);
4. each tower's loss (the mean over its slice) is weighted by its slice's
   share of the batch, ``n_i / n``, before backward, so the towers'
   gradients *sum* to the gradient of the batch's mean loss: N towers on a
   batch push what one tower on it pushes (up to float32 rounding);
5. the sum is taken on the CPU and pushed once (dense parameters whole,
   tables as sparse gradients of the pulled rows, as without towers); the
   loss is the weighted sum of the towers' losses and the outputs are the
   towers' logits in batch order.

:func:`check_devices` says whether PyTorch sees the devices named. A tower
never outlives its model; its module is a deep copy of the model's, moved to
its device. Not thread-safe: one step at a time per model (as every model).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
from torch import nn

from psflow.models.api import ModelError

__all__ = ["Tower", "TowerPool", "check_devices", "split_batch", "sum_on_cpu"]

T = TypeVar("T")


def check_devices(devices: Sequence[str]) -> tuple[torch.device, ...]:
    """The devices named, as PyTorch devices, once PyTorch is seen to have each.

    Raises:
        ModelError: a name PyTorch does not read as a device, or a GPU it does not see
            (``PyTorch sees no GPU (torch.cuda.is_available() is False)``).
    """
    out = []
    for name in devices:
        try:
            device = torch.device(name)
        except RuntimeError as e:
            raise ModelError(f"unknown device {name!r} (want cpu, cuda or cuda:N): {e}") from None
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise ModelError("PyTorch sees no GPU (torch.cuda.is_available() is False)")
            count = torch.cuda.device_count()
            if device.index is not None and device.index >= count:
                raise ModelError(f"{name}: PyTorch sees {count} GPU{'s' if count > 1 else ''} (cuda:0 to cuda:{count - 1})")
        elif device.type != "cpu":
            raise ModelError(f"unknown device {name!r} (want cpu, cuda or cuda:N)")
        out.append(device)
    if not out:
        raise ModelError("no devices: a model needs at least one tower")
    return tuple(out)


@dataclass(frozen=True)
class Tower:
    """One replica of a module on one device.

    Attributes:
        device: where it computes.
        module: the replica (a deep copy of the model's module, on ``device``).
        params: its parameters with their variable names, in the model's order.
        counterpart: ``id()`` of each of the model's submodules -> this replica's copy of it
            (an embedding module's lookup is found by the module that asks for it).
    """

    device: torch.device
    module: nn.Module
    params: tuple[tuple[str, nn.Parameter], ...]
    counterpart: dict[int, nn.Module]

    @classmethod
    def replicate(cls, module: nn.Module, device: torch.device) -> Tower:
        """A deep copy of ``module`` on ``device``; parameters named as :class:`~psflow.torch.TorchModel` names them."""
        replica = copy.deepcopy(module).to(device)
        counterpart = {id(m): r for (_, m), (_, r) in zip(module.named_modules(), replica.named_modules(), strict=True)}
        params = tuple((name.replace(".", "/"), p) for name, p in replica.named_parameters())
        return cls(device, replica, params, counterpart)

    def load(self, values: Callable[[str], np.ndarray]) -> None:
        """Copies every parameter's pulled value (``values(name)``, float32, C order) into this replica."""
        with torch.no_grad():
            for name, p in self.params:
                p.copy_(torch.from_numpy(values(name)).reshape(p.shape), non_blocking=False)


class TowerPool:
    """Runs one function per tower at once: the first on the calling thread, the rest on a thread each.

    The threads start with the first multi-tower call and are reused; :meth:`close` ends them.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._executor: ThreadPoolExecutor | None = None

    def map(self, calls: Sequence[Callable[[], T]]) -> list[T]:
        """Each call's result, in order; the first exception raised by any call is raised (after all ended)."""
        if len(calls) == 1:
            return [calls[0]()]
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=max(1, self.size - 1), thread_name_prefix="psflow-tower")
        futures = [self._executor.submit(call) for call in calls[1:]]
        try:
            first = calls[0]()
        finally:
            for f in futures:
                f.exception()  # waits; a tower still running its step must not outlive the call
        return [first, *(f.result() for f in futures)]

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


def split_batch(num_examples: int, towers: int) -> list[tuple[int, int]]:
    """Contiguous slices ``[start, stop)`` of the batch, one per tower, sizes within one of each other.

    Towers beyond the examples get none and are left out (an empty batch: one empty slice).
    """
    bounds = np.linspace(0, num_examples, towers + 1).round().astype(np.int64)
    slices = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]
    return slices or [(0, num_examples)]


def sum_on_cpu(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The sum of the towers' tensors, on the CPU, in tower order (one tower's: itself, moved)."""
    total = parts[0].detach().to("cpu")
    if len(parts) > 1:
        total = total.clone()
        for part in parts[1:]:
            total.add_(part.detach().to("cpu"))
    return total
