"""A save refused because ps task 0 restarted (not ready: no model yet) names no step it does not have.

A save reads its step from ps task 0 (the task holding global_step) first, to name the save in its lines. Restarted
and registered by the restore (its initial values, not ready), ps task 0 says global_step 0: the refused save then
logged 'checkpoint of global_step 0 into D FAILED ... snapshotted by ready and not ready ps tasks', and reported
step 0 to the ledger, a step the run passed long before (its newest checkpoint is later). Now a save whose ps task 0
is not ready names no step ('checkpoint (ps task 0 not ready: no global_step of the run) ...'); the chief's initial
save, whose tasks are all not ready at the initial global_step, names it as before.

Real in-process ps services (tests/two_ps_in_process.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from two_ps_in_process import SGD, restart_ps, train_a_step, two_ps_cluster

from psflow.checkpoint.save import CheckpointError, CheckpointManager
from psflow.train.generation_restore import register_as_chief

pytestmark = pytest.mark.timeout(60)


def test_a_save_refused_beside_a_restarted_ps_task_0_names_no_step(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    client, services = two_ps_cluster()
    client.register(SGD, chief=True)
    manager = CheckpointManager(str(tmp_path), transport="rpc")
    manager.save(client)
    for _ in range(3):
        train_a_step(client)
    assert client.global_step() == 3
    restart_ps(client, services, 0)
    register_as_chief(client, SGD, None, limit=5.0)  # the restore's step 1: registered, not ready
    assert [s.gate.ready for s in services] == [False, True]
    with caplog.at_level(logging.ERROR, logger="psflow.checkpoint.save"), \
            pytest.raises(CheckpointError, match="ready and not ready ps tasks"):
        manager.save(client)
    failed = [r.getMessage() for r in caplog.records if "FAILED" in r.getMessage()]
    assert len(failed) == 1, failed
    assert "global_step 0" not in failed[0], failed  # before: 'checkpoint of global_step 0 into ... FAILED'
    assert "checkpoint (ps task 0 not ready: no global_step of the run) into" in failed[0], failed
