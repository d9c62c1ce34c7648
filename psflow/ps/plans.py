"""Pull and push planning for the ps client: which ps task gets which partitions' rows and gradients,
and how the pulled rows go back in the caller's order.

A :class:`Planner` holds a model's layout (every variable's placement) and
routes a pull's ids or a push's gradients to the partitions that hold them,
one list per ps task (:class:`~psflow.ps.client.ParameterClient` sends one
request per task). Whole variables (one static partition, the common case) take
a short path that gives what routing would, without building the routes: ids
in range are sent as read-only views of the caller's array, gradients of the
right dtype and shape as they are. Nothing here sends anything; nothing is
copied except where a cast, a slice or a scatter needs it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from psflow.errors import PsError
from psflow.gradients import DenseGradient, SparseGradient
from psflow.native.ids import scan_ids
from psflow.placement import PlacementError, RoutedRows, VariablePlacement
from psflow.ps.protocol import GradPart, PullReply
from psflow.ps.store import partition_key

__all__ = ["ClientError", "Planner", "PullPlan"]


class ClientError(PsError, ValueError):
    """A call names an unknown variable or passes arrays of the wrong shape."""


#: Scatter marker: the partition's answer holds every requested id, in request order.
_IN_ORDER = slice(None)


def _covers(routes: Sequence[RoutedRows], ids: np.ndarray) -> bool:
    """True if one partition holds all of ``ids`` (its positions are then 0..n-1, ascending)."""
    return len(routes) == 1 and routes[0].positions.size == ids.shape[0]


def _ids(placement: VariablePlacement, ids: Any, what: str) -> np.ndarray:
    """``ids`` as int64; a dynamic table's ids must already be int64 (a cast could change them silently)."""
    if placement.is_dynamic:
        arr = np.asarray(ids)
        if arr.dtype != np.int64:
            raise PlacementError(f"dynamic table {placement.var.name!r}: {what} ids must be int64 (any value; view uint64 "
                                 f"hashes as int64), got {arr.dtype}")
        return arr
    return np.asarray(ids, dtype=np.int64)


def _check_table_gradient(client: str, placement: VariablePlacement, rows: np.ndarray, values: np.ndarray) -> None:
    """Raises ClientError, naming the table, unless ``values`` holds one finite row of the table's width per id."""
    name, dim = placement.var.name, placement.var.shape[1]
    if values.shape != (rows.shape[0], dim):
        raise ClientError(f"{client}: dynamic table {name!r}: sparse gradient for {rows.shape[0]} ids must have shape "
                          f"({rows.shape[0]}, {dim}); got {values.shape}")
    finite = np.isfinite(values).all(axis=1)
    if not finite.all():
        raise ClientError(f"{client}: dynamic table {name!r}: the gradient of id {int(rows[np.flatnonzero(~finite)[0]])} "
                          f"is not finite")


def _read_only(ids: np.ndarray, views: dict[int, np.ndarray]) -> np.ndarray:
    """A read-only view of ``ids``, the same one for the same array within one plan (``views``, by ``id()``; the
    arrays outlive the plan's building): tables looked up by the same ids (a wide and a deep table over one
    feature) then send them once (:mod:`psflow.ps.protocol.stacking`)."""
    local = views.get(id(ids))
    if local is None:
        local = views[id(ids)] = ids.view()
        local.flags.writeable = False
    return local


@dataclass
class PullPlan:
    """One pull, split by ps task: what to ask each task and how to put the answers back."""

    per_task: dict[int, list[tuple[str, np.ndarray | None]]]  # ps task -> (partition key, local rows or None)
    # (name, partition key, positions): None = a whole variable, IN_ORDER = every id, in order, from this partition
    scatter: list[tuple[str, str, np.ndarray | slice | None]] = field(default_factory=list)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    empty: list[str] = field(default_factory=list)  # lookups of no ids: no partition is asked, the answer is empty


