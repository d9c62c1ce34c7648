"""Stacked arrays (psflow/ps/protocol/stacking.py, issue 29's W&D step): a push, a pull and a pull's reply of
many partitions travel as a few arrays, and read back exactly what one array per partition gave; a stacked
range that lies outside its array is refused naming the partition."""

from __future__ import annotations

import numpy as np
import pytest

from psflow.cluster import ClusterSpec
from psflow.gradients import SparseGradient
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps import protocol as p
from psflow.ps.plans import ClientError, Planner
from psflow.ps.service import ParameterService
from psflow.rpc.api import InvalidRequest
from psflow.rpc.framing import Frame, decode, encode

pytestmark = pytest.mark.timeout(60)


def _wire(frame: Frame) -> Frame:
    return decode(encode(frame.meta, frame.arrays))


def _wide_deep_parts(tables: int = 4) -> list[p.GradPart]:
    """A W&D push's shape: per feature a deep (width 8) and a wide (width 1) table over the same rows array,
    then two dense gradients."""
    rng = np.random.default_rng(5)
    rows = [np.sort(rng.choice(1000, size=3 + t, replace=False)).astype(np.int64) for t in range(tables)]
    deep = [(f"deep/emb_{t}/part_0", rng.standard_normal((r.size, 8)).astype(np.float32), r) for t, r in enumerate(rows)]
    wide = [(f"wide/emb_{t}/part_0", rng.standard_normal((r.size, 1)).astype(np.float32), r) for t, r in enumerate(rows)]
    dense = [("deep/kernel/part_0", rng.standard_normal((5, 3)).astype(np.float32), None),
             ("deep/bias/part_0", rng.standard_normal(3).astype(np.float32), None)]
    return [*deep, *wide, *dense]


def _same(got: list[p.GradPart], want: list[p.GradPart]) -> None:
    assert [k for k, _, _ in got] == [k for k, _, _ in want]
    for (_, values, rows), (_, v, r) in zip(got, want, strict=True):
        assert values.dtype == v.dtype and values.shape == v.shape and values.tobytes() == v.tobytes()
        assert (rows is None) == (r is None)
        if rows is not None and r is not None:
            assert rows.dtype == r.dtype and rows.tolist() == r.tolist()


def test_a_push_of_many_tables_travels_as_a_few_arrays_and_reads_back_the_same() -> None:
    parts = _wide_deep_parts()
    frame = p.PushRequest(parts, p.WorkerTag("/job:worker/task:0"), step=True, examples=7, stack=True).to_frame()
    # two dense gradients, one values block per row width (8 and 1), one rows array: each table's rows once
    assert len(frame.arrays) == 5
    assert sum(a.nbytes for name, a in frame.arrays.items() if a.dtype == np.int64) == sum(
        r.nbytes for _, _, r in parts[:4] if r is not None)
    back = p.PushRequest.from_frame(_wire(frame))
    _same(list(back.grads), parts)
    assert all(not v.flags.writeable for _, v, _ in back.grads)


def test_one_array_per_partition_is_still_read() -> None:
    """A sender that does not stack (one sparse part; rows of another dtype) sends one array per partition."""
    deep, _, *dense = _wide_deep_parts(1)
    parts = [deep, *dense]
    one = p.PushRequest(parts, stack=True).to_frame()
    assert len(one.arrays) == 4 and all(kind in ("dense", "sparse") for _, kind in one.meta["grads"])
    _same(list(p.PushRequest.from_frame(_wire(one)).grads), parts)
    int32 = [(k, v, None if r is None else r.astype(np.int32)) for k, v, r in _wide_deep_parts(3)]
    frame = p.PushRequest(int32, stack=True).to_frame()
    assert len(frame.arrays) == 2 + 2 * 6
    _same(list(p.PushRequest.from_frame(_wire(frame)).grads), int32)


def test_a_gradient_of_the_wrong_length_is_not_stacked_and_reaches_the_ps_as_it_was() -> None:
    parts = _wide_deep_parts(2)
    key, values, rows = parts[0]
    bad = [(key, values[:-1], rows), *parts[1:]]
    frame = p.PushRequest(bad, stack=True).to_frame()
    assert frame.arrays["g/" + key].shape[0] == rows.size - 1  # the ps refuses it, naming the partition, as before
    _same(list(p.PushRequest.from_frame(_wire(frame)).grads), bad)


