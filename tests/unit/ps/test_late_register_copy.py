"""A late copy of a chief's ``Register`` never creates the variables anew over what the chief's restore loaded
(psflow/ps/restore_gate.py RestoreGate.superseded, psflow/ps/variable_store.py, psflow/ps/registration.py
next_attempt).

A chief's ``Register`` whose connection broke after its request was sent is resent (register_tasks asks an
unreachable task again; a replicated client resends to the shard's primary): the first copy, still in the network or
the server's queue, may be served after the resent one created the variables and after the chief's restore at start
loaded them (no ``BeginRestore``: the task is not ready, no restore in progress, as after a chief that died while
initializing). It created them anew from their initializers, and the chief's ``SetReady`` then opened the task
holding initial values: the model trained so far lost without a word. In-process services (and in-process replicated
members); the late copy is the very frame the chief sent first, served by the test after the load: no timed waits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
from replica_shard import PRIMARY, InProcessShard, backup, layout
from two_ps_in_process import CLUSTER, SGD, two_ps_cluster

from psflow.ps.client import ParameterClient
from psflow.ps.protocol import LoadShardRequest, RegisterReply, RegisterRequest, SetReadyRequest, StatsReply
from psflow.ps.registration import next_attempt
from psflow.ps.service import ParameterService
from psflow.ps.shard_snapshot import saved_slots
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import Handler, Unavailable
from psflow.rpc.framing import Frame
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.generation_restore import register_as_chief

pytestmark = pytest.mark.timeout(60)

_KEY = "weights/part_0"  # on ps task 0, which holds global_step


def _checkpoint() -> LoadShardRequest:
    """ps task 0's load at start (generation 0, no BeginRestore) of a checkpoint of global_step 40: weights 4.0."""
    return LoadShardRequest.build(
        {_KEY: np.full((8, 2), 4.0, np.float32)}, {}, {}, [_KEY], global_step=40, lineage="lineage-40",
        restored_step=40, restored_from="/ckpt/ckpt-000000040", restored_from_step=40, generation=0)


def _first_copy_held(client: ParameterClient, service_handlers: dict[str, Handler]) -> list[Frame]:
    """ps task 0's channel: the first chief ``Register`` it gets is kept (the list) and answered UNAVAILABLE, as a
    connection that broke once the request was sent; every other call is served."""
    held: list[Frame] = []
    real = service_handlers["Register"]

    def register(frame: Frame) -> Frame:
        if not held and frame.meta.get("chief"):
            held.append(frame)
            raise Unavailable("/job:ps/task:0: connection reset (the request was sent)")
        return real(frame)

    client.channels[0] = InProcessChannel("/job:ps/task:0", {**service_handlers, "Register": register})
    return held


def test_the_first_copy_of_a_resent_chief_register_served_after_the_restore_loaded_creates_nothing() -> None:
    client, services = two_ps_cluster()
    service = services[0]
    handlers = service.handlers()
    held = _first_copy_held(client, handlers)
    registration = register_as_chief(client, SGD, None)  # the first round meets ps task 0 "unreachable": resent
    assert registration.created == {0, 1} and len(held) == 1
    client.call(0, _checkpoint())  # the chief's restore at start
    late = _served(service, held[0])  # the first copy, served now
    assert not late.created and not late.ready
    for task in (0, 1):
        client.call(task, SetReadyRequest("the chief"))
    stats = client.ps_stats(0)
    assert (stats.ready, stats.global_step, stats.restored_from_step) == (True, 40, 40)
    assert service.init_count == 1, "created anew by the late copy"
    weights = service.store.get(_KEY).value
    assert np.all(weights == 4.0), f"ready holding initial values: {weights}"


def test_a_new_call_or_process_of_the_chief_still_creates_anew_and_an_earlier_process_s_copy_does_not() -> None:
    """A chief that died while restoring at start (loads written, no SetReady): its restarted process, and a later
    call of the same process, create the variables again as before; a late copy from an earlier process of the same
    client, served after the restarted one created and loaded, creates nothing."""
    client, services = two_ps_cluster()
    service = services[0]
    register_as_chief(client, SGD, None)
    client.call(0, _checkpoint())  # the chief's restore at start, then it "died"
    assert register_as_chief(client, SGD, None).created == {0, 1}  # a later call of the same process
    client.call(0, _checkpoint())
    earlier = client
    restarted = ParameterClient(CLUSTER, list(client.layout.values()), client_name=client.client_name,
                                channels=client.channels)
    restarted.incarnation = earlier.incarnation + 1  # the restarted process (time_ns: later)
    assert register_as_chief(restarted, SGD, None).created == {0, 1}
    client.call(0, _checkpoint())
    assert service.init_count == 3
    old = dataclasses.replace(_request_of(earlier), attempt=next_attempt())  # the dead process's, resent late
    assert not _served(service, old.to_frame()).created
    assert service.init_count == 3 and np.all(service.store.get(_KEY).value == 4.0)


