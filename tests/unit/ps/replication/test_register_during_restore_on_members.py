"""A replicated shard primary's chief ``Register`` that creates the variables while a restore begins: the restore
waits for the creation and its load lands on the new partitions, on the primary and on its backup, and nothing
deadlocks (psflow/ps/replication/register_call.py takes the restore mutex, RestoreGate.creating, before the lock
that orders the entries; the service's Register inside holds on to it). Sync mode: a sync step records its entry
holding the step's lock, which SetReady and a load take under the mutex. In-process members (tests/replica_shard.py).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from replica_shard import PRIMARY, InProcessShard, assert_same_state, backup, layout

from psflow.ps.protocol import BeginRestoreRequest, LoadShardRequest, SetReadyRequest, StatsReply
from psflow.ps.shard_snapshot import saved_slots
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import RpcError
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(60)


def _checkpoint(shard: InProcessShard, generation: int) -> LoadShardRequest:
    """A load of global_step 40 whose values are all 4.0 and slots all 0.5, for the primary's partitions."""
    parts = list(shard.services[PRIMARY].store.partitions())
    values = {p.key: np.full(p.value.shape, 4.0, p.value.dtype) for p in parts}
    slots = {p.key: {name: np.full(a.shape, 0.5, a.dtype) for name, a in saved_slots(p).items()} for p in parts}
    return LoadShardRequest.build(values, slots, {}, [p.key for p in parts], global_step=40, lineage="lineage-40",
                                  restored_step=40, restored_from="/ckpt/ckpt-000000040", restored_from_step=40,
                                  generation=generation)


def test_a_restore_beginning_while_a_chief_register_creates_loads_onto_its_partitions_on_every_member(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    chief = dataclasses.replace(layout(SyncConfig(mode="sync")), defer_ready=True)
    shard.register(chief)  # the first chief registered, then died before its SetReady
    service = shard.services[PRIMARY]
    inside, go = threading.Event(), threading.Event()
    variables, gate = service.variables, service.gate
    real_create, real_close = variables._create, gate.close

    def create(*args: Any) -> Any:  # the restarted chief's Register, past its ask of the gate
        variables._create = real_create  # type: ignore[method-assign]
        inside.set()
        assert go.wait(30)
        return real_create(*args)

    def close(generation: int) -> None:  # the lease holder's BeginRestore arrives: the creation goes on
        gate.close = real_close  # type: ignore[method-assign]
        go.set()
        real_close(generation)

    variables._create = create  # type: ignore[method-assign]
    gate.close = close  # type: ignore[method-assign]
    outcomes: list[Any] = []

    def registering() -> None:
        try:
            shard.register(chief)
            outcomes.append("registered")
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcomes.append(e)

    thread = threading.Thread(target=registering, daemon=True)
    thread.start()
    assert inside.wait(30)
    shard.call(PRIMARY, BeginRestoreRequest.METHOD, BeginRestoreRequest(9).to_frame())
    thread.join(30)
    assert outcomes == ["registered"], outcomes
    shard.call(PRIMARY, LoadShardRequest.METHOD, _checkpoint(shard, 9).to_frame())
    shard.call(PRIMARY, SetReadyRequest.METHOD, SetReadyRequest("the lease holder", 9, 40).to_frame())
    for member in (PRIMARY, backup(0)):
        stats = StatsReply.from_frame(shard.call(member, "Stats", Frame({})))
        assert (stats.ready, stats.generation, stats.global_step, stats.restored_from_step) == (True, 9, 40, 40)
        for part in shard.services[member].store.partitions():
            assert np.all(part.value == 4.0), (member, part.key)
    assert_same_state(service, shard.services[backup(0)])


def test_a_deposed_primary_s_load_checked_before_it_rebuilt_from_the_new_primary_changes_nothing_there(
        make_shard: Callable[..., InProcessShard]) -> None:
    """The primary checks a restore's load when another member is promoted over it and it rebuilds from that one
    (a snapshot: its partitions created anew): the load is refused there, and the rebuilt member holds the new
    primary's state, not the load's global_step, lineage or restore record beside it."""
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    shard.register(dataclasses.replace(layout(SyncConfig()), defer_ready=True))
    shard.call(PRIMARY, BeginRestoreRequest.METHOD, BeginRestoreRequest(9).to_frame())
    old, new = shard.services[PRIMARY], shard.services[backup(0)]
    store = old.variables.partitions
    real = store.get
    load = _checkpoint(shard, 9)

    def get(key: str) -> Any:  # the load checks its arrays: the backup is promoted, this one rebuilds from it
        store.get = real  # type: ignore[method-assign]
        shard.cut.add(PRIMARY)
        assert shard.promote(backup(0), 1).epoch == 2
        shard.cut.discard(PRIMARY)
        shard.replicas[PRIMARY]._deposed(backup(0), 2)  # as its refused entries tell it (_on_refused)
        shard.wait_view(backup(0), (PRIMARY,))
        return real(key)

    store.get = get  # type: ignore[method-assign]
    with pytest.raises(RpcError):
        shard.call(PRIMARY, LoadShardRequest.METHOD, load.to_frame())
    assert old.variables.partitions is not store  # rebuilt from the new primary meanwhile
    assert_same_state(new, old)
    assert (old.saves.lineage, old.gate.restored_from()) == (new.saves.lineage, new.gate.restored_from())
    assert old.global_step is not None and old.global_step.value == 0
