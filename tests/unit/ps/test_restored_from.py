"""A ps task's ``Stats`` names the checkpoint its restore of the task's generation loaded and that checkpoint's
global_step (psflow/ps/restore_gate.py, LoadShard in psflow/ps/checkpointing.py).

The chief's summaries write a SessionLog START at the restored checkpoint's step after a restore within the run, and
the launcher's ``restore_loss`` names it (``checkpoint_step``). Neither could read it from the cluster: the summaries
took the newest checkpoint in the directory (past the restored one once any holder saved since: the START then
dropped none of the discarded model's points), and a between-graph run's ``restore_loss`` said null. The restore's
``LoadShard`` now carries the checkpoint and its step to every task, which keeps them with its generation.
In-process services, no sockets.
"""

from __future__ import annotations

import threading

import pytest
from two_ps_in_process import SGD, two_ps_cluster

from psflow.ps.client import ParameterClient
from psflow.ps.protocol import (
    BeginRestoreRequest,
    LoadShardRequest,
    Request,
    SetReadyRequest,
    StatsReply,
    restore_record,
)
from psflow.ps.service import ParameterService
from psflow.rpc.framing import Frame
from psflow.train.generation_restore import register_as_chief

pytestmark = pytest.mark.timeout(60)


def _load(step: int, checkpoint: str, generation: int | None, **fields: object) -> LoadShardRequest:
    return LoadShardRequest([], restored_step=step, restored_from=checkpoint, restored_from_step=step,
                            generation=generation, **fields)  # type: ignore[arg-type]


def test_stats_names_the_checkpoint_the_restore_of_the_task_s_generation_loaded() -> None:
    client, _ = two_ps_cluster()
    for task in (0, 1):
        assert (client.ps_stats(task).restored_from, client.ps_stats(task).restored_from_step) == (None, None)
    register_as_chief(client, SGD, None)  # created, not ready: the chief restores first
    for task in (0, 1):  # a restore at start: generation 0, no BeginRestore
        client.call(task, _load(40, "/ckpt/ckpt-000000040", 0))
        client.call(task, SetReadyRequest("the chief"))
    assert [(s.generation, s.ready, s.restored_from, s.restored_from_step) for s in map(client.ps_stats, (0, 1))] == [
        (0, True, "/ckpt/ckpt-000000040", 40)] * 2
    for task in (0, 1):
        client.call(task, BeginRestoreRequest(7))
    # the restore of generation 7 has loaded nothing yet: the older restore is not this generation's
    assert [(s.generation, s.restored_from_step) for s in map(client.ps_stats, (0, 1))] == [(7, None)] * 2
    for task in (0, 1):
        client.call(task, _load(30, "/ckpt/ckpt-000000030", 7))
        client.call(task, SetReadyRequest("the chief", 7, 55))
    stats = client.ps_stats(0)
    assert (stats.generation, stats.ready, stats.restored_from, stats.restored_from_step) == (
        7, True, "/ckpt/ckpt-000000030", 30)
    assert restore_record(stats.as_dict()) == ("/ckpt/ckpt-000000030", 30)


def test_a_warm_start_is_not_a_restore() -> None:
    client, _ = two_ps_cluster()
    register_as_chief(client, SGD, None)
    client.call(1, LoadShardRequest([], values_only=True, restored_from="/other/ckpt-000000900",
                                    restored_from_step=900, generation=0))
    assert client.ps_stats(1).restored_from_step is None


def test_the_fields_cross_the_wire_and_an_older_reply_lacks_them() -> None:
    load = _load(30, "s3://bucket/run/ckpt-000000030", 7)
    back = LoadShardRequest.from_frame(Frame(dict(load.to_frame().meta)))
    assert (back.restored_from, back.restored_from_step) == ("s3://bucket/run/ckpt-000000030", 30)
    stats = StatsReply("/job:ps/task:0", 40, 32, generation=7, restored_from="/ckpt/ckpt-000000030",
                       restored_from_step=30)
    assert StatsReply.from_frame(stats.to_frame()) == stats
    older = {k: v for k, v in stats.as_dict().items() if not k.startswith("restored_from")}  # an older ps task's
    parsed = StatsReply.from_frame(Frame(older))
    assert (parsed.restored_from, parsed.restored_from_step, parsed.generation) == (None, None, 7)
    assert restore_record(older) is None and restore_record({}) is None
    assert "restored_from" not in parsed.counters