def test_a_pull_of_many_partitions_sends_one_rows_array_and_keeps_the_order() -> None:
    shared = np.array([9, 2, 5], np.int64)
    parts = [("deep/emb_0/part_0", shared), ("w/part_0", None), ("wide/emb_0/part_0", shared),
             ("deep/emb_1/part_0", np.array([1], np.int64))]
    frame = p.PullRequest(parts, create=True, stack=True).to_frame()
    assert list(frame.arrays) == ["rs/0"] and frame.arrays["rs/0"].tolist() == [9, 2, 5, 1]
    back = p.PullRequest.from_frame(_wire(frame))
    assert [(k, None if r is None else r.tolist()) for k, r in back.parts] == [
        (k, None if r is None else r.tolist()) for k, r in parts]
    assert back.create and back.stack


def test_a_pull_reply_stacks_its_values_by_dtype_and_row_shape() -> None:
    rng = np.random.default_rng(1)
    values = {"deep/emb_0/part_0": rng.standard_normal((3, 8)).astype(np.float32),
              "wide/emb_0/part_0": rng.standard_normal((3, 1)).astype(np.float32),
              "deep/emb_1/part_0": rng.standard_normal((2, 8)).astype(np.float32),
              "deep/kernel/part_0": rng.standard_normal((4, 1)).astype(np.float32),
              "deep/bias/part_0": rng.standard_normal(4).astype(np.float32),
              "steps/part_0": np.arange(3, dtype=np.int64)}
    for reply, read in ((p.PullReply(6, values, stack=True), p.PullReply.from_frame),
                        (p.PushPullReply(p.PushReply(7), p.PullReply(6, values, stack=True)),
                         lambda f: p.PushPullReply.from_frame(f).pull)):
        frame = reply.to_frame()
        assert len(frame.arrays) == 4  # rows of 8, of 1, of one float, of one int64
        got = read(_wire(frame))
        assert got.step == 6 and set(got.values) == set(values)
        for key, want in values.items():
            assert got.values[key].dtype == want.dtype and got.values[key].tobytes() == want.tobytes()
            assert got.values[key].shape == want.shape


def test_without_stack_every_partition_is_one_array_as_before() -> None:
    """What an in-process client sends (its frames are never encoded: stacking would only copy), and what a
    ps task replies to a pull that did not ask for stacked values."""
    parts = _wide_deep_parts(3)
    push = p.PushRequest(parts).to_frame()
    assert len(push.arrays) == 2 + 2 * 6 and not p.PushRequest.from_frame(push).stack
    pull = p.PullRequest([(k, r) for k, _, r in parts]).to_frame()
    assert "stack" not in pull.meta and len(pull.arrays) == 6 and not p.PullRequest.from_frame(pull).stack
    values = {k: v for k, v, _ in parts}
    assert p.PullReply(1, values).to_frame().arrays == values
    assert p.PushRequest.from_frame(p.PushRequest(parts, stack=True).to_frame()).stack


def test_a_large_value_of_a_reply_travels_as_it_is_beside_the_stacked_ones() -> None:
    """A whole large variable (more than 1 MiB) is not copied into a block; the small values still are."""
    big = np.arange(300_000, dtype=np.float32).reshape(-1, 2)
    values = {"big/part_0": big, "a/part_0": np.ones((2, 2), np.float32), "b/part_0": np.zeros((3, 2), np.float32)}
    frame = p.PullReply(1, values, stack=True).to_frame()
    assert frame.arrays["big/part_0"] is big and len(frame.arrays) == 2
    got = p.PullReply.from_frame(_wire(frame)).values
    assert {k: v.tolist() for k, v in got.items()} == {k: v.tolist() for k, v in values.items()}


def test_a_reply_whose_key_looks_like_a_block_is_not_stacked() -> None:
    values = {"vs/0": np.ones((2, 2), np.float32), "b/part_0": np.zeros((1, 2), np.float32)}
    frame = p.PullReply(1, values, stack=True).to_frame()
    assert "stacked" not in frame.meta and set(frame.arrays) == set(values)
    assert p.PullReply.from_frame(_wire(frame)).values["vs/0"].tolist() == [[1, 1], [1, 1]]


