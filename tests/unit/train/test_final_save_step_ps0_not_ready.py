"""The final checkpoint's save beside a restarted ps task 0 names the session's last step, not the restarted task's 0.

CheckpointSaverHook.end read ps task 0's global_step as it was: a ps task 0 restarted and registered by the
restore (its fresh partitions, not ready, no load yet) says 0, so the refused final save said 'the final checkpoint
(global_step 0) could not be written', a step the run passed long before (and looked for a checkpoint at step 0 to
mark final). It reads :func:`~psflow.train.hook_api.end_step` now, as EvalHook and the summary hook's end do.

Real in-process ps services (tests/two_ps_in_process.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from two_ps_in_process import SGD, restart_ps, train_a_step, two_ps_cluster

from psflow.checkpoint.save import CheckpointManager, FinalCheckpointError
from psflow.train.generation_restore import register_as_chief
from psflow.train.hooks import CheckpointSaverHook
from psflow.train.session import MonitoredTrainingSession

pytestmark = pytest.mark.timeout(60)


def test_the_final_save_beside_a_restarted_ps_task_0_names_the_sessions_step(tmp_path: Path) -> None:
    client, services = two_ps_cluster()
    with MonitoredTrainingSession(client, SGD, is_chief=True):
        pass
    for _ in range(3):
        train_a_step(client)
    session = SimpleNamespace(client=client, join_result=None, global_step=client.global_step(), checkpoint_dir=None)
    restart_ps(client, services, 0)
    register_as_chief(client, SGD, None, limit=5.0)  # the restore's step 1: registered, not ready
    assert client.global_step() == 0
    hook = CheckpointSaverHook(CheckpointManager(str(tmp_path / "ckpt")), save_steps=1000)
    with pytest.raises(FinalCheckpointError) as failed:
        hook.end(session)  # type: ignore[arg-type]
    assert "the final checkpoint (global_step 3) could not be written" in str(failed.value), failed.value