@pytest.mark.parametrize("meta, field", [
    ({"parts": [], "restored_from": 3}, "'restored_from' must be a string"),
    ({"parts": [], "restored_from_step": -1}, "'restored_from_step' must be a non-negative integer"),
])
def test_a_malformed_field_is_refused_naming_it(meta: dict[str, object], field: str) -> None:
    from psflow.rpc.api import InvalidRequest
    with pytest.raises(InvalidRequest, match=field):
        LoadShardRequest.from_frame(Frame(meta))


def _during_the_load(client: ParameterClient, service: ParameterService, *requests: Request) -> threading.Thread:
    """The next LoadShard on ``service`` (ps task 1), as it changes the task, has ``requests`` (a BeginRestore
    first) sent to it by another thread, and ends once that BeginRestore is in (it waits for the load:
    RestoreGate.loading). Returns the thread (join it)."""
    averages, gate = service.variables.averages, service.gate
    real, real_close, closing = averages.restored, gate.close, threading.Event()

    def close(generation: int) -> None:
        closing.set()
        real_close(generation)

    gate.close = close  # type: ignore[method-assign]

    def send() -> None:
        for request in requests:
            client.call(1, request)

    thread = threading.Thread(target=send, daemon=True)

    def begun_meanwhile(step: int | None) -> None:
        averages.restored = real  # type: ignore[method-assign]
        thread.start()
        assert closing.wait(30)
        real(step)

    averages.restored = begun_meanwhile  # type: ignore[method-assign]
    return thread


def test_a_restore_begun_during_an_older_load_is_not_named_by_that_load() -> None:
    """A deposed restorer's LoadShard of generation 7 passes the fence, then BeginRestore 9 (the next restorer's)
    comes while it loads: the record kept with the task's generation named generation 9's restore as the
    checkpoint of generation 7's, before any of 9's loads came. The record is the load's own generation's (and
    the BeginRestore now waits for the load's changes: test_stale_load_fence.py): 9 names none until its own
    load."""
    client, services = two_ps_cluster()
    register_as_chief(client, SGD, None)
    for task in (0, 1):
        client.call(task, BeginRestoreRequest(7))
    thread = _during_the_load(client, services[1], BeginRestoreRequest(9))
    client.call(1, _load(30, "/ckpt/ckpt-000000030", 7))
    thread.join(30)
    stats = client.ps_stats(1)
    assert (stats.generation, stats.restored_from, stats.restored_from_step) == (9, None, None)


def test_an_older_load_ending_after_the_next_restore_s_load_leaves_that_restore_named() -> None:
    """A deposed restorer's LoadShard of generation 7 passes the fence; BeginRestore 9 and generation 9's whole load
    come before it ends. Its end recorded generation 7's checkpoint over generation 9's, so Stats named no restore
    at generation 9 (a record of another generation is never shown) although 9's load came. Now BeginRestore 9
    waits for the load of 7 to end (test_stale_load_fence.py), then 9's load comes: 9's is named."""
    client, services = two_ps_cluster()
    register_as_chief(client, SGD, None)
    client.call(1, BeginRestoreRequest(7))
    thread = _during_the_load(client, services[1], BeginRestoreRequest(9), _load(40, "/ckpt/ckpt-000000040", 9))
    client.call(1, _load(30, "/ckpt/ckpt-000000030", 7))
    thread.join(30)
    stats = client.ps_stats(1)
    assert (stats.generation, stats.restored_from, stats.restored_from_step) == (9, "/ckpt/ckpt-000000040", 40)
