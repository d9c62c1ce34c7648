"""Which ps tasks a finished run's end does not wait for (psflow.launch.final_model.gone_after_training): those
whose newest process exited, read from the launcher's own children (exit codes only, no call); with replicated
shards, a shard whose every member exited. The real runs: tests/integration/test_ps_lost_not_restarted.py."""

from __future__ import annotations

import signal
from types import SimpleNamespace
from typing import Any

from psflow.cluster.spec import ClusterSpec
from psflow.launch.final_model import gone_after_training, lost_after_training


def _task(job: str, index: int, code: int | None) -> Any:
    return SimpleNamespace(name=f"/job:{job}/task:{index}", job=job, index=index,
                           popen=SimpleNamespace(poll=lambda: code))


def _lc(tasks: list[Any], backups: int = 0) -> Any:
    spec = {"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3"]}
    if backups:
        spec["ps_backup"] = [f"127.0.0.1:{10 + i}" for i in range(backups)]
    return SimpleNamespace(cluster=ClusterSpec(spec), tasks=tasks)


def test_a_ps_task_whose_newest_process_exited_is_gone() -> None:
    killed = -int(signal.SIGKILL)
    gone = gone_after_training(_lc([_task("ps", 0, None), _task("ps", 1, killed), _task("worker", 0, 0)]))
    assert gone == {"/job:ps/task:1": {"task": "/job:ps/task:1", "ready": False, "exited": True, "error":
                                       "/job:ps/task:1 was killed by signal SIGKILL after training and was not "
                                       "restarted"}}
    assert lost_after_training([{"task": "/job:ps/task:0", "ready": True}, *gone.values()]) == (
        "/job:ps/task:1 was killed by signal SIGKILL after training and was not restarted")
    # restarted during training (its newest process runs): not gone
    assert gone_after_training(_lc([_task("ps", 0, None), _task("ps", 1, killed), _task("ps", 1, None)])) == {}


def test_a_replicated_shard_is_gone_only_when_every_member_exited() -> None:
    tasks = [_task("ps", 0, None), _task("ps", 1, -9), _task("ps_backup", 0, None), _task("ps_backup", 1, None)]
    assert gone_after_training(_lc(tasks, backups=2)) == {}  # shard 1's backup holds every acknowledged push
    tasks[3] = _task("ps_backup", 1, 1)
    gone = gone_after_training(_lc(tasks, backups=2))
    assert list(gone) == ["/job:ps/task:1"]
    assert gone["/job:ps/task:1"]["error"] == (
        "every member of shard 1 exited after training, none restarted (/job:ps/task:1 was killed by signal "
        "SIGKILL, /job:ps_backup/task:1 exited with code 1)")


def test_a_task_gone_and_one_restarted_empty_are_both_said() -> None:
    why = lost_after_training([{"task": "/job:ps/task:0", "ready": False},
                               {"task": "/job:ps/task:1", "ready": False, "exited": True, "error": "E"}])
    assert why == "E; /job:ps/task:0 lost its state after training (restarted empty, not restored, or not answering)"


def test_a_gone_step_holders_stand_in_does_not_read_as_no_restore(tmp_path: Any) -> None:
    """ps task 0 (holding global_step) exited after a run that restored the cluster at generation 1: its stand-in
    has no generation, and restore_loss took that as 0 ('no restore within the run': None, no line). Every ps task
    is restored at one generation, so a task still ready tells it; the model's figures are the final checkpoint's."""
    from psflow.checkpoint.manifest import Manifest
    from psflow.launch.final_model import FinalCheckpoint, with_step_of
    from psflow.launch.restore_loss import restore_loss

    gone = gone_after_training(_lc([_task("ps", 0, -int(signal.SIGKILL)), _task("ps", 1, None)]))
    final = FinalCheckpoint(str(tmp_path / "ckpt-000000060"), Manifest(global_step=60, variables={}, shards=[],
                                                                       examples=5120), "why")
    ps_stats = with_step_of([*gone.values(), {"task": "/job:ps/task:1", "ready": True, "generation": 1}], final)
    loss = restore_loss(ps_stats, examples_pushed=7680, examples_at_start=0)
    assert loss is not None, ps_stats
    assert (loss["generation"], loss["global_step"], loss["examples_in_model"], loss["examples_discarded"]) == (
        1, 60, 5120, 2560)
    # no ps task left to tell the generation: not known, and no restore is said (None, as documented)
    alone = with_step_of([*gone.values()], final)
    assert restore_loss(alone, examples_pushed=7680, examples_at_start=0) is None
