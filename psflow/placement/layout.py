"""Comparing layouts, so a ps can refuse a client with a different model.

The first client to register its layout with a ps fixes it. Every later
client sends its own; :func:`layout_mismatch` says how it differs, naming
the first differing variable, and the ps refuses the client with
:class:`~psflow.placement.api.LayoutMismatchError` rather than train on a
silently different layout. Since placement is a pure function of the model
code (see the package docstring), a difference means the clients run
different model code, a different partitioner or a different ps count.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from psflow.placement.api import LayoutMismatchError, PlacementError
from psflow.placement.assignment import Partition, VariablePlacement

__all__ = ["check_layout", "layout_mismatch"]

_OTHER_CLIENT = "registered by another client"


def _by_name(placements: Sequence[VariablePlacement], side: str) -> dict[str, VariablePlacement]:
    result: dict[str, VariablePlacement] = {}
    for p in placements:
        if p.var.name in result:
            raise PlacementError(f"{side} layout declares variable {p.var.name!r} twice")
        result[p.var.name] = p
    return result


def _jsonish(value: Mapping[str, object] | None) -> str:
    return "None" if value is None else json.dumps(dict(value), sort_keys=True)


def _describe_partition(p: Partition) -> str:
    return f"rows [{p.row_start}, {p.row_stop}) on ps task {p.task}"


def _variable_difference(exp: VariablePlacement, act: VariablePlacement) -> str | None:
    e, a = exp.var, act.var
    head = f"variable {e.name!r}:"
    fields: list[tuple[str, object, object]] = [
        ("shape", a.shape, e.shape),
        ("dtype", a.dtype, e.dtype),
        ("trainable", a.trainable, e.trainable),
        ("initializer", _jsonish(a.initializer), _jsonish(e.initializer)),
        ("optimizer", _jsonish(a.optimizer), _jsonish(e.optimizer)),
        ("dynamic table options", _jsonish(a.dynamic), _jsonish(e.dynamic)),
        ("moving_average_decay", a.moving_average_decay, e.moving_average_decay),
    ]
    for key, here, there in fields:
        if here != there:
            return f"{head} {key} {here} here, {there} {_OTHER_CLIENT}"
    if len(act.partitions) != len(exp.partitions):
        return f"{head} {len(act.partitions)} partitions here, {len(exp.partitions)} {_OTHER_CLIENT}"
    for pa, pe in zip(act.partitions, exp.partitions, strict=True):
        if pa != pe:
            return f"{head} partition {pa.index} is {_describe_partition(pa)} here, {_describe_partition(pe)} {_OTHER_CLIENT}"
    return None


def layout_mismatch(expected: Sequence[VariablePlacement], actual: Sequence[VariablePlacement]) -> str | None:
    """Describes how ``actual`` (this client's layout) differs from ``expected``.

    ``expected`` is the layout already registered (by another client);
    ``actual`` is the one computed here. Variables are matched by name, so
    declaration order alone is not a difference. Variables are checked in
    ``expected`` order, then extra ones in ``actual`` order; the first
    difference is reported, e.g.
    ``variable 'w': shape (1024, 1) here, (2048, 1) registered by another
    client``.

    Returns:
        ``None`` if the layouts are equal, else a one-line message naming the
        first differing variable and how it differs.

    Raises:
        PlacementError: If either layout names a variable twice.
    """
    exp_by_name = _by_name(expected, "expected")
    act_by_name = _by_name(actual, "actual")
    for name, exp in exp_by_name.items():
        act = act_by_name.get(name)
        if act is None:
            return f"variable {name!r} {_OTHER_CLIENT} is not declared here"
        diff = _variable_difference(exp, act)
        if diff is not None:
            return diff
    for name in act_by_name:
        if name not in exp_by_name:
            return f"variable {name!r} is declared here but was not {_OTHER_CLIENT}"
    return None


def check_layout(expected: Sequence[VariablePlacement], actual: Sequence[VariablePlacement]) -> None:
    """Raises if :func:`layout_mismatch` finds a difference.

    Raises:
        LayoutMismatchError: With the :func:`layout_mismatch` message.
        PlacementError: If either layout names a variable twice.
    """
    message = layout_mismatch(expected, actual)
    if message is not None:
        raise LayoutMismatchError(message)
