"""The launcher's last line of defence (issue 28): a finished run with a checkpoint directory must end with a final
checkpoint at the run's last global_step as the newest there; otherwise the run fails, naming both. Checkpoints
written by a real CheckpointManager on in-process ps services (no sockets)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import one_ps_chief

from psflow.checkpoint.save import CheckpointManager
from psflow.launch.local import check_final_checkpoint
from psflow.launch.processes import LaunchError
from psflow.ps.service import ParameterService

pytestmark = pytest.mark.timeout(60)


def _steps(service: ParameterService, n: int) -> int:
    assert service.global_step is not None
    for _ in range(n):
        step = service.global_step.increment()
    return step


def test_a_final_checkpoint_at_the_last_step_passes(tmp_path: Path) -> None:
    client, service = one_ps_chief()
    manager = CheckpointManager(str(tmp_path), run_id="run-a")
    manager.save(client)
    last = _steps(service, 3)
    manager.save(client, final=True)
    check_final_checkpoint(str(tmp_path), last)  # no error


def test_an_older_checkpoint_as_the_newest_fails_the_run_naming_both(tmp_path: Path) -> None:
    client, service = one_ps_chief()
    CheckpointManager(str(tmp_path), run_id="run-a").save(client)
    last = _steps(service, 3)
    with pytest.raises(LaunchError, match=rf"the run ended at global_step {last}, but the newest checkpoint in "
                                          rf"{tmp_path} is ckpt-000000000 \(global_step 0, not final\)"):
        check_final_checkpoint(str(tmp_path), last)


def test_a_final_checkpoint_of_an_earlier_step_fails_the_run(tmp_path: Path) -> None:
    client, service = one_ps_chief()
    _steps(service, 2)
    CheckpointManager(str(tmp_path), run_id="run-a").save(client, final=True)
    last = _steps(service, 1)
    with pytest.raises(LaunchError, match=r"is ckpt-000000002 \(global_step 2, final\)"):
        check_final_checkpoint(str(tmp_path), last)


def test_no_checkpoint_at_all_fails_the_run(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match=rf"the run ended at global_step 7, but {tmp_path} holds no complete "
                                          "checkpoint"):
        check_final_checkpoint(str(tmp_path), 7)
