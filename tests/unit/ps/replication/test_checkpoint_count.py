"""A replicated shard's ``pushes_applied`` travels with its checkpoints (issue 28), in process: SaveShard reads
it with the snapshot (no push applied in between), the manifest keeps it per shard, and a restore within the
run (after BeginRestore) sets the shard's count back to it, on the primary and its backups; so after every
replica of a shard was lost, ``updates_lost`` is exactly the acknowledged pushes the checkpoint lacks. A fresh
cluster's first load (a new run resuming) starts at 0, as the workers' own counts do; an old checkpoint
without the count loads as before; an unreplicated task writes no count."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, Link, assert_same_state, backup, layout
from safetensors.numpy import load

from psflow.checkpoint.manifest import MANIFEST_NAME, read_manifest
from psflow.checkpoint.restore import restore
from psflow.checkpoint.save import CheckpointManager
from psflow.cluster import ClusterSpec
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import (
    BeginRestoreRequest,
    PushRequest,
    RegisterRequest,
    SaveShardReply,
    SaveShardRequest,
    SetReadyRequest,
    StepTag,
    WorkerTag,
)
from psflow.ps.service import ParameterService
from psflow.ps.sync import SyncConfig
from psflow.rpc.framing import Frame
from psflow.rpc.inprocess import InProcessChannel
from psflow.status.replication import replication_view

pytestmark = pytest.mark.timeout(60)

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1"]})


def _push(i: int, acked: int) -> PushRequest:
    rng = np.random.default_rng(i)
    rows = np.array(sorted(rng.choice(20, 5, replace=False)), np.int64)
    return PushRequest([("w/part_0", rng.normal(size=(5, 4)).astype(np.float32), rows),
                        ("b/part_0", rng.normal(size=4).astype(np.float32), None)],
                       WorkerTag(WORKERS[0], 1, push_id=i, acked=acked), step=True, examples=8)


def _started(make_shard: Callable[..., InProcessShard]) -> tuple[InProcessShard, ParameterClient]:
    """A fresh replicated shard (one backup) and a chief's client on its primary, the variables registered."""
    shard = make_shard()
    shard.start()
    shard.wait_view()
    request = layout(SyncConfig())
    client = ParameterClient(CLUSTER, request.layout, client_name=WORKERS[0], channels={0: Link(shard, PRIMARY)})
    client.register(request.optimizer, chief=True)
    return shard, client


def _counts(shard: InProcessShard, member: str) -> tuple[int, int]:
    stats = shard.replicas[member].stats()
    return stats["pushes_applied"], stats["pushes_acknowledged"]


def _restore_within_run(shard: InProcessShard, client: ParameterClient, path: str) -> None:
    """What a worker's ClusterRecovery sends: BeginRestore, the checkpoint, SetReady at the new generation."""
    client.call(0, BeginRestoreRequest(7))
    manifest = restore(client, path)
    client.call(0, SetReadyRequest(client.client_name, 7, manifest.global_step))


def test_a_restore_within_the_run_sets_the_count_back_to_the_checkpoints(
        make_shard: Callable[..., InProcessShard], tmp_path: Path) -> None:
    shard, client = _started(make_shard)
    for i in range(1, 6):
        shard.push(PRIMARY, _push(i, acked=i - 1))
    path = CheckpointManager(str(tmp_path)).save(client).path
    assert read_manifest(path).shards[0]["pushes_applied"] == 5
    for i in range(6, 9):  # acknowledged after the checkpoint: lost with every replica of the shard
        shard.push(PRIMARY, _push(i, acked=i - 1))
    shard.leave(PRIMARY, WORKERS[0], 8)
    assert _counts(shard, PRIMARY) == (8, 8)

    _restore_within_run(shard, client, path)
    assert _counts(shard, PRIMARY) == (5, 8)  # updates_lost 3: the pushes acknowledged after the checkpoint
    shard.wait(lambda: _counts(shard, backup(0)) == (5, 8), "the backup holds the restored count")


