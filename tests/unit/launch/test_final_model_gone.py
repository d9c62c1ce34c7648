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
