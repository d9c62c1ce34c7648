"""Replicated shards without sockets: what a primary captures, a backup writes bit for bit; the in-order
applier, the dedup table and the view's epoch rules (psflow/ps/replication/)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from replica_shard import assert_same_state

from psflow.cluster import ClusterSpec
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, fixed_size_partitioner, replica_device_setter
from psflow.ps.protocol import (
    PartDelta,
    PullRequest,
    PushRequest,
    RegisterRequest,
    ReplicaEntry,
    ReplicateRequest,
    WorkerTag,
)
from psflow.ps.replication.applier import InOrderApplier
from psflow.ps.replication.dedup import DedupTable
from psflow.ps.replication.deltas import capture, capture_averages, write
from psflow.ps.replication.snapshot import full_entry, task_state, write_entry
from psflow.ps.replication.view import BACKUP, PRIMARY, View, ViewState
from psflow.ps.service import ParameterService
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import InvalidRequest, PreconditionFailed
from psflow.rpc.framing import decode, encode

pytestmark = pytest.mark.timeout(60)

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1"]})
ADAGRAD = OptimizerSpec("adagrad", {"learning_rate": 0.1})
WORKER = "/job:worker/task:0"


def _service() -> ParameterService:
    vs = VariableSet(replica_device_setter(cluster=CLUSTER))
    vs.get_variable("w", (8, 3), partitioner=fixed_size_partitioner(2), moving_average_decay=0.9,
                    initializer={"name": "random_normal", "stddev": 0.1, "seed": 3})
    vs.get_variable("b", (3,))
    vs.get_variable("emb", (0, 2), dynamic={"policy": "lru"}, initializer={"name": "constant", "value": 0.5})
    svc = ParameterService(0, holds_global_step=True)
    svc.register(RegisterRequest(tuple(vs.placements()), ADAGRAD, SyncConfig(), WORKER, chief=True).to_frame())
    return svc


def _push(svc: ParameterService, seed: int) -> PushRequest:
    rng = np.random.default_rng(seed)
    rows = np.array(sorted(rng.choice(4, 2, replace=False)), np.int64)
    ids = np.array([seed % 5, 7 + seed % 3], np.int64)
    svc.pull(PullRequest([("emb/part_0", ids)], create=True).to_frame())
    request = PushRequest([("w/part_0", rng.normal(size=(2, 3)).astype(np.float32), rows),
                           ("b/part_0", rng.normal(size=3).astype(np.float32), None),
                           ("emb/part_0", rng.normal(size=(2, 2)).astype(np.float32), ids)],
                          WorkerTag(WORKER, 1, push_id=seed), step=True, examples=4)
    svc.push(request.to_frame())
    return request


def test_a_full_snapshot_then_row_deltas_leave_the_backup_bit_equal() -> None:
    primary, backup = _service(), ParameterService(0, holds_global_step=True)
    dedup, counts = DedupTable("p"), {"pushes_applied": 0}
    write_entry(backup, DedupTable("b"), {}, full_entry(0, primary, dedup, counts))
    assert_same_state(primary, backup)
    for seq in range(1, 21):
        request = _push(primary, seq)
        store = primary.store
        parts = [capture(store.get(key), rows, averages=False) for key, _, rows in request.grads]
        entry = ReplicaEntry(seq, task_state(primary, dedup, counts), tuple(parts + capture_averages(store, set())))
        write_entry(backup, DedupTable("b"), {}, entry)
    assert primary.global_step is not None and primary.global_step.value == 20
    assert_same_state(primary, backup)


def test_row_deltas_through_the_wire_leave_the_backup_bit_equal() -> None:
    """The stacked arrays of a row capture (``pack/value|slot/...``) framed, decoded and written."""
    primary, backup = _service(), ParameterService(0, holds_global_step=True)
    dedup, counts = DedupTable("p"), {"pushes_applied": 0}
    write_entry(backup, DedupTable("b"), {}, full_entry(0, primary, dedup, counts))
    for seq in range(1, 6):
        request = _push(primary, seq)
        store = primary.store
        parts = [capture(store.get(key), rows, averages=False) for key, _, rows in request.grads]
        entry = ReplicaEntry(seq, task_state(primary, dedup, counts), tuple(parts + capture_averages(store, set())))
        frame = ReplicateRequest(1, "p", "b", ("b",), (entry,)).to_frame()
        (received,) = ReplicateRequest.from_frame(decode(encode(frame.meta, frame.arrays))).entries
        assert any(name.startswith("pack/") for delta in received.parts for name in delta.arrays)
        write_entry(backup, DedupTable("b"), {}, received)
    assert_same_state(primary, backup)


def test_only_the_rows_a_push_wrote_are_copied() -> None:
    primary = _service()
    request = _push(primary, 1)
    part = primary.store.get("w/part_0")
    delta = capture(part, request.grads[0][2], averages=False)
    assert delta.rows is not None and delta.rows.tolist() == request.grads[0][2].tolist()  # type: ignore[union-attr]
    # value and slots share dtype and row shape: one array of their rows, stacked (not one array each)
    names = ["value", *(f"slot/{name}" for name in part.slots)]
    assert list(delta.arrays) == ["pack/" + "|".join(names)] and part.slots
    stacked = delta.arrays["pack/" + "|".join(names)]
    assert stacked.shape == (len(names), 2, 3)
    assert stacked[0].tobytes() == part.value[delta.rows].tobytes()
    for i, name in enumerate(part.slots, 1):
        assert stacked[i].tobytes() == part.slots[name][delta.rows].tobytes(), name
    with_average = capture(part, request.grads[0][2])
    assert list(with_average.arrays) == ["pack/" + "|".join([*names, "average"])]


def test_a_stacked_array_that_does_not_fit_its_names_or_comes_without_rows_is_refused() -> None:
    primary, backup = _service(), _service()
    request = _push(primary, 1)
    delta = capture(primary.store.get("w/part_0"), request.grads[0][2], averages=False)
    (name, stacked), = delta.arrays.items()
    before = backup.store.get("w/part_0").value.copy()
    for bad in (PartDelta(delta.key, delta.rows, {name: stacked[:1]}),       # one array for two names
                PartDelta(delta.key, None, {name: stacked}),                 # no rows
                PartDelta(delta.key, delta.rows, {name: stacked[:, :1]})):   # one row for two row numbers
        with pytest.raises(InvalidRequest, match="variable 'w' partition 0"):
            write(backup.store, bad)
    assert backup.store.get("w/part_0").value.tobytes() == before.tobytes()
    write(backup.store, delta)
    assert backup.store.get("w/part_0").value[delta.rows].tobytes() == stacked[0].tobytes()


def test_the_applier_buffers_entries_that_arrive_early_and_ignores_old_ones() -> None:
    applied: list[int] = []
    applier = InOrderApplier(lambda e: applied.append(e.seq))
    assert applier.offer([ReplicaEntry(2, {}), ReplicaEntry(3, {})]) == 0  # waiting for a snapshot
    assert applier.offer([ReplicaEntry(1, {}, full=True)]) == 3
    assert applied == [1, 2, 3]
    assert applier.offer([ReplicaEntry(5, {})]) == 3 and applier.buffered == 1
    assert applier.offer([ReplicaEntry(3, {}), ReplicaEntry(4, {})]) == 5
    assert applied == [1, 2, 3, 4, 5]
    applier.expect_snapshot()
    assert applier.offer([ReplicaEntry(9, {}, full=True)]) == 9 and applied[-1] == 9


def test_a_full_entry_newer_than_the_applied_one_replaces_the_state_at_once() -> None:
    """A full entry is the primary's whole state as of its seq: a member that applied a snapshot from a sender
    the primary has since replaced (a call held up across its restart) takes the new sender's later snapshot at
    once, though the entries between the two never come (else it would wait for them for good)."""
    applied: list[int] = []
    applier = InOrderApplier(lambda e: applied.append(e.seq))
    assert applier.offer([ReplicaEntry(4, {}, full=True)]) == 4
    assert applier.offer([ReplicaEntry(11, {}), ReplicaEntry(9, {}, full=True), ReplicaEntry(10, {})]) == 11
    assert applied == [4, 9, 10, 11]
    assert applier.offer([ReplicaEntry(7, {}, full=True)]) == 11 and applied[-1] == 11  # an older one: ignored


def test_dedup_replays_the_same_push_and_refuses_an_older_one() -> None:
    table = DedupTable("/job:ps/task:0")
    assert table.check(WORKER, 1, 5) is None
    table.record(WORKER, 1, 5, {"step": 12}, seq=40)
    recorded = table.check(WORKER, 1, 5)
    assert recorded is not None and recorded.reply == {"step": 12} and recorded.seq == 40
    with pytest.raises(PreconditionFailed, match="push 4 of /job:worker/task:0 .* older than push 5"):
        table.check(WORKER, 1, 4)
    assert table.check(WORKER, 2, 1) is None  # another process of the worker
    assert table.check(WORKER, 1, None) is None  # an unreplicated client is never checked
    copy = DedupTable("b")
    copy.load(table.export())
    assert copy.export() == table.export()


def test_promote_is_a_compare_and_set_and_an_older_epoch_is_refused_as_deposed() -> None:
    members = ("/job:ps/task:0", "/job:ps_backup/task:0", "/job:ps_backup/task:1")
    state = ViewState(members[1], 0, members)
    state.set(View(3, members[0], members[1:], BACKUP))
    with pytest.raises(PreconditionFailed, match="backup at epoch 3"):
        state.promote(2, has_state=True)
    with pytest.raises(PreconditionFailed, match="holds no state"):
        state.promote(3, has_state=False)
    view, changed = state.promote(3, has_state=True)
    assert changed and view == View(4, members[1], (members[2],), PRIMARY)
    assert state.promote(3, has_state=True) == (view, False)  # idempotent
    with pytest.raises(PreconditionFailed, match="deposed: shard 0's primary is /job:ps_backup/task:0 at epoch 4"):
        state.check_entries(3, members[0])
    with pytest.raises(PreconditionFailed, match="cannot drop"):
        state.drop_backup(3, members[2])
    dropped, changed = state.drop_backup(4, members[2])
    assert changed and dropped.epoch == 5 and dropped.backups == ()
    # a member no backup of the view (joining, at that epoch) is not dropped: its Join's sender goes on
    assert state.drop_backup(5, members[0]) == (dropped, False)
    # nor one that entered the backups after the view its drop was checked against (it caught up meanwhile)
    joined = state.set(replace(dropped, backups=(members[0],)))
    assert state.drop_backup(5, members[0], checked=dropped) == (joined, False)
    assert state.drop_backup(5, members[0], checked=joined)[0].backups == ()