@pytest.mark.parametrize("entry, error", [
    (["e/part_0", "stacked", 0, 2, 0, 5], "partition 'e/part_0': stacked gradient values: range 2 \\+ 5"),
    (["e/part_0", "stacked", 0, 0, 4, 2], "partition 'e/part_0': stacked gradient rows: range 4 \\+ 2"),
    (["e/part_0", "stacked", 1, 0, 0, 1], "partition 'e/part_0': stacked gradient values: the stacked array is missing"),
    (["e/part_0", "stacked", "0", 0, 0, 1], "stacked gradient values: the stacked array is missing"),
    (["e/part_0", "stacked", 0, -1, 0, 1], "range -1 \\+ 1"),
    (["e/part_0", "stacked", 0, 0, 0, True], "range 0 \\+ True"),
    (["e/part_0", "stacked", 0, 0, 0], "must be \\[name, 'dense'\\|'sparse'\\] or \\[name, 'stacked'"),
])
def test_a_stacked_push_entry_outside_its_arrays_is_refused_naming_the_partition(entry: list[object],
                                                                                  error: str) -> None:
    arrays = {"gs/0": np.zeros((5, 2), np.float32), "is/0": np.arange(5, dtype=np.int64)}
    with pytest.raises(InvalidRequest, match=error):
        p.PushRequest.from_frame(Frame({"grads": [entry]}, arrays))


def _two_tables_service() -> ParameterService:
    """A ps task holding two tables (10 x 2 and 10 x 1) and a bias, SGD."""
    vs = VariableSet(replica_device_setter(cluster=ClusterSpec({"ps": ["a:1"]})))
    vs.get_variable("deep", (10, 2), initializer={"name": "constant", "value": 1.0})
    vs.get_variable("wide", (10, 1), initializer={"name": "constant", "value": 1.0})
    vs.get_variable("bias", (1,))
    svc = ParameterService(0, holds_global_step=True)
    svc.register(Frame({"layout": [v.to_json() for v in vs.placements()],
                        "optimizer": OptimizerSpec("sgd", {"learning_rate": 0.5}).to_json(), "client": "w", "chief": True}))
    return svc


@pytest.mark.parametrize("rows, values, error", [
    (np.array([0, 1, 1, 2, 3.0]), np.ones((3, 1), np.float32), "'deep' partition 0 .*: gradient row must be a 1-D int64"),
    (np.array([0, 1, 1, 2, 3]), np.ones((3, 1), np.int64), "'wide' partition 0 .*: sparse gradient .*got \\(3, 1\\) \\(int64\\)"),
    (np.array([0, 1, 1, 2, 10]), np.ones((3, 1), np.float32), "'wide' partition 0 .*: gradient row 10 out of range"),
    (np.array([0, 1, 1, 2, -1]), np.ones((3, 1), np.float32), "'wide' partition 0 .*: gradient row -1 out of range"),
    (None, np.ones((3, 1), np.float32), "partition 'deep/part_0': stacked gradient rows: the stacked array is missing"),
])
def test_a_stacked_push_with_a_bad_partition_is_refused_and_nothing_of_it_is_applied(
        rows: np.ndarray | None, values: np.ndarray, error: str) -> None:
    """A hostile or buggy sender's stacked push (rows of the wrong dtype, values of the wrong dtype, rows out of
    range, the rows missing) is refused naming the partition; the good partitions beside the bad one (a dense
    gradient, a stacked table over rows 0-1) are not applied either, and no step is taken."""
    svc = _two_tables_service()
    arrays = {"gs/0": np.ones((2, 2), np.float32), "gs/1": values, "g/bias/part_0": np.ones(1, np.float32)}
    if rows is not None:
        arrays["is/0"] = rows
    meta = {"grads": [["bias/part_0", "dense"], ["deep/part_0", "stacked", 0, 0, 0, 2],
                      ["wide/part_0", "stacked", 1, 0, 2, 3]], "step": True, "examples": 1}
    before = {key: svc.store.get(key).value.copy() for key in ("deep/part_0", "wide/part_0", "bias/part_0")}
    with pytest.raises(InvalidRequest, match=error):
        svc.push(Frame(meta, arrays))
    for key, value in before.items():
        np.testing.assert_array_equal(svc.store.get(key).value, value)
    assert svc.global_step is not None and svc.global_step.value == 0


