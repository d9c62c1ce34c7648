"""A backup writes the entries it acknowledged together, coalesced (issue 28's cost per push: of rows written by
several entries only the newest version, a whole array once; psflow/ps/replication/deltas.py's coalesce,
snapshot.py's write_entries): it must end bit-equal to a backup that wrote every entry alone, in order --
value, slots, lazy rows' marks, global_step, reader positions, dedup records, counts, dynamic-table rows --
with rows that overlap and rows that do not, dense variables written whole, a promotion while entries wait,
and a write that fails (the member rebuilds)."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, backup

from psflow.cluster import ClusterSpec
from psflow.data.api import ReaderPosition
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.protocol import PartDelta, PullRequest, PushRequest, RegisterRequest, ReplicaEntry, WorkerTag
from psflow.ps.replication.applier import COALESCE
from psflow.ps.replication.deltas import coalesce, write
from psflow.ps.replication.snapshot import task_state
from psflow.ps.store import ParameterStore
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import InvalidRequest

pytestmark = pytest.mark.timeout(60)

COALESCED, ONE_BY_ONE = backup(0), backup(1)  # served as over the TCP carrier; as over gRPC (each at once)
LAZY, TABLE = "emb/part_0", "tab/part_0"


def _layout(optimizer: str) -> RegisterRequest:
    """emb: a lazy partition (1 MiB); w: a small one; b: dense, pushed whole; tab: a dynamic table."""
    vs = VariableSet(replica_device_setter(cluster=ClusterSpec({"ps": ["127.0.0.1:1"]})))
    vs.get_variable("emb", (65536, 4), initializer={"name": "random_normal", "stddev": 0.1, "seed": 3})
    vs.get_variable("w", (20, 4), initializer={"name": "random_normal", "stddev": 0.1, "seed": 1})
    vs.get_variable("b", (4,))
    vs.get_variable("tab", (0, 3), dynamic={"policy": "lru", "capacity_rows": 30, "admit_after": 1},
                    initializer={"name": "random_normal", "stddev": 0.1, "seed": 2})
    return RegisterRequest(tuple(vs.placements()), OptimizerSpec(optimizer, {"learning_rate": 0.05}),
                           SyncConfig(), WORKERS[0], chief=True)


def _push(rng: np.random.Generator, n: int) -> PushRequest:
    """Push ``n`` (1-based) of worker n % 2: hot rows every push repeats, cold ones it does not."""
    worker = n % 2
    emb = np.unique(np.concatenate([rng.integers(0, 8, 5), rng.integers(8, 65536, 6)])).astype(np.int64)
    w = np.unique(rng.integers(0, 20, 3)).astype(np.int64)
    ids = np.unique(rng.integers(-10, 25, 6)).astype(np.int64)
    position = ReaderPosition(epoch=0, file_index=0, path="/data/train-0", offset=n * 100, record_index=n,
                              records_consumed=n, worker_index=worker, num_workers=2).to_json()
    pid = (n + 1) // 2
    return PushRequest([(LAZY, rng.normal(size=(emb.size, 4)).astype(np.float32), emb),
                        ("w/part_0", rng.normal(size=(w.size, 4)).astype(np.float32), w),
                        ("b/part_0", rng.normal(size=4).astype(np.float32), None),
                        (TABLE, rng.normal(size=(ids.size, 3)).astype(np.float32), ids)],
                       WorkerTag(WORKERS[worker], 1 + worker, 0, position, pid, pid - 1, (pid - 1,)),
                       step=True, examples=2)


def _state(shard: InProcessShard, member: str) -> dict[str, object]:
    """What ``member`` holds, as bytes and JSON: every partition's arrays and marks, its table, small state."""
    service, replica = shard.services[member], shard.replicas[member]
    out: dict[str, object] = {"small": json.dumps(task_state(service, replica.dedup, replica.counts), sort_keys=True)}
    for part in service.store.partitions():
        if part.table is not None:
            out[part.key] = {k: (v.dtype.str, v.tobytes()) for k, v in sorted(part.table.snapshot().items())}
            continue
        arrays = {"value": part.value, **{"slot/" + k: v for k, v in part.slots.items()}}
        if part.lazy is not None:  # rows not built hold no defined content yet: compare the built ones
            built = part.lazy.marks.copy()
            out[part.key + "/marks"] = built.tobytes()
            arrays = {k: v[built] if v.ndim else v for k, v in arrays.items()}
        out[part.key] = {k: v.tobytes() for k, v in arrays.items()}
    return out


def _shard(make_shard: Callable[..., InProcessShard], optimizer: str) -> InProcessShard:
    shard = make_shard(backups=2)
    shard.start()
    shard.wait_view()
    shard.register(_layout(optimizer))
    shard.after_reply.add(COALESCED)
    return shard


def _push_and_pull(shard: InProcessShard, rng: np.random.Generator, n: int) -> None:
    push = _push(rng, n)
    ids = next(rows for key, _, rows in push.grads if key == TABLE)
    assert ids is not None
    shard.call(PRIMARY, PullRequest.METHOD, PullRequest([(TABLE, ids)], create=True, step_hint=n).to_frame())
    shard.push(PRIMARY, push)


