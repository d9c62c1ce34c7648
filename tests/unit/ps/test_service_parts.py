"""ParameterService as a table of handlers over separate parts (issue 27, item 4): each part owns its state;
the checkpoint handlers and the run ledger get parts, not the service; no state hides outside them."""

from __future__ import annotations

import threading
import weakref

import pytest

from psflow.optim import OptimizerSpec
from psflow.ps import checkpointing
from psflow.ps.protocol import BeginRestoreRequest, CheckpointStatusRequest, SaveOutcome, SetReadyRequest
from psflow.ps.service import ParameterService
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(60)

W0, W1 = "/job:worker/task:0", "/job:worker/task:1"
SGD = OptimizerSpec("sgd", {"learning_rate": 0.5})


def _call(svc: ParameterService, request: object) -> dict[str, object]:
    frame = request.to_frame()  # type: ignore[attr-defined]
    return dict(svc.handlers()[request.METHOD](frame)[0])  # type: ignore[attr-defined]


def _register(svc: ParameterService, client: str, *, chief: bool = False, defer_ready: bool = False) -> dict[str, object]:
    meta = {"layout": [], "optimizer": SGD.to_json(), "client": client, "chief": chief, "defer_ready": defer_ready}
    return dict(svc.handlers()["Register"](Frame(meta))[0])


def test_readiness_is_the_gates_and_only_its_calls_change_it() -> None:
    svc = ParameterService(0, holds_global_step=True)
    assert _register(svc, W0, chief=True, defer_ready=True) == {"created": True, "ready": False, "init_count": 1}
    assert not svc.ready and not svc.gate.ready
    with pytest.raises(AttributeError):
        svc.ready = True  # type: ignore[misc]  # a view of the gate, not a field anyone sets
    _call(svc, SetReadyRequest(W0))
    assert svc.gate.ready and _register(svc, W1)["ready"] is True
    _call(svc, BeginRestoreRequest(9))
    assert not svc.gate.ready and svc.gate.generation == 9
    _call(svc, SetReadyRequest(W0, 9, 0))
    assert svc.gate.ready and svc.stats_reply().generation == 9


def test_a_restore_waits_for_the_pushes_the_gate_let_in() -> None:
    svc = ParameterService(0, holds_global_step=True)
    _register(svc, W0, chief=True)
    svc.gate.admit(None)  # a push being applied
    done = threading.Event()
    threading.Thread(target=lambda: (_call(svc, BeginRestoreRequest(3)), done.set()), daemon=True).start()
    assert not done.wait(0.3)
    svc.gate.release()
    assert done.wait(10)


def test_the_checkpoint_ledger_is_one_per_service_and_no_module_keeps_state_for_it() -> None:
    svc = ParameterService(0, holds_global_step=True)
    _call(svc, CheckpointStatusRequest(outcome=SaveOutcome(False, 3, error="disk full", writer=W0)))
    # gRPC and the TCP carrier each build a handler table: both serve the same ledger
    assert _call(svc, CheckpointStatusRequest())["failed"] == 1 and svc.saves.status().failed == 1
    assert ParameterService(1, holds_global_step=False).saves.status().failed == 0
    assert not [name for name, value in vars(checkpointing).items() if isinstance(value, weakref.WeakKeyDictionary)]


def test_a_worker_that_registers_again_after_its_done_is_not_done_any_more() -> None:
    over: list[str] = []
    svc = ParameterService(0, holds_global_step=True, training_workers=[W0, W1], on_run_over=over.append)
    _register(svc, W0, chief=True)
    done = svc.handlers()["Done"]
    assert done(Frame({"worker": W0, "incarnation": 1}))[0]["run_over"] is False
    _register(svc, W0)  # its process was restarted: it joins again and must finish again
    assert svc.stats_reply().counters["run_end"]["workers_done"] == []
    done(Frame({"worker": W1, "incarnation": 1}))
    assert done(Frame({"worker": W0, "incarnation": 2}))[0]["run_over"] is True and len(over) == 1


def test_a_service_without_training_workers_serves_no_done() -> None:
    assert "Done" not in ParameterService(0, holds_global_step=True).handlers()
