"""A chief's ``Register`` that creates the variables never lands over a restore's load
(psflow/ps/service.py register, psflow/ps/restore_gate.py RestoreGate.creating, psflow/ps/checkpointing.py
load_shard).

A chief's ``Register`` on a task registered but not ready, with no restore in progress (its chief died while
initializing it or restoring it at start), creates the partitions anew. It asked the gate (ready? restoring?) and
then built the partitions from their initializers and set the gate (``initialized``) outside the mutex
``BeginRestore``, a load's changes and ``SetReady`` take: a lease holder's ``BeginRestore`` and ``LoadShard`` coming
while it built them, its fresh partitions replaced the loaded ones, and the restore's ``SetReady`` opened the task
holding initial values beside the checkpoint's global_step (the other tasks holding the checkpoint's). Likewise a
load at generation 0 (a chief's restore at start, no ``BeginRestore``) checked against the partitions a concurrent
chief ``Register`` then replaced wrote into partitions the task no longer held, reported them loaded, and its
``SetReady`` opened the fresh ones: now it is refused, nothing changed. In-process services, two threads
interleaved by events, no sockets, no timed waits.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from two_ps_in_process import SGD, two_ps_cluster

from psflow.ps.client import ParameterClient
from psflow.ps.protocol import BeginRestoreRequest, LoadShardRequest, SetReadyRequest
from psflow.ps.service import ParameterService
from psflow.rpc.api import FailedPreconditionError
from psflow.train.generation_restore import register_as_chief

pytestmark = pytest.mark.timeout(60)

_KEY = "weights/part_0"  # on ps task 0, which holds global_step


def _checkpoint(generation: int) -> LoadShardRequest:
    """ps task 0's load of a checkpoint of global_step 40 whose weights are all 4.0."""
    return LoadShardRequest.build(
        {_KEY: np.full((8, 2), 4.0, np.float32)}, {}, {}, [_KEY], global_step=40, lineage="lineage-40",
        restored_step=40, restored_from="/ckpt/ckpt-000000040", restored_from_step=40, generation=generation)


class _Mutex:
    """Stands in for the gate's restore mutex: ``contended`` is set when an acquire finds it held (the caller then
    waits for it, as before)."""

    def __init__(self, real: Any) -> None:
        self.real, self.contended = real, threading.Event()

    def __enter__(self) -> None:
        if not self.real.acquire(blocking=False):
            self.contended.set()
            self.real.acquire()

    def __exit__(self, *exc: object) -> None:
        self.real.release()


def _hold_creation(service: ParameterService) -> tuple[threading.Event, threading.Event]:
    """The next creation of the partitions on ``service`` sets the first event (past the Register's ask of the
    gate) and waits for the second before it builds them."""
    inside, go = threading.Event(), threading.Event()
    variables = service.variables
    real = variables._create

    def create(*args: Any) -> Any:
        variables._create = real  # type: ignore[method-assign]
        inside.set()
        assert go.wait(30)
        return real(*args)

    variables._create = create  # type: ignore[method-assign]
    return inside, go


def _weights(service: ParameterService) -> np.ndarray:
    return service.store.get(_KEY).value.copy()


def _restarted_chief(client: ParameterClient) -> tuple[threading.Thread, list[Any]]:
    """A restarted chief's Register (a chief's join), on a thread; its outcome lands in the list."""
    out: list[Any] = []

    def register() -> None:
        try:
            out.append(register_as_chief(client, SGD, None))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out.append(e)

    return threading.Thread(target=register, daemon=True), out


def test_a_register_creating_while_a_restore_begins_and_loads_leaves_the_restore_s_values() -> None:
    client, services = two_ps_cluster()
    service = services[0]
    register_as_chief(client, SGD, None)  # the first chief registered, then died before its SetReady
    initial = _weights(service)
    mutex = service.gate._loads = _Mutex(service.gate._loads)  # type: ignore[assignment]
    inside, go = _hold_creation(service)
    chief, registered = _restarted_chief(client)
    chief.start()
    assert inside.wait(30)  # past its ask (not ready, no restore in progress): building the partitions
    loaded, restorer_out = threading.Event(), []

    def lease_holder() -> None:  # restores the cluster meanwhile: BeginRestore and LoadShard, then SetReady
        try:
            client.call(0, BeginRestoreRequest(9))
            client.call(0, _checkpoint(9))
            loaded.set()
            chief.join(30)  # the restarted chief's Register ends before the restore's SetReady
            client.call(0, SetReadyRequest("the lease holder", 9, 40))
            restorer_out.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            restorer_out.append(e)

    restorer = threading.Thread(target=lease_holder, daemon=True)
    restorer.start()
    # The restore ran whole meanwhile (before the fix), or waits for the Register's creation (after it).
    while not (loaded.wait(0.01) or mutex.contended.wait(0.01)):
        assert restorer.is_alive()
    go.set()
    chief.join(30)
    restorer.join(30)
    assert restorer_out == [None], restorer_out
    assert not isinstance(registered[0], BaseException), registered
    stats = client.ps_stats(0)
    assert (stats.ready, stats.generation, stats.global_step, stats.restored_from_step) == (True, 9, 40, 40)
    weights = _weights(service)
    assert not np.array_equal(weights, initial), "ready at the restore's generation holding initial values"
    assert np.all(weights == 4.0), weights


def test_a_load_at_start_checked_before_a_register_created_anew_is_refused_and_changes_nothing() -> None:
    client, services = two_ps_cluster()
    service = services[0]
    register_as_chief(client, SGD, None)
    store = service.variables.partitions
    real = store.get

    def get(key: str) -> Any:  # the load (generation 0) checks its arrays: another chief's Register creates anew
        store.get = real  # type: ignore[method-assign]
        part = real(key)
        register_as_chief(client, SGD, None)
        return part

    store.get = get  # type: ignore[method-assign]
    with pytest.raises(FailedPreconditionError, match="LoadShard of generation 0 refused: /job:ps/task:0's "
                                                      "variables were created anew while its arrays were checked"):
        client.call(0, _checkpoint(0))
    assert service.variables.partitions is not store  # created anew during the load
    fresh = _weights(service)
    assert not np.all(fresh == 4.0)  # the Register's initial values: nothing loaded, in the new partitions or else
    assert np.all(store.get(_KEY).value != 4.0), "the load went into partitions the task no longer held"
    stats = client.ps_stats(0)
    assert (stats.ready, stats.global_step, stats.restored_from) == (False, 0, None)
    client.call(0, _checkpoint(0))  # the restore again (the Register's chief's own), on the partitions held now
    client.call(0, SetReadyRequest("the chief"))
    assert np.all(_weights(service) == 4.0)
    assert client.ps_stats(0).global_step == 40