@pytest.mark.parametrize("optimizer", ["adagrad", "ftrl", "adam"])
def test_entries_written_together_leave_the_backup_as_entries_written_one_by_one(
        make_shard: Callable[..., InProcessShard], optimizer: str) -> None:
    shard = _shard(make_shard, optimizer)
    member = shard.replicas[COALESCED]
    batches: list[int] = []
    write_many = member.applier._apply_many

    def counted(entries: list[ReplicaEntry]) -> None:
        batches.append(len(entries))
        write_many(entries)
    member.applier._apply_many = counted
    rng = np.random.default_rng(7)
    for n in range(1, 3 * COALESCE + 4):  # not a multiple: some wait for the read below
        _push_and_pull(shard, rng, n)
    assert member.applier.received_seq > member.applier.applied_seq  # some not written yet
    assert member.applier.settle(10)  # a read (Stats, SaveShard, Promote) writes them first
    assert batches and max(batches) == COALESCE and min(batches) >= 1, batches
    mine, theirs = _state(shard, COALESCED), _state(shard, ONE_BY_ONE)
    assert mine.keys() == theirs.keys()
    for key in mine:
        assert mine[key] == theirs[key], key
    # the lazy partition stayed lazy (its marks compared too), but under non-lazy Adam, whose push moves every row
    assert (f"{LAZY}/marks" in mine) == (optimizer != "adam")


def test_a_promotion_while_entries_wait_holds_every_acknowledged_push(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = _shard(make_shard, "adagrad")
    rng = np.random.default_rng(8)
    for n in range(1, COALESCE + 4):  # COALESCE written, 3 waiting
        _push_and_pull(shard, rng, n)
    member = shard.replicas[COALESCED]
    assert member.applier.received_seq > member.applier.applied_seq
    want = _state(shard, ONE_BY_ONE)
    shard.cut.add(PRIMARY)
    status = shard.promote(COALESCED, expected_epoch=member.view.view.epoch)
    assert status.role == "primary"
    assert member.applier.received_seq == member.applier.applied_seq
    got = _state(shard, COALESCED)
    for key in want:
        if key != "small":  # the promoted member's small state names it (counts, dedup of its own): not compared
            assert got[key] == want[key], key
    service = shard.services[COALESCED]
    assert service.global_step is not None and service.global_step.value == COALESCE + 3


def _store() -> ParameterStore:
    store = ParameterStore()
    store.create("w", 0, (10, 4), 0, 10, "float32", {"name": "random_normal", "stddev": 1.0, "seed": 5}, None)
    return store


def test_coalesce_keeps_the_newest_version_of_each_row_and_a_whole_write_once() -> None:
    rng = np.random.default_rng(3)
    deltas = [PartDelta("w/part_0", np.array([1, 3, 5], np.int64), {"value": rng.normal(size=(3, 4)).astype(np.float32)}),
              PartDelta("w/part_0", np.array([0, 3, 9], np.int64), {"value": rng.normal(size=(3, 4)).astype(np.float32)}),
              PartDelta("w/part_0", np.array([2, 4], np.int64), {"value": rng.normal(size=(2, 4)).astype(np.float32)}),
              PartDelta("w/part_0", np.array([5, 3], np.int64), {"value": rng.normal(size=(2, 4)).astype(np.float32)})]
    merged = coalesce(deltas)
    assert len(merged) == 1 and merged[0].rows is not None and merged[0].rows.tolist() == [0, 1, 2, 3, 4, 5, 9]
    one, other = _store(), _store()
    for delta in deltas:
        write(one, delta)
    for delta in merged:
        write(other, delta)
    assert one.get("w/part_0").value.tobytes() == other.get("w/part_0").value.tobytes()
    whole = PartDelta("w/part_0", None, {"value": np.ones((10, 4), np.float32)})
    assert coalesce([*deltas, whole, deltas[0]]) == [whole, deltas[0]]


def test_deltas_that_do_not_fit_are_written_as_they_are_and_refused_by_name() -> None:
    good = PartDelta("w/part_0", np.array([1, 2], np.int64), {"value": np.ones((2, 4), np.float32)})
    short = PartDelta("w/part_0", np.array([3, 4], np.int64), {"value": np.ones((1, 4), np.float32)})
    assert coalesce([good, short]) == [good, short]
    store = _store()
    with pytest.raises(InvalidRequest, match="variable 'w' partition 0.*1 rows for 2 row numbers"):
        for delta in coalesce([good, short]):
            write(store, delta)


def test_a_backups_replica_status_reports_every_entry_handed_over_as_applied(
        make_shard: Callable[..., InProcessShard]) -> None:
    # Fewer entries than COALESCE: nothing forces a write. ReplicaStatus (what the launcher, the status page and the
    # tests read to see a rebuilt member caught up) writes them first, without waiting for any other entry.
    shard = _shard(make_shard, "adagrad")
    rng = np.random.default_rng(9)
    for n in range(1, 4):
        _push_and_pull(shard, rng, n)
    member = shard.replicas[COALESCED]
    assert member.applier.received_seq > member.applier.applied_seq  # waiting for the next ones
    assert shard.status(COALESCED).applied_seq == member.applier.received_seq == shard.status(PRIMARY).applied_seq