def _push_of(worker: int, i: int, acked: int) -> PushRequest:
    request = _push(i, acked)
    return dataclasses.replace(request, worker=WorkerTag(WORKERS[worker], 1, push_id=i, acked=acked))


def test_the_loss_is_counted_per_process_so_an_unacknowledged_push_hides_no_other_loss(
        make_shard: Callable[..., InProcessShard], tmp_path: Path) -> None:
    shard, client = _started(make_shard)
    shard.push(PRIMARY, _push_of(0, 1, acked=0))
    shard.push(PRIMARY, _push_of(0, 2, acked=1))  # worker 0 never hears back: its count stays at 1
    shard.push(PRIMARY, _push_of(1, 1, acked=0))
    path = CheckpointManager(str(tmp_path)).save(client).path
    record = read_manifest(path).shards[0]
    assert record["pushes_applied"] == 3
    assert sorted(map(tuple, record["pushes_applied_by"])) == [(WORKERS[0], 1, 2), (WORKERS[1], 1, 1)]
    shard.push(PRIMARY, _push_of(1, 2, acked=1))  # acknowledged after the checkpoint: worker 1's lost push
    _restore_within_run(shard, client, path)
    shard.leave(PRIMARY, WORKERS[0], 1, incarnation=1)
    shard.leave(PRIMARY, WORKERS[1], 2, incarnation=1)
    stats = shard.replicas[PRIMARY].stats()
    view = replication_view([{"task": PRIMARY, "replication": stats}])
    assert view is not None
    # The totals alike (3 held, 3 acknowledged) would say nothing was lost: worker 0's applied and unanswered
    # push would hide worker 1's lost one.
    assert (view["pushes_applied"], view["pushes_acknowledged"], view["updates_lost"]) == (3, 3, 1)
    shard.wait(lambda: shard.replicas[backup(0)].stats()["applied_by_process"] == stats["applied_by_process"],
               "the backup holds the restored per-process counts")


