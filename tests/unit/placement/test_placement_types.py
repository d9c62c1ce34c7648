"""Unit tests for psflow.placement.api and assignment: VariableDef, Partition, VariablePlacement, JSON."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from psflow.placement import (
    Partition,
    PlacementError,
    VariableDef,
    VariablePlacement,
    placements_from_json,
    placements_to_json,
    split_rows,
)


def _placement(name: str, rows: int, tasks: list[int], *, cols: int = 4) -> VariablePlacement:
    ranges = split_rows(rows, len(tasks))
    parts = tuple(Partition(i, t, a, b) for i, (t, (a, b)) in enumerate(zip(tasks, ranges, strict=True)))
    return VariablePlacement(VariableDef(name, (rows, cols)), parts)


# -- split_rows ------------------------------------------------------------------


@pytest.mark.parametrize(
    "rows, n, expected",
    [
        (10, 3, [(0, 4), (4, 7), (7, 10)]),
        (10, 4, [(0, 3), (3, 6), (6, 8), (8, 10)]),
        (9, 3, [(0, 3), (3, 6), (6, 9)]),
        (7, 7, [(i, i + 1) for i in range(7)]),
        (5, 1, [(0, 5)]),
        (0, 1, [(0, 0)]),
        (1000, 3, [(0, 334), (334, 667), (667, 1000)]),
    ],
)
def test_split_rows_matches_tensorflow(rows: int, n: int, expected: list[tuple[int, int]]) -> None:
    assert split_rows(rows, n) == expected


@given(rows=st.integers(1, 10_000), data=st.data())
def test_split_rows_property(rows: int, data: st.DataObject) -> None:
    n = data.draw(st.integers(1, min(rows, 64)))
    ranges = split_rows(rows, n)
    sizes = [b - a for a, b in ranges]
    assert ranges[0][0] == 0 and ranges[-1][1] == rows
    assert all(ranges[i][1] == ranges[i + 1][0] for i in range(n - 1))
    # The first rows % n partitions are exactly one row longer.
    assert sizes == [rows // n + 1] * (rows % n) + [rows // n] * (n - rows % n)


def test_split_rows_errors() -> None:
    with pytest.raises(PlacementError, match="cannot split 3 rows into 4 partitions"):
        split_rows(3, 4)
    with pytest.raises(PlacementError, match="number of partitions must be >= 1, got 0"):
        split_rows(3, 0)
    with pytest.raises(PlacementError, match="number of rows must be >= 0, got -1"):
        split_rows(-1, 1)


# -- VariableDef -----------------------------------------------------------------


def test_variable_def_defaults_and_normalization() -> None:
    var = VariableDef("dense/kernel", [784, 10])  # type: ignore[arg-type]
    assert var.shape == (784, 10)
    assert var.dtype == "float32"
    assert var.initializer == {"name": "zeros"}
    assert var.optimizer is None
    assert var.trainable is True
    assert var.nbytes == 784 * 10 * 4


@pytest.mark.parametrize(
    "shape, dtype, nbytes",
    [((), "int64", 8), ((3, 0), "float32", 0), ((2, 3), "float16", 12), ((5,), "bool", 5), ((4,), "complex128", 64)],
)
def test_nbytes(shape: tuple[int, ...], dtype: str, nbytes: int) -> None:
    assert VariableDef("v", shape, dtype=dtype).nbytes == nbytes


def test_variable_def_is_hashable_and_immutable() -> None:
    var = VariableDef("w", (2,), initializer={"name": "normal", "stddev": 0.1})
    assert hash(var) == hash(VariableDef("w", (2,), initializer={"name": "normal", "stddev": 0.1}))
    assert var != VariableDef("w", (2,))
    with pytest.raises(TypeError):
        var.initializer["name"] = "zeros"  # type: ignore[index]
    with pytest.raises(AttributeError):
        var.name = "x"  # type: ignore[misc]


def test_initializer_is_copied() -> None:
    config = {"name": "constant", "value": [1, 2]}
    var = VariableDef("w", (2,), initializer=config)
    config["name"] = "zeros"
    assert var.initializer["name"] == "constant"


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"name": "", "shape": (1,)}, "invalid variable name ''"),
        ({"name": "/w", "shape": (1,)}, "invalid variable name '/w'"),
        ({"name": "w/", "shape": (1,)}, "invalid variable name 'w/'"),
        ({"name": "a//b", "shape": (1,)}, "invalid variable name 'a//b'"),
        ({"name": "w", "shape": (-1,)}, "variable 'w': shape dimension must be >= 0, got -1"),
        ({"name": "w", "shape": (2.0,)}, "variable 'w': shape dimension must be an int, got 2.0"),
        ({"name": "w", "shape": "ab"}, "variable 'w': shape must be a tuple of ints"),
        ({"name": "w", "shape": (1,), "dtype": "string"}, "variable 'w': unsupported dtype 'string'"),
        ({"name": "w", "shape": (1,), "initializer": {"fn": object()}}, "variable 'w': initializer must be JSON-serializable"),
        ({"name": "w", "shape": (1,), "initializer": {"v": float("nan")}}, "initializer must be JSON-serializable"),
        ({"name": "w", "shape": (1,), "optimizer": "adam"}, "variable 'w': optimizer must be a mapping, got 'adam'"),
        ({"name": "w", "shape": (1,), "trainable": 1}, "variable 'w': trainable must be a bool, got 1"),
    ],
)
def test_variable_def_errors(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(PlacementError) as info:
        VariableDef(**kwargs)  # type: ignore[arg-type]
    assert fragment in str(info.value)


def test_variable_def_dict_round_trip() -> None:
    var = VariableDef(
        "emb",
        (10, 4),
        dtype="float64",
        initializer={"name": "uniform", "range": [-1, 1]},
        optimizer={"name": "adagrad"},
        trainable=False,
    )
    data = json.loads(json.dumps(var.to_dict()))
    assert VariableDef.from_dict(data) == var
    assert VariableDef.from_dict({"name": "b", "shape": [3]}) == VariableDef("b", (3,))


# -- Partition / VariablePlacement ---------------------------------------------


def test_partition_name_and_rows() -> None:
    part = Partition(2, 1, 10, 15)
    assert part.name("emb") == "emb/part_2"
    assert part.num_rows == 5


def test_partition_errors() -> None:
    with pytest.raises(PlacementError, match="partition task must be >= 0, got -1"):
        Partition(0, -1, 0, 1)
    with pytest.raises(PlacementError, match="partition 0: row_stop 1 < row_start 2"):
        Partition(0, 0, 2, 1)


def test_unpartitioned_placement() -> None:
    placement = VariablePlacement(VariableDef("w", (8, 2)), (Partition(0, 1, 0, 8),))
    assert not placement.is_partitioned
    assert placement.storage_names() == ("w",)
    assert placement.partition_shape(0) == (8, 2)


def test_partitioned_placement() -> None:
    placement = _placement("emb", 10, [0, 1, 0])
    assert placement.is_partitioned
    assert placement.storage_names() == ("emb/part_0", "emb/part_1", "emb/part_2")
    assert [placement.partition_shape(i) for i in range(3)] == [(4, 4), (3, 4), (3, 4)]


def test_scalar_placement_has_one_row() -> None:
    placement = VariablePlacement(VariableDef("step", (), dtype="int64"), (Partition(0, 0, 0, 1),))
    assert placement.num_rows == 1
    assert placement.partition_shape(0) == ()


@pytest.mark.parametrize(
    "parts, fragment",
    [
        ((), "variable 'w': a placement needs at least one partition"),
        ((Partition(0, 0, 0, 5),), "variable 'w': partitions cover rows [0, 5), the variable has 10"),
        (
            (Partition(0, 0, 0, 5), Partition(1, 0, 6, 10)),
            "partition 1 at position 1 starts at row 6; expected partition 1 starting at row 5",
        ),
        ((Partition(1, 0, 0, 10),), "partition 1 at position 0"),
        ((Partition(0, 0, 0, 10), Partition(1, 1, 10, 10)), "variable 'w': partition 1 holds no rows"),
    ],
)
def test_placement_validation(parts: tuple[Partition, ...], fragment: str) -> None:
    with pytest.raises(PlacementError) as info:
        VariablePlacement(VariableDef("w", (10,)), parts)
    assert fragment in str(info.value)


def test_scalar_cannot_be_partitioned() -> None:
    with pytest.raises(PlacementError, match="holds no rows|cannot be partitioned"):
        VariablePlacement(VariableDef("s", ()), (Partition(0, 0, 0, 1), Partition(1, 0, 1, 1)))


def test_placement_equality_and_hash() -> None:
    assert _placement("w", 10, [0, 1]) == _placement("w", 10, [0, 1])
    assert hash(_placement("w", 10, [0, 1])) == hash(_placement("w", 10, [0, 1]))
    assert _placement("w", 10, [0, 1]) != _placement("w", 10, [1, 0])


# -- JSON --------------------------------------------------------------------------


def test_placement_json_round_trip_and_determinism() -> None:
    placement = VariablePlacement(
        VariableDef("emb", (10, 4), initializer={"b": 1, "a": [2]}, optimizer={"name": "ftrl", "l1": 0.5}),
        (Partition(0, 1, 0, 5), Partition(1, 0, 5, 10)),
    )
    text = placement.to_json()
    assert VariablePlacement.from_json(text) == placement
    assert VariablePlacement.from_json(text).to_json() == text
    assert json.loads(text)["partitions"][1] == {"index": 1, "task": 0, "row_start": 5, "row_stop": 10}


def test_placement_list_json_round_trip() -> None:
    placements = (_placement("a", 3, [0]), _placement("b", 9, [1, 0, 1]))
    assert placements_from_json(placements_to_json(placements)) == placements
    assert placements_from_json("[]") == ()


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("{", "variable placement is not valid JSON"),
        ("[]", "variable placement must be an object"),
        ('{"var": {"name": "w", "shape": [2]}}', "variable placement is missing 'partitions'"),
        ('{"var": {"name": "w"}, "partitions": []}', "variable definition is missing 'shape'"),
        ('{"var": {"name": "w", "shape": 2}, "partitions": []}', "variable 'w': shape must be a list, got 2"),
        ('{"var": {"name": "w", "shape": [2]}, "partitions": 1}', "variable 'w': 'partitions' must be a list"),
        (
            '{"var": {"name": "w", "shape": [2]}, "partitions": [{"index": 0}]}',
            "partition of variable 'w' is missing 'task', 'row_start'",
        ),
        (
            '{"var": {"name": "w", "shape": [2]}, "partitions": [{"index": 0, "task": 0, "row_start": 0, "row_stop": 1}]}',
            "partitions cover rows [0, 1), the variable has 2",
        ),
    ],
)
def test_placement_from_json_errors(text: str, fragment: str) -> None:
    with pytest.raises(PlacementError) as info:
        VariablePlacement.from_json(text)
    assert fragment in str(info.value)


def test_placements_from_json_requires_list() -> None:
    with pytest.raises(PlacementError, match="placement list must be a JSON list"):
        placements_from_json("{}")
    with pytest.raises(PlacementError, match="placement list is not valid JSON"):
        placements_from_json("[")
