"""Placement of dynamic tables (issue #14): one partition per ps task, ids routed by owner_of, layouts compared."""

from __future__ import annotations

import numpy as np
import pytest

from psflow.placement import (
    PlacementError,
    RoundRobinStrategy,
    VariableDef,
    VariablePlacement,
    VariableSet,
    fixed_size_partitioner,
    layout_mismatch,
    replica_device_setter,
)
from psflow.placement.hashing import owner_of


def _set(num_ps: int = 3) -> VariableSet:
    return VariableSet(replica_device_setter(num_ps, ps_strategy=RoundRobinStrategy(num_ps)))


def test_a_dynamic_table_has_a_partition_on_every_ps_task_and_leaves_the_strategy_alone() -> None:
    variables = _set(3)
    a = variables.get_variable("a", (4,))
    emb = variables.get_variable("emb", (0, 8), dynamic={"capacity_rows": 100})
    b = variables.get_variable("b", (4,))
    assert [(p.index, p.task, p.row_start, p.row_stop) for p in emb.partitions] == [(0, 0, 0, 0), (1, 1, 0, 0), (2, 2, 0, 0)]
    assert emb.is_dynamic and not a.is_dynamic
    assert (a.partitions[0].task, b.partitions[0].task) == (0, 1)  # round robin went on as if emb were not there
    with variables.device("/job:ps/task:2"):
        pinned = variables.get_variable("pinned", (0, 2), dynamic={})
    assert [(p.index, p.task) for p in pinned.partitions] == [(0, 2)]
    assert VariablePlacement.from_json(emb.to_json()) == emb
    assert VariableDef.from_dict(emb.var.to_dict()).dynamic == {"capacity_rows": 100}
    assert "dynamic" not in a.var.to_dict()  # a static variable's JSON is what it was before dynamic tables


def test_ids_of_the_whole_int64_range_route_to_their_owner_and_back_in_order() -> None:
    emb = _set(3).get_variable("emb", (0, 4), dynamic={})
    rng = np.random.default_rng(5)
    ids = np.concatenate([rng.integers(-(2**63), 2**63 - 1, 1000, dtype=np.int64),
                          np.array([-(2**63), -1, 0, 2**63 - 1], dtype=np.int64), np.repeat(np.int64(42), 3)])
    routes = emb.route(ids)
    seen = np.zeros(ids.size, dtype=int)
    owners = owner_of(ids, 3)
    for r in routes:
        assert r.task == r.partition and np.all(owners[r.positions] == r.partition)
        np.testing.assert_array_equal(r.local_rows, ids[r.positions])  # a dynamic table's "rows" are the ids
        assert np.all(np.diff(r.positions) > 0)
        seen[r.positions] += 1
    assert np.all(seen == 1)
    with pytest.raises(PlacementError, match=r"dynamic table 'emb': ids must be int64 \(any value\), got uint64"):
        emb.route(ids.view(np.uint64))


def test_definitions_a_dynamic_table_refuses_name_it() -> None:
    with pytest.raises(PlacementError, match=r"variable 'emb': a dynamic table has shape \(0, dim\)"):
        VariableDef("emb", (10, 4), dynamic={})
    with pytest.raises(PlacementError, match=r"variable 'emb': a dynamic table has shape \(0, dim\).*float64"):
        VariableDef("emb", (0, 4), dtype="float64", dynamic={})
    with pytest.raises(PlacementError, match=r"variable 'emb': a dynamic table is spread over the ps tasks by id; "
                                             r"it takes no partitioner"):
        _set(2).get_variable("emb", (0, 4), dynamic={}, partitioner=fixed_size_partitioner(2))
    with pytest.raises(PlacementError, match=r"variable 'emb': a dynamic table has partitions 0..n-1 on distinct"):
        VariablePlacement.from_dict({"var": VariableDef("emb", (0, 4), dynamic={}).to_dict(),
                                     "partitions": [{"index": 0, "task": 1, "row_start": 0, "row_stop": 0},
                                                    {"index": 1, "task": 1, "row_start": 0, "row_stop": 0}]})


def test_the_layout_check_names_a_table_whose_options_or_kind_differ() -> None:
    def layout(**options: object) -> tuple[VariablePlacement, ...]:
        variables = _set(2)
        variables.get_variable("emb", (0, 4), dynamic=dict(options))
        return variables.placements()

    assert layout_mismatch(layout(capacity_rows=10), layout(capacity_rows=10)) is None
    assert layout_mismatch(layout(capacity_rows=10), layout(capacity_rows=20)) == (
        "variable 'emb': dynamic table options {\"capacity_rows\": 20} here, {\"capacity_rows\": 10} registered by "
        "another client")
    static = _set(2)
    static.get_variable("emb", (0, 4))
    assert "dynamic table options None here" in str(layout_mismatch(layout(), static.placements()))
