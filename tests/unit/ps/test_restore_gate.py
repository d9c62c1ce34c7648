"""RestoreGate.restoring (psflow/ps/restore_gate.py): set when ``BeginRestore`` closes the gate, cleared when
``SetReady`` opens it; a chief's Register creates nothing on a task while it is set (in-process service; the
same over real ps processes: tests/integration/test_chief_register_during_restore.py)."""

from __future__ import annotations

import numpy as np
import pytest

from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.protocol import LoadShardRequest, RegisterReply, RegisterRequest
from psflow.ps.restore_gate import RestoreGate
from psflow.ps.service import ParameterService
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import FencedOff, PreconditionFailed
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(60)

SGD = OptimizerSpec("sgd", {"learning_rate": 1.0})


def test_a_restore_is_in_progress_from_begin_restore_until_set_ready() -> None:
    gate = RestoreGate("/job:ps/task:0")
    assert not gate.restoring
    gate.initialized(ready=False)  # the chief created the variables and restores a checkpoint at start
    assert not gate.restoring and not gate.ready
    gate.open()
    gate.close(3)  # BeginRestore
    assert gate.restoring and not gate.ready and gate.generation == 3
    gate.initialized(ready=False)  # a fresh task's variables created within the restore: still restoring
    assert gate.restoring
    gate.open(3)  # SetReady
    assert not gate.restoring and gate.ready
    gate.close(4)
    backup = RestoreGate("/job:ps/task:0")  # a replicated shard's backup holds it too
    backup.load_replica_state(gate.replica_state())
    assert backup.restoring and backup.generation == 4


def _register(service: ParameterService, request: RegisterRequest) -> RegisterReply:
    meta, arrays = service.register(request.to_frame())
    return RegisterReply.from_frame(Frame(dict(meta), dict(arrays)))


def test_a_chiefs_register_creates_nothing_during_a_restore_and_again_once_none_is_in_progress() -> None:
    vs = VariableSet(replica_device_setter(ps_tasks=1))
    vs.get_variable("w", (3,), initializer={"name": "constant", "value": 0.5})
    chief = RegisterRequest(tuple(vs.placements()), SGD, SyncConfig(), "/job:worker/task:0", chief=True,
                            defer_ready=True)
    service = ParameterService(0, holds_global_step=True)
    assert _register(service, chief) == RegisterReply(True, False, 1)  # created, left for the chief's restore
    assert _register(service, chief) == RegisterReply(True, False, 2)  # not ready, no restore: created again
    service.handlers()["BeginRestore"](Frame({"generation": 1}))
    loaded = np.array([1.0, 2.0, 3.0], np.float32)
    load = LoadShardRequest.build({"w/part_0": loaded}, {}, {}, ["w/part_0"]).to_frame()
    service.handlers()["LoadShard"](load)
    assert _register(service, chief) == RegisterReply(False, False, 2)  # a restore is in progress: kept
    assert np.array_equal(service.store.get("w/part_0").value, loaded)
    service.handlers()["SetReady"](Frame({"client": "/job:worker/task:1", "generation": 1, "global_step": 0}))
    assert _register(service, chief) == RegisterReply(False, True, 2)  # ready: kept, as before
    assert np.array_equal(service.store.get("w/part_0").value, loaded)


def test_a_set_ready_of_a_restore_a_newer_one_replaced_is_refused() -> None:
    """A deposed restorer (its lease lapsed while it was stopped; a newer holder began its own restore) sends its
    SetReady late: it opened the task in the middle of the newer restore, at the older generation, so workers
    resumed at it beside the newer restore's loads and the newer restore then set global_step back under them."""
    vs = VariableSet(replica_device_setter(ps_tasks=1))
    vs.get_variable("w", (3,))
    chief = RegisterRequest(tuple(vs.placements()), SGD, SyncConfig(), "/job:worker/task:0", chief=True)
    service = ParameterService(0, holds_global_step=True)
    _register(service, chief)
    service.handlers()["BeginRestore"](Frame({"generation": 10}))  # restorer A
    service.handlers()["BeginRestore"](Frame({"generation": 20}))  # restorer B, the newer lease's holder
    # The restore fence, as a LoadShard of generation 10 is: ABORTED (FencedOff), not FAILED_PRECONDITION.
    with pytest.raises(FencedOff, match=r"^SetReady of generation 10 from /job:worker/task:1 refused: "
                                        r"/job:ps/task:0 is at generation 20 \(another restore began"):
        service.handlers()["SetReady"](Frame({"client": "/job:worker/task:1", "generation": 10, "global_step": 5}))
    assert service.gate.restoring and not service.gate.ready and service.gate.generation == 20
    service.handlers()["SetReady"](Frame({"client": "/job:worker/task:2", "generation": 20, "global_step": 5}))
    assert service.gate.ready and service.gate.generation == 20
    with pytest.raises(FencedOff, match="SetReady of generation 10"):  # nor once B's restore is done
        service.handlers()["SetReady"](Frame({"client": "/job:worker/task:1", "generation": 10, "global_step": 5}))
    assert service.gate.ready and service.gate.generation == 20



