"""A deposed restorer's ``LoadShard`` let in by the restore fence never writes over a newer restore's state
(psflow/ps/checkpointing.py load_shard, psflow/ps/restore_gate.py RestoreGate.loading).

``LoadShard`` asked the fence once, at its start, then checked its arrays and changed the task (every partition's
value and slots, global_step, the reader positions, the lineage). A ``BeginRestore`` of a newer generation (the next
chief's restore, after the old restorer lost its lease) and that restore's whole load coming while an older
generation's load was past its check let the older load end last: the task held the older checkpoint's values,
step, positions and lineage while the cluster believed it restored the newer one. The fence is now asked again
where the load changes the task, under a mutex ``BeginRestore`` and ``SetReady`` take too. In-process services, no
sockets.
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
from psflow.rpc.api import FencedOffError
from psflow.train.generation_restore import register_as_chief

pytestmark = pytest.mark.timeout(60)

_KEY = "weights/part_0"  # on ps task 0, which holds global_step and the reader positions


def _checkpoint(fill: float, step: int, generation: int) -> LoadShardRequest:
    """ps task 0's load of a checkpoint of global_step ``step`` whose weights are all ``fill``."""
    return LoadShardRequest.build(
        {_KEY: np.full((8, 2), fill, np.float32)}, {}, {}, [_KEY], global_step=step,
        positions={"/job:worker/task:0": f'{{"step": {step}}}'}, examples=step * 10, lineage=f"lineage-{step}",
        restored_step=step, restored_from=f"/ckpt/ckpt-{step:09d}", restored_from_step=step, generation=generation)


def _state(client: ParameterClient, service: ParameterService) -> tuple[float, int | None, dict[str, str], str | None]:
    """ps task 0's weights (all one value), global_step, reader positions and lineage."""
    weights = service.store.get(_KEY).value
    assert np.all(weights == weights.flat[0]), weights  # never a mix of two checkpoints
    return float(weights.flat[0]), client.ps_stats(0).global_step, service.workers.positions(), service.saves.lineage


def _hold_in_plan(service: ParameterService, meanwhile: Any) -> None:
    """The next LoadShard on ``service`` runs ``meanwhile()`` once its fence check passed, while it checks its
    arrays (nothing changed yet)."""
    store = service.variables.partitions
    real = store.get

    def get(key: str) -> Any:
        store.get = real  # type: ignore[method-assign]
        meanwhile()
        return real(key)

    store.get = get  # type: ignore[method-assign]


def test_a_load_let_in_before_a_newer_restore_began_changes_nothing_after_it() -> None:
    client, services = two_ps_cluster()
    register_as_chief(client, SGD, None)
    client.call(0, BeginRestoreRequest(7))

    def next_restore() -> None:  # the deposed restorer's load is past the fence: the next chief restores
        client.call(0, BeginRestoreRequest(9))
        client.call(0, _checkpoint(4.0, 40, 9))

    _hold_in_plan(services[0], next_restore)
    with pytest.raises(FencedOffError, match="LoadShard of generation 7 refused: /job:ps/task:0 is at generation 9"):
        client.call(0, _checkpoint(3.0, 30, 7))
    assert _state(client, services[0]) == (4.0, 40, {"/job:worker/task:0": '{"step": 40}'}, "lineage-40")
    stats = client.ps_stats(0)
    assert (stats.generation, stats.restored_from_step, services[0].workers.examples) == (9, 40, 400)
    client.call(0, SetReadyRequest("the chief", 9, 40))  # the newer restore ends as if the older load never came
    assert client.ps_stats(0).ready


def test_a_set_ready_during_a_load_s_plan_refuses_the_load() -> None:
    """The restore the load belongs to ended (a deposed restorer's load, its SetReady sent by the same restore's
    other thread): the task is ready and the load changes nothing."""
    client, services = two_ps_cluster()
    register_as_chief(client, SGD, None)
    client.call(0, BeginRestoreRequest(7))
    client.call(0, _checkpoint(4.0, 40, 7))
    _hold_in_plan(services[0], lambda: client.call(0, SetReadyRequest("the chief", 7, 40)))
    with pytest.raises(FencedOffError, match="is ready at generation 7 .no restore in progress."):
        client.call(0, _checkpoint(3.0, 30, 7))
    assert _state(client, services[0]) == (4.0, 40, {"/job:worker/task:0": '{"step": 40}'}, "lineage-40")


def test_begin_restore_waits_for_a_load_changing_the_task() -> None:
    """A BeginRestore arriving while a load of the generation the task holds changes the task waits for it: the
    load ends whole at its generation, then the newer restore begins (and its own load replaces it)."""
    client, services = two_ps_cluster()
    register_as_chief(client, SGD, None)
    client.call(0, BeginRestoreRequest(7))
    averages = services[0].variables.averages
    real = averages.restored
    calling, begun = threading.Event(), threading.Event()
    gate = services[0].gate
    real_close = gate.close

    def close(generation: int) -> None:
        calling.set()
        real_close(generation)

    gate.close = close  # type: ignore[method-assign]

    def begin_restore() -> None:
        client.call(0, BeginRestoreRequest(9))
        begun.set()

    thread = threading.Thread(target=begin_restore, daemon=True)

    def restored(step: int | None) -> None:  # the load of generation 7 changes the task
        averages.restored = real  # type: ignore[method-assign]
        thread.start()
        assert calling.wait(30)
        assert not begun.wait(0.2)  # it waits for this load (whatever the machine's speed, it cannot go on)
        assert gate.generation == 7
        real(step)

    averages.restored = restored  # type: ignore[method-assign]
    client.call(0, _checkpoint(3.0, 30, 7))
    thread.join(30)
    assert begun.is_set()
    stats = client.ps_stats(0)
    assert (stats.generation, stats.restored_from_step, stats.ready) == (9, None, False)
    assert _state(client, services[0]) == (3.0, 30, {"/job:worker/task:0": '{"step": 30}'}, "lineage-30")
    client.call(0, _checkpoint(4.0, 40, 9))
    assert _state(client, services[0])[:2] == (4.0, 40)
    assert client.ps_stats(0).restored_from_step == 40