def _served(service: ParameterService, frame: Frame) -> RegisterReply:
    """``frame`` (a Register) served by ``service`` now."""
    return RegisterReply.from_frame(InProcessChannel(service.task_name, service.handlers()).call("Register", frame.meta))


def _request_of(client: ParameterClient) -> RegisterRequest:
    """``client``'s chief Register, as :func:`register_as_chief` sends it (attempt set by the caller)."""
    return RegisterRequest(tuple(client.layout.values()), SGD, client.sync, client.client_name, True, True,
                           client.incarnation)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_late_copy_creates_nothing_on_a_replicated_primary_nor_on_its_promoted_backup(
        make_shard: Callable[..., InProcessShard], mode: str) -> None:
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    chief = dataclasses.replace(layout(SyncConfig(mode=mode)), defer_ready=True, incarnation=7, attempt=next_attempt())
    shard.register(chief)  # the resent copy created the variables; the first copy is late
    parts = list(shard.services[PRIMARY].store.partitions())
    slots = {p.key: {name: np.full(a.shape, 0.5, a.dtype) for name, a in saved_slots(p).items()} for p in parts}
    load = LoadShardRequest.build({p.key: np.full(p.value.shape, 4.0, p.value.dtype) for p in parts}, slots, {},
                                  [p.key for p in parts], global_step=40, restored_step=40,
                                  restored_from="/ckpt/ckpt-000000040", restored_from_step=40, generation=0)
    shard.call(PRIMARY, LoadShardRequest.METHOD, load.to_frame())
    shard.call(PRIMARY, "Register", chief.to_frame())  # the late copy, on the primary
    assert shard.services[PRIMARY].init_count == 1, "created anew by the late copy"
    for member in (PRIMARY, backup(0)):
        for part in shard.services[member].store.partitions():
            assert np.all(part.value == 4.0), (member, part.key)
    shard.cut.add(PRIMARY)
    shard.promote(backup(0), shard.replicas[backup(0)].view.view.epoch)
    shard.call(backup(0), "Register", chief.to_frame())  # the late copy, resent to the promoted backup
    stats = StatsReply.from_frame(shard.call(backup(0), "Stats", Frame({})))
    assert (stats.ready, stats.global_step) == (False, 40)
    for part in shard.services[backup(0)].store.partitions():
        assert np.all(part.value == 4.0), part.key


def test_an_earlier_process_s_late_copy_served_before_the_restarted_chief_s_load_creates_nothing_either() -> None:
    """A chief that died while restoring at start (its call's first copy still queued at ps task 0), its restarted
    process registered (created), and that dead process's copy is served before the new one's restore loads: it
    created the variables anew (the new chief's loads checked meanwhile refused: 'created anew while its arrays were
    checked', its restore failed) and became the creator, so a late copy of the new process's own call, once its
    load wrote the task, was 'later' than that creator and created the variables anew over the loaded values."""
    client, services = two_ps_cluster()
    service = services[0]
    handlers = service.handlers()
    held = _first_copy_held(client, handlers)
    assert register_as_chief(client, SGD, None).created == {0, 1}
    client.call(0, _checkpoint())  # the first process's restore at start, then it "died"
    restarted = ParameterClient(CLUSTER, list(client.layout.values()), client_name=client.client_name,
                                channels=client.channels)
    restarted.incarnation = client.incarnation + 1  # the restarted process (time_ns: later)
    earlier_copy = held.pop()
    held_again = _first_copy_held(restarted, handlers)
    assert register_as_chief(restarted, SGD, None).created == {0, 1} and len(held_again) == 1
    assert service.init_count == 2
    late = _served(service, earlier_copy)  # the dead process's copy, before the new process's restore loaded
    assert not late.created and not late.ready
    assert service.init_count == 2, "created anew by an earlier process's late copy"
    restarted.call(0, _checkpoint())  # the restarted process's restore at start
    assert not _served(service, held_again[0]).created  # its own first copy, late
    for task in (0, 1):
        restarted.call(task, SetReadyRequest("the chief"))
    assert service.init_count == 2
    weights = service.store.get(_KEY).value
    assert np.all(weights == 4.0), f"ready holding initial values: {weights}"
