"""A chief's fence check around a save (psflow/checkpoint/publish_checks.py, ``check_fence``) reads only
the fence's own refusal (ABORTED: ``FencedOffError``) as a newer chief's: any other refusal of its ``Fence`` call is
a failed save (counted; after the pointer's switch the checkpoint stays current), not "fenced off by a newer chief".

A ``Fence`` call is refused otherwise by a replicated shard's member that was deposed (psflow/ps/replication/
fence_state.py: FAILED_PRECONDITION naming the shard's new primary, the caller resends there). Real in-process ps
services behind in-process channels (the same dispatch as over a network); ps task 1's ``Fence`` answers as such a
member does once the test says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from two_ps_in_process import SGD, two_ps_cluster

from psflow.checkpoint.save import CheckpointFencedError, CheckpointManager
from psflow.errors import CheckpointError
from psflow.ps.client import ParameterClient
from psflow.ps.replication.deposed import Deposal
from psflow.ps.service import ParameterService
from psflow.rpc.api import FencedOff, Handler, PreconditionFailed, Reply
from psflow.rpc.framing import Frame
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.chief import join_cluster

pytestmark = pytest.mark.timeout(60)

RUN = "run-a"
TASK_1 = "/job:ps/task:1"


def _deposed_member() -> PreconditionFailed:
    """What a replicated shard's deposed member answers a ``Fence`` with (fence_state.py)."""
    deposal = Deposal(TASK_1, 1)
    deposal.depose("/job:ps_backup/task:1", 2)
    return PreconditionFailed(deposal.message())


def _newer_chief() -> FencedOff:
    return FencedOff(f"{TASK_1}: write from old chief with epoch 5 refused: 'chief' is fenced at epoch 9 (by new chief)")


def _refusing(client: ParameterClient, service: ParameterService, refusal: Callable[[], Exception],
              when: Callable[[], bool]) -> None:
    """ps task 1's channel: its own handlers, but ``Fence`` raises ``refusal()`` while ``when()``."""
    handlers = service.handlers()
    fence = handlers["Fence"]

    def refused_fence(frame: Frame) -> Reply:
        if when():
            raise refusal()
        return fence(frame)

    table: dict[str, Handler] = {**handlers, "Fence": refused_fence}
    client.channels[1] = InProcessChannel(TASK_1, table)


def _pointer(directory: Path) -> str:
    data = json.loads((directory / "checkpoint").read_text())
    assert isinstance(data, dict)
    return str(data["latest"])


def _saved(tmp_path: Path) -> tuple[ParameterClient, list[ParameterService], str]:
    client, services = two_ps_cluster()
    join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path))
    first = CheckpointManager(str(tmp_path), run_id=RUN).save(client, epoch=5, holder="old chief")
    return client, services, Path(first.path).name


def test_a_fence_check_refused_by_a_deposed_replica_is_a_failed_save_not_a_newer_chiefs(tmp_path: Path) -> None:
    client, services, first = _saved(tmp_path)
    _refusing(client, services[1], _deposed_member, lambda: True)
    manager = CheckpointManager(str(tmp_path), run_id=RUN)
    with pytest.raises(CheckpointError, match=r"/job:ps/task:1 refused: .*deposed: shard 1's primary is") as e:
        manager.save(client, epoch=5, holder="old chief")
    assert not isinstance(e.value, CheckpointFencedError)
    assert manager.failed_in_a_row == 1  # counted: retried at the next save; a final save fails the run
    assert _pointer(tmp_path) == first
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == [first]  # the failed save's directory removed


def test_a_recheck_refused_by_a_deposed_replica_after_the_switch_keeps_the_checkpoint_current(tmp_path: Path) -> None:
    """The pointer named the new checkpoint; its re-check was refused, but not by the fence: no newer chief took the
    pointer over, so it is not taken back (the checkpoint is complete), as when a ps task could not be asked."""
    client, services, _ = _saved(tmp_path)
    switched: list[str] = []
    _refusing(client, services[1], _deposed_member, lambda: "pointer_switched" in switched)
    manager = CheckpointManager(str(tmp_path), run_id=RUN, fault=switched.append)
    saved = manager.save(client, epoch=5, holder="old chief")
    assert "pointer_switched" in switched
    assert _pointer(tmp_path) == Path(saved.path).name and (Path(saved.path) / "manifest.json").is_file()
    assert manager.failed_in_a_row == 0


def test_a_fence_check_refused_by_the_fence_is_fenced_off_and_not_counted(tmp_path: Path) -> None:
    client, services, first = _saved(tmp_path)
    _refusing(client, services[1], _newer_chief, lambda: True)
    manager = CheckpointManager(str(tmp_path), run_id=RUN)
    with pytest.raises(CheckpointFencedError, match="epoch 5 refused"):
        manager.save(client, epoch=5, holder="old chief")
    assert manager.failed_in_a_row == 0
    assert _pointer(tmp_path) == first