def test_stacked_pull_and_reply_entries_outside_their_arrays_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="partition 'e/part_0': stacked rows: range 3 \\+ 3"):
        p.PullRequest.from_frame(Frame({"vars": [["e/part_0", 3, 3]]}, {"rs/0": np.arange(4, dtype=np.int64)}))
    with pytest.raises(InvalidRequest, match="stacked rows: the stacked array is missing"):
        p.PullRequest.from_frame(Frame({"vars": [["e/part_0", 0, 1]]}, {}))
    with pytest.raises(InvalidRequest, match="partition 'e/part_0': stacked values: range 0 \\+ 9"):
        p.PullReply.from_frame(Frame({"step": 1, "stacked": [["e/part_0", 0, 0, 9]]},
                                     {"vs/0": np.zeros((2, 2), np.float32)}))
    with pytest.raises(InvalidRequest, match="must be \\[name, block, start, count\\]"):
        p.PullReply.from_frame(Frame({"step": 1, "stacked": [["e/part_0", "0", 0, 1]]}, {}))
    with pytest.raises(InvalidRequest, match="partition 'e/part_0': stacked values: the stacked array has no rows"):
        p.PullReply.from_frame(Frame({"step": 1, "stacked": [["e/part_0", 0, 0, 0]]}, {"vs/0": np.array(1.0, np.float32)}))


def test_a_reply_read_as_writable_views_gives_each_partition_its_own_bytes() -> None:
    """A tcp client decodes its reply as writable views of the reply's buffer (decode(writable=True)) and hands
    each partition's values to its caller uncopied: writing one changes no other, and a reply whose ranges
    overlap (two partitions over the same bytes) is refused, naming the partition."""
    values = {f"deep/emb_{t}/part_0": np.full((2, 8), t, np.float32) for t in range(3)}
    frame = p.PullReply(1, values, stack=True).to_frame()
    assert len(frame.arrays) == 1
    got = p.PullReply.from_frame(decode(memoryview(bytearray(encode(frame.meta, frame.arrays))), writable=True))
    assert all(v.flags.writeable for v in got.values.values())
    got.values["deep/emb_1/part_0"][:] = 9.0
    assert [float(got.values[f"deep/emb_{t}/part_0"].max()) for t in range(3)] == [0.0, 9.0, 2.0]
    block = {"vs/0": np.zeros((4, 8), np.float32)}
    with pytest.raises(InvalidRequest, match="partition 'b': stacked values: range 1 \\+ 2 of block 0 overlaps"):
        p.PullReply.from_frame(Frame({"step": 1, "stacked": [["a", 0, 0, 2], ["b", 0, 1, 2]]}, block))
    with pytest.raises(InvalidRequest, match="partition 'a': stacked values: range 0 \\+ 1 of block 0 overlaps"):
        p.PullReply.from_frame(Frame({"step": 1, "stacked": [["a", 0, 2, 2], ["a", 0, 0, 1]]}, block))


def test_the_planner_sends_ids_shared_by_two_tables_as_one_array() -> None:
    vs = VariableSet(replica_device_setter(cluster=ClusterSpec({"ps": ["a:1"]})))
    vs.get_variable("deep", (100, 4))
    vs.get_variable("wide", (100, 1))
    planner = Planner(list(vs.placements()), client_name="w")
    ids = np.array([3, 7, 9], np.int64)
    (pulled,) = planner.pull({"deep": ids, "wide": ids}).per_task.values()
    assert pulled[0][1] is pulled[1][1] and not pulled[0][1].flags.writeable
    (pushed,) = planner.push({"deep": SparseGradient(ids, np.ones((3, 4), np.float32)),
                              "wide": SparseGradient(ids, np.ones((3, 1), np.float32))}, [0]).values()
    assert pushed[0][2] is pushed[1][2]
    frame = p.PushRequest(pushed, stack=True).to_frame()
    assert frame.arrays["is/0"].tolist() == [3, 7, 9]


def test_a_reply_missing_a_partition_names_the_task_that_sent_it_not_its_shard_number() -> None:
    """A shard's reply is its primary's, which after a failover is not /job:ps/task:<shard>: the error names the task
    (the client's channel to the shard), where 'ps task 1' read like /job:ps/task:1."""
    vs = VariableSet(replica_device_setter(cluster=ClusterSpec({"ps": ["a:1", "b:1"]})))
    vs.get_variable("w", (4,))
    vs.get_variable("b", (1,))
    planner = Planner(list(vs.placements()), client_name="/job:worker/task:0")
    plan = planner.pull({"w": None, "b": None})
    assert sorted(plan.per_task) == [0, 1]
    replies = {0: p.PullReply(1, {"w/part_0": np.zeros(4, np.float32)}), 1: p.PullReply(None, {})}
    tasks = {0: "/job:ps/task:0", 1: "/job:ps_backup/task:1"}
    with pytest.raises(ClientError, match=r"^/job:worker/task:0: variable 'b': the reply of /job:ps_backup/task:1 "
                                          r"\(ps shard 1\) holds no rows of its partition 'b/part_0'$"):
        planner.assemble(plan, replies, task_name=tasks.__getitem__)