def test_a_damaged_per_process_count_is_named_and_the_loss_counted_from_the_totals(
        make_shard: Callable[..., InProcessShard], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    shard, client = _started(make_shard)
    shard.push(PRIMARY, _push_of(0, 1, acked=0))
    shard.push(PRIMARY, _push_of(1, 1, acked=0))
    path = CheckpointManager(str(tmp_path)).save(client).path
    manifest_file = Path(path) / MANIFEST_NAME
    data = json.loads(manifest_file.read_text())
    data["shards"][0]["pushes_applied_by"] = [["/job:worker/task:0", 1, -3]]  # not a count
    manifest_file.write_text(json.dumps(data))
    shard.push(PRIMARY, _push_of(1, 2, acked=1))
    with caplog.at_level("WARNING", logger="psflow.checkpoint.restore"):
        _restore_within_run(shard, client, path)
    assert f"checkpoint {path}, shard 0: 'pushes_applied_by'" in caplog.text, caplog.text
    shard.leave(PRIMARY, WORKERS[0], 1, incarnation=1)
    shard.leave(PRIMARY, WORKERS[1], 2, incarnation=1)
    stats = shard.replicas[PRIMARY].stats()
    assert stats["counts_exact"] is False
    view = replication_view([{"task": PRIMARY, "replication": stats}])
    assert view is not None and (view["pushes_applied"], view["pushes_acknowledged"], view["updates_lost"]) == (2, 3, 1)


def _save(call: Callable[[str, Frame], Frame]) -> SaveShardReply:
    return SaveShardReply.from_frame(call(SaveShardRequest.METHOD, SaveShardRequest(None, 0, 1).to_frame()))


def test_the_count_is_read_with_the_snapshot_while_pushes_go_on(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard, _ = _started(make_shard)
    stop, pushed = threading.Event(), [0]

    def pushing() -> None:
        while not stop.is_set() and pushed[0] < 20000:
            pushed[0] += 1
            shard.push(PRIMARY, _push(pushed[0], acked=pushed[0] - 1))
    thread = threading.Thread(target=pushing, daemon=True)
    thread.start()
    try:
        saves: dict[int, SaveShardReply] = {}
        deadline = time.monotonic() + 40  # a bound for a stuck run only: the loop ends on the count of saves
        while len(saves) < 30 and time.monotonic() < deadline and thread.is_alive():
            reply = _save(lambda method, frame: shard.call(PRIMARY, method, frame))
            assert reply.pushes_applied is not None
            saves[reply.pushes_applied] = reply
            time.sleep(0.001)  # the pushing thread gets the interpreter
    finally:
        stop.set()
        thread.join(30)
    assert len(saves) >= 2, sorted(saves)  # the saves fell between pushes (how many depends on the machine)
    # Each snapshot is bit-equal to an unreplicated task's after exactly the pushes its count says.
    reference = ParameterService(0, holds_global_step=True)
    channel = InProcessChannel(PRIMARY, reference.handlers())
    channel.call(RegisterRequest.METHOD, layout(SyncConfig()).to_frame().meta)
    for i in range(1, max(saves) + 1):
        frame = _push(i, acked=i - 1).to_frame()
        channel.call(PushRequest.METHOD, frame.meta, frame.arrays)
        if i in saves:
            want = _save(lambda method, frame: channel.call(method, frame.meta, frame.arrays))
            got = saves[i]
            assert (got.global_step, got.examples) == (i, want.examples), i
            assert got.data is not None and want.data is not None
            got_tensors, want_tensors = load(got.data.tobytes()), load(want.data.tobytes())
            assert sorted(got_tensors) == sorted(want_tensors)
            for name, value in want_tensors.items():
                assert got_tensors[name].tobytes() == value.tobytes(), (i, name)


def test_a_fresh_clusters_first_load_starts_the_count_at_zero(
        make_shard: Callable[..., InProcessShard], tmp_path: Path) -> None:
    shard, client = _started(make_shard)
    for i in range(1, 4):
        shard.push(PRIMARY, _push(i, acked=i - 1))
    path = CheckpointManager(str(tmp_path)).save(client).path
    fresh, resumed = _started(make_shard)  # a new run resuming the checkpoint: its workers count from 0
    restore(resumed, path)
    assert _counts(fresh, PRIMARY) == (0, 0)


def test_a_checkpoint_without_the_count_loads_as_before(
        make_shard: Callable[..., InProcessShard], tmp_path: Path) -> None:
    shard, client = _started(make_shard)
    for i in range(1, 4):
        shard.push(PRIMARY, _push(i, acked=i - 1))
    path = CheckpointManager(str(tmp_path)).save(client).path
    manifest_file = Path(path) / MANIFEST_NAME
    data = json.loads(manifest_file.read_text())
    for record in data["shards"]:  # as a psflow from before the count wrote it
        del record["pushes_applied"]
    manifest_file.write_text(json.dumps(data))
    shard.push(PRIMARY, _push(4, acked=3))
    _restore_within_run(shard, client, path)
    assert _counts(shard, PRIMARY) == (4, 3)


def test_an_unreplicated_task_writes_no_count(tmp_path: Path) -> None:
    service = ParameterService(0, holds_global_step=True)
    request = layout(SyncConfig())
    client = ParameterClient(CLUSTER, request.layout, client_name=WORKERS[0],
                             channels={0: InProcessChannel("/job:ps/task:0", service.handlers())})
    client.register(request.optimizer, chief=True)
    client.call(0, _push(1, acked=0))
    frame = InProcessChannel("/job:ps/task:0", service.handlers()).call(
        SaveShardRequest.METHOD, SaveShardRequest(None, 0, 1).to_frame().meta)
    assert "pushes_applied" not in frame.meta and SaveShardReply.from_frame(frame).pushes_applied is None
    path = CheckpointManager(str(tmp_path)).save(client).path
    assert all("pushes_applied" not in record for record in read_manifest(path).shards)


def test_a_sync_shards_save_counts_the_pushes_of_the_steps_it_holds(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = make_shard()
    shard.start()
    shard.wait_view()
    shard.register(layout(SyncConfig("sync", 2, 2, timeout=20.0)))

    def push(worker: str) -> None:
        request = _push(1, acked=0)
        shard.push(PRIMARY, PushRequest(request.grads, WorkerTag(worker, 1, push_id=1, acked=0),
                                        StepTag(read_step=0, sync_tag=0), step=True, examples=8))
    threads = [threading.Thread(target=push, args=(w,)) for w in WORKERS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    reply = _save(lambda method, frame: shard.call(PRIMARY, method, frame))  # under the step's lock
    assert (reply.global_step, reply.pushes_applied, reply.examples) == (1, 2, 16)


def test_an_ssp_push_waiting_for_the_slowest_worker_is_in_the_count_of_a_save_that_holds_it(
        make_shard: Callable[..., InProcessShard]) -> None:
    """ssp, staleness 0: worker 0's push is applied and waits in the push for worker 1; a save meanwhile holds
    its rows and step, and counts it (it used to be recorded, and counted, only after its wait)."""
    shard = make_shard()
    shard.start()
    shard.wait_view()
    shard.register(layout(SyncConfig(mode="ssp", total_num_replicas=2, staleness=0, timeout=20.0)))
    staleness = shard.services[PRIMARY].mode.staleness
    assert staleness is not None

    def push(worker: str) -> None:
        request = _push(1, acked=0)
        shard.push(PRIMARY, PushRequest(request.grads, WorkerTag(worker, 1, push_id=1, acked=0),
                                        StepTag(read_step=0, clock=1), step=True, examples=8))
    waiting = threading.Thread(target=push, args=(WORKERS[0],), daemon=True)
    waiting.start()
    shard.wait(lambda: staleness.stats()["ssp_clocks"][WORKERS[0]] == 1, "worker 0's push waiting for worker 1")
    reply = _save(lambda method, frame: shard.call(PRIMARY, method, frame))
    assert (reply.global_step, reply.pushes_applied, reply.examples) == (1, 1, 8)
    push(WORKERS[1])
    waiting.join(10)
    assert not waiting.is_alive()


def test_a_checkpoint_load_waits_for_a_slow_backup_as_long_as_its_caller_does(
        make_shard: Callable[..., InProcessShard], tmp_path: Path) -> None:
    """A restore's ``LoadShard`` is replicated as a full entry (the whole shard; ~520 MB for W&D, in chunks), which a
    backup may take longer to receive and write than ``replica_timeout``. The primary waits for its
    acknowledgement as long as the caller waits for the reply (the call's own deadline, sent with it), not
    ``replica_timeout`` (it used to fail UNAVAILABLE after 5 s, failing the restore while the backup caught up)."""
    shard = make_shard(replica_timeout=0.5, chunk_bytes=160)  # the full entry in 5 calls
    shard.start()
    shard.wait_view()
    request = layout(SyncConfig())
    client = ParameterClient(CLUSTER, request.layout, client_name=WORKERS[0], channels={0: Link(shard, PRIMARY)})
    client.register(request.optimizer, chief=True)
    for i in range(1, 4):
        shard.push(PRIMARY, _push(i, acked=i - 1))
    path = CheckpointManager(str(tmp_path)).save(client).path
    shard.push(PRIMARY, _push(4, acked=3))  # the checkpoint lacks it: the load changes the shard
    calls = shard.calls.get(backup(0), 0)
    shard.latency[backup(0)] = 0.2  # each Replicate call to the backup; together well past replica_timeout
    began = time.monotonic()
    restore(client, path)
    took = time.monotonic() - began
    shard.latency.clear()
    assert shard.calls[backup(0)] - calls >= 4 and took >= 0.8, (shard.calls[backup(0)] - calls, took)
    global_step = shard.services[PRIMARY].global_step
    assert global_step is not None and global_step.value == 3
    assert_same_state(shard.services[PRIMARY], shard.services[backup(0)])