def test_a_set_ready_with_no_generation_during_a_restore_is_refused_but_not_fenced() -> None:
    """A chief's SetReady at start carries no generation (no fencing token): refused while a restore is in
    progress as any conflict with the task's state is (FAILED_PRECONDITION), not as the restore fence."""
    vs = VariableSet(replica_device_setter(ps_tasks=1))
    vs.get_variable("w", (3,))
    service = ParameterService(0, holds_global_step=True)
    _register(service, RegisterRequest(tuple(vs.placements()), SGD, SyncConfig(), "/job:worker/task:0", chief=True,
                                       defer_ready=True))
    service.handlers()["BeginRestore"](Frame({"generation": 10}))
    with pytest.raises(PreconditionFailed, match="SetReady from /job:worker/task:0 refused") as refused:
        service.handlers()["SetReady"](Frame({"client": "/job:worker/task:0"}))
    assert not isinstance(refused.value, FencedOff)
    assert service.gate.restoring and service.gate.generation == 10

def _restoring_service() -> ParameterService:
    vs = VariableSet(replica_device_setter(ps_tasks=1))
    vs.get_variable("w", (3,))
    service = ParameterService(0, holds_global_step=True)
    _register(service, RegisterRequest(tuple(vs.placements()), SGD, SyncConfig(), "/job:worker/task:0", chief=True))
    return service


def _load(values: list[float], generation: int | None) -> Frame:
    """A LoadShard of ``w/part_0`` as the wire carries it (``generation``: None, not sent)."""
    frame = LoadShardRequest.build({"w/part_0": np.array(values, np.float32)}, {}, {}, ["w/part_0"]).to_frame()
    return Frame({**frame.meta, **({"generation": generation} if generation is not None else {})}, frame.arrays)


def test_a_load_shard_of_a_restore_a_newer_one_replaced_is_refused() -> None:
    """A deposed restorer's LoadShard sent late (after a newer lease's holder began its own restore) overwrote the
    newer restore's values: LoadShard carries its restore's generation and is refused, nothing changed, when the
    task holds another, or holds no restore in progress."""
    service = _restoring_service()
    load = service.handlers()["LoadShard"]
    service.handlers()["BeginRestore"](Frame({"generation": 10}))  # restorer A
    service.handlers()["BeginRestore"](Frame({"generation": 20}))  # restorer B, the newer lease's holder
    load(_load([2, 2, 2], 20))
    with pytest.raises(PreconditionFailed, match=r"^LoadShard of generation 10 refused: /job:ps/task:0 is at "
                                                 r"generation 20 \(another restore began here since\); nothing loaded"):
        load(_load([1, 1, 1], 10))
    assert service.store.get("w/part_0").value.tolist() == [2, 2, 2]
    service.handlers()["SetReady"](Frame({"client": "/job:worker/task:2", "generation": 20, "global_step": 5}))
    with pytest.raises(PreconditionFailed, match=r"^LoadShard of generation 20 refused: /job:ps/task:0 is ready "
                                                 r"at generation 20 \(no restore in progress\); nothing loaded"):
        load(_load([3, 3, 3], 20))  # nor once B's restore is done
    assert service.store.get("w/part_0").value.tolist() == [2, 2, 2]


def test_a_load_shard_with_no_begin_restore_is_taken_on_a_task_not_ready() -> None:
    """A chief's first restore (a fresh cluster, a resumed run) or warm start sends no BeginRestore: generation 0
    on a task not ready; a load with no generation (a tool's, an older client's) is not checked."""
    vs = VariableSet(replica_device_setter(ps_tasks=1))
    vs.get_variable("w", (3,))
    service = ParameterService(0, holds_global_step=True)
    _register(service, RegisterRequest(tuple(vs.placements()), SGD, SyncConfig(), "/job:worker/task:0", chief=True,
                                       defer_ready=True))
    service.handlers()["LoadShard"](_load([4, 4, 4], 0))
    assert service.store.get("w/part_0").value.tolist() == [4, 4, 4]
    service.handlers()["LoadShard"](_load([5, 5, 5], None))
    assert service.store.get("w/part_0").value.tolist() == [5, 5, 5]
    with pytest.raises(PreconditionFailed, match="LoadShard of generation 3 refused"):
        service.handlers()["LoadShard"](_load([6, 6, 6], 3))
    assert service.store.get("w/part_0").value.tolist() == [5, 5, 5]


def test_a_save_during_a_restore_is_refused() -> None:
    """A SaveShard between BeginRestore and SetReady wrote a shard holding part of the restore: with the other
    tasks' shards (saved before the restore, or after it) a checkpoint that mixes restored and unrestored state."""
    service = _restoring_service()
    save = service.handlers()["SaveShard"]
    save(Frame({"path": None}))
    service.handlers()["BeginRestore"](Frame({"generation": 7}))
    with pytest.raises(PreconditionFailed, match=r"^/job:ps/task:0: refused to save a checkpoint shard: a restore "
                                                 r"\(generation 7\) is in progress here"):
        save(Frame({"path": None}))
    service.handlers()["SetReady"](Frame({"client": "/job:worker/task:1", "generation": 7, "global_step": 0}))
    save(Frame({"path": None}))