@dataclass(frozen=True)
class _Whole:
    """A whole variable's request fields (:attr:`Planner._whole`)."""

    task: int
    key: str
    num_rows: int
    row_shape: tuple[int, ...]
    dtype: np.dtype[Any]
    shape: tuple[int, ...]  # (num_rows, *row_shape)


class Planner:
    """Routes pulls and pushes of one model's variables to the partitions holding them. Stateless after
    construction (thread-safe); errors name ``client_name``."""

    def __init__(self, layout: Sequence[VariablePlacement], *, client_name: str) -> None:
        self.client_name = client_name
        self.layout = {p.var.name: p for p in layout}
        # Whole (unpartitioned, static, non-scalar) variables, the common case: the fields a request needs,
        # computed once instead of on each of the ~100 lookups and gradients of a step.
        self._whole: dict[str, _Whole] = {}
        for p in layout:
            if len(p.partitions) == 1 and p.var.shape and not p.is_dynamic:
                key = partition_key(p.var.name, 0)
                self._whole[p.var.name] = _Whole(p.partitions[0].task, key, p.num_rows, tuple(p.var.shape[1:]),
                                                 np.dtype(p.var.dtype), (p.num_rows, *p.var.shape[1:]))

    def placement(self, name: str) -> VariablePlacement:
        """The placement of variable ``name``.

        Raises:
            ClientError: the model has no such variable (names the known ones).
        """
        p = self.layout.get(name)
        if p is None:
            raise ClientError(f"{self.client_name}: unknown variable {name!r} (known: {', '.join(self.layout)})")
        return p

    def pull(self, requests: Mapping[str, np.ndarray | None], *, always: int | None = None) -> PullPlan:
        """The partitions each ps task is asked for (``always``: a task asked even for nothing).

        Raises:
            ClientError: unknown variable; PlacementError: ids out of range or of the wrong dtype.
        """
        plan = PullPlan({always: []} if always is not None else {})
        views: dict[int, np.ndarray] = {}
        for name, ids in requests.items():
            fast = self._whole.get(name)
            if (fast is not None and type(ids) is np.ndarray and ids.dtype == np.int64 and ids.ndim == 1
                    and scan_ids(ids, fast.num_rows)[0] < 0):
                # A whole table, int64 ids in range: what route() would give, without building it.
                plan.shapes[name] = (ids.shape[0], *fast.row_shape)
                if not ids.shape[0]:
                    plan.empty.append(name)
                else:
                    plan.per_task.setdefault(fast.task, []).append((fast.key, _read_only(ids, views)))
                    plan.scatter.append((name, fast.key, _IN_ORDER))
                continue
            placement = self.placement(name)
            var = placement.var
            if ids is None:
                plan.shapes[name] = tuple(var.shape)
                for part in placement.partitions:
                    key = partition_key(name, part.index)
                    plan.per_task.setdefault(part.task, []).append((key, None))
                    plan.scatter.append((name, key, None))
                continue
            ids = _ids(placement, ids, "lookup")
            plan.shapes[name] = (ids.shape[0], *var.shape[1:])
            routes = placement.route(ids)
            if not routes:
                plan.empty.append(name)
            whole = _covers(routes, ids)
            for routed in routes:
                key = partition_key(name, routed.partition)
                plan.per_task.setdefault(routed.task, []).append((key, routed.local_rows))
                plan.scatter.append((name, key, _IN_ORDER if whole else routed.positions))
        return plan

    def assemble(self, plan: PullPlan, replies: Mapping[int, PullReply], *,
                 task_name: Callable[[int], str]) -> dict[str, np.ndarray]:
        """Each variable's rows, in the order asked, from the tasks' replies to ``plan``.

        Args:
            plan: the pull's plan.
            replies: ps task (shard) index -> its reply.
            task_name: shard index -> the task that answered for it (the client's channel's, e.g.
                ``/job:ps_backup/task:0`` after a failover), for errors.

        Raises:
            ClientError: a reply holds no rows of a partition it was asked for (names the variable and task).
        """
        parts: dict[str, np.ndarray] = {}
        for reply in replies.values():
            parts.update(reply.values)
        out: dict[str, np.ndarray] = {}
        whole: dict[str, list[np.ndarray]] = {}
        for name, key, positions in plan.scatter:
            part = parts.get(key)
            if part is None:
                shard = next(t for t, asked in plan.per_task.items() if any(k == key for k, _ in asked))
                raise ClientError(f"{self.client_name}: variable {name!r}: the reply of {task_name(shard)} (ps shard "
                                  f"{shard}) holds no rows of its partition {key!r}")
            if positions is None:
                whole.setdefault(name, []).append(part)
                continue
            if isinstance(positions, slice) and part.shape == plan.shapes[name]:
                # One partition answered for every id, in order: no scatter. A read-only array (a view of a
                # received frame) is copied; a writable one is the caller's already: the ps task's own fresh copy
                # (in-process), or a view of a reply's buffer the carrier gave up (tcp: decode(writable=True)).
                dtype = self.layout[name].var.dtype
                out[name] = part if part.flags.writeable and part.dtype == dtype else np.array(part, dtype=dtype)
                continue
            if name not in out:
                out[name] = np.empty(plan.shapes[name], dtype=self.layout[name].var.dtype)
            out[name][positions] = part
        for name, pieces in whole.items():
            out[name] = pieces[0].copy() if len(pieces) == 1 else np.concatenate(pieces, axis=0)
        for name in plan.empty:
            out[name] = np.empty(plan.shapes[name], dtype=self.layout[name].var.dtype)
        return out

    def push(self, grads: Mapping[str, DenseGradient | SparseGradient], targets: Sequence[int]
             ) -> dict[int, list[GradPart]]:
        """Each ps task's partition gradients (``targets``: tasks that get a push even with none).

        Raises:
            ClientError: unknown variable, or a gradient of the wrong shape or (dynamic table) not finite;
            PlacementError: rows out of range or of the wrong dtype.
        """
        per_task: dict[int, list[GradPart]] = {t: [] for t in targets}
        views: dict[int, np.ndarray] = {}
        for name, grad in grads.items():
            fast = self._whole.get(name)
            if fast is not None:
                values = grad.values
                if isinstance(grad, SparseGradient):
                    rows = grad.rows
                    if (type(rows) is np.ndarray and rows.dtype == np.int64 and rows.ndim == 1
                            and type(values) is np.ndarray and values.dtype == fast.dtype
                            and scan_ids(rows, fast.num_rows)[0] < 0):
                        # A whole table's gradient, int64 rows in range (the ps checks the values' shape).
                        if rows.shape[0]:
                            per_task.setdefault(fast.task, []).append((fast.key, values, _read_only(rows, views)))
                        continue
                elif type(values) is np.ndarray and values.dtype == fast.dtype and values.shape == fast.shape:
                    # A whole variable's dense gradient of its dtype and shape: sent as it is (what the
                    # general path below sends too, without its cast and slice).
                    per_task.setdefault(fast.task, []).append((fast.key, values, None))
                    continue
            placement = self.placement(name)
            if isinstance(grad, DenseGradient):
                values = np.asarray(grad.values, dtype=placement.var.dtype)
                if values.shape != tuple(placement.var.shape):
                    raise ClientError(
                        f"{self.client_name}: variable {name!r} has shape {tuple(placement.var.shape)}; "
                        f"gradient has {values.shape}"
                    )
                for part in placement.partitions:
                    key = partition_key(name, part.index)
                    per_task.setdefault(part.task, []).append((key, values[part.row_start : part.row_stop], None))
                continue
            rows = _ids(placement, grad.rows, "gradient")
            values = np.asarray(grad.values, dtype=placement.var.dtype)
            if placement.is_dynamic:  # checked here, as a whole: each ps task sees only its own ids
                _check_table_gradient(self.client_name, placement, rows, values)
            routes = placement.route(rows)
            whole = _covers(routes, rows)
            for routed in routes:
                key = partition_key(name, routed.partition)
                per_task.setdefault(routed.task, []).append(
                    (key, values if whole else values[routed.positions], routed.local_rows))
        return per_task
