"""A push of an earlier process of a worker, delivered late (after a link heals), is never applied
once the new process has read its reader position (psflow.ps.service, Incarnations)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from support import registered_ps_task as registered

from psflow.ps.service import ParameterService
from psflow.rpc.api import InvalidRequest, PreconditionFailed
from psflow.rpc.framing import Frame


def push(svc: ParameterService, incarnation: int | None, position: str) -> dict[str, object]:
    meta: dict[str, object] = {"grads": [["w/part_0", "sparse"]], "step": True, "examples": 4, "worker": "w1",
                               "position": position}
    if incarnation is not None:
        meta["incarnation"] = incarnation
    reply, _ = svc.push(Frame(meta, {"g/w/part_0": np.ones((1, 2), np.float32), "i/w/part_0": np.array([3])}))
    return reply


def positions(svc: ParameterService, incarnation: int) -> dict[str, str]:
    reply, _ = svc.handlers()["ReaderPositions"](Frame({"worker": "w1", "incarnation": incarnation}))
    return dict(reply["positions"])


def test_a_late_push_of_a_replaced_worker_process_is_refused_and_counts_nothing() -> None:
    svc = registered()
    push(svc, 100, "p1")
    assert positions(svc, 200) == {"w1": "p1"}  # the restarted process (incarnation 200) resumes at p1
    with pytest.raises(PreconditionFailed, match=r"earlier process of w1 \(incarnation 100 < 200\)"):
        push(svc, 100, "p2")  # the old process's push, delivered late
    stats, _ = svc.get_stats(Frame())
    assert stats["examples"] == 4 and stats["global_step"] == 1 and positions(svc, 200) == {"w1": "p1"}
    push(svc, 200, "p2")  # the new process goes on
    assert positions(svc, 200) == {"w1": "p2"}
    push(svc, None, "p3")  # a client that sends no incarnation is not fenced (older clients, tools)


def test_reading_positions_waits_for_the_workers_own_pushes_in_flight() -> None:
    svc = registered()
    svc.workers.admit("w2", None)  # another worker's push (sync: it may wait for this one): not waited for
    assert positions(svc, 7) == {}
    svc.workers.admit("w1", None)  # a push of w1's old process being applied
    done = threading.Event()
    threading.Thread(target=lambda: (positions(svc, 8), done.set()), daemon=True).start()
    time.sleep(0.2)
    assert not done.is_set()
    svc.workers.release("w1")
    assert done.wait(10)


def test_a_malformed_incarnation_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="incarnation"):
        push(registered(), -1, "p")
