"""A worker's failed ``Leave`` on an idle ps task (one holding nothing: psflow.train.idle_tasks) that was restarted AND
readmitted before the worker first asked the ps tasks' ``Stats``: the worker resumes where it was, its process does
not fail.

The race 7b45db1 left (recovery.py needed/wait, worker.py's except): the cluster was settled at the worker's own
generation when it first asked, so ``needed()`` (or the first poll of ``wait()``, ``(False, None)``) took the Leave's
error for the worker's own failure and the worker re-raised it; a real run's worker process then failed (restarted by
the supervisor, or the run failed without a restart policy). Now the ``since`` of the failed call tells: an idle
task whose ``Stats`` ``uptime`` is shorter than the time since the call began was restarted since.

Real in-process ps services, the layout of test_idle_ps_task_restarted.py (nothing on ps tasks 2 and 3).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_idle_ps_task_restarted import _client, _Gone, _lease, _restart, _trained
from two_ps_in_process import SGD

from psflow.ps.client import ParameterClient
from psflow.ps.service import ParameterService
from psflow.rpc.api import TaskUnavailableError
from psflow.train.idle_tasks import readmit
from psflow.train.recovery import ClusterRecovery

pytestmark = pytest.mark.timeout(60)


def _left_on_a_dead_idle_task(services: list[ParameterService]) -> tuple[ParameterClient, float]:
    """A worker (not the chief) whose ``Leave`` failed on idle ps task 3 (gone); when that call began."""
    other = _client(services, "/job:worker/task:1")
    other.register(SGD)
    other.channels[3] = _Gone()  # type: ignore[assignment]
    began = time.monotonic()
    with pytest.raises(TaskUnavailableError):
        other.leave()
    return other, began


def test_a_worker_whose_leave_failed_on_an_idle_task_readmitted_before_its_first_poll_resumes(tmp_path: Path) -> None:
    """The rare race 7b45db1 left: ps task 3 restarted AND readmitted by the chief before the worker's wait first
    polled. The cluster is settled at the worker's own generation, so wait() took the Leave's error for the
    worker's own failure, (False, None), and the worker re-raised it: its process failed (a real run: restarted by
    the supervisor, or the run failed without a restart policy). Task 3's ``Stats`` say it started after the
    failed call began: it was restarted since, readmitted, and the worker resumes where it was."""
    services, client, _ = _trained(tmp_path)
    other, began = _left_on_a_dead_idle_task(services)
    waiting = ClusterRecovery(other, SGD, checkpoint_dir=str(tmp_path), leader=lambda: None, timeout=10.0)
    _restart(client, services, 3)  # back, empty, and made ready by the chief before the worker asks
    other.channels[3] = client.channels[3]
    readmit(client, SGD, {3}, generation=0, global_step=3, lease=_lease(), run="run-a", limit=5.0)  # the chief
    assert waiting.needed() is False  # settled at its generation: alone, the error would be re-raised
    assert waiting.needed(since=began) is True
    assert waiting.wait(since=began) == (True, None)  # its own position: it pushed nothing
    assert waiting.generation == 0 and waiting.restores == 0
    other.leave()  # its Leave again, as its data ended again: every task hears it


def test_a_failed_call_is_still_the_workers_own_failure_where_no_task_was_restarted_since(tmp_path: Path) -> None:
    """Task 3 failed the call but its process ran on (a transient error): nothing restarted since, the cluster settled
    at the worker's generation: (False, None), the caller re-raises, as before."""
    services, client, _ = _trained(tmp_path)
    other, began = _left_on_a_dead_idle_task(services)
    other.channels[3] = client.channels[3]  # the same process as before the call
    services[3].started -= 3600.0  # running for an hour: its uptime says it ran long before the call
    waiting = ClusterRecovery(other, SGD, checkpoint_dir=str(tmp_path), leader=lambda: None, timeout=10.0)
    assert waiting.needed(since=began) is False
    assert waiting.wait(since=began) == (False, None)


def test_a_wall_clock_step_on_the_ps_host_does_not_make_a_task_that_ran_on_look_restarted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``uptime`` is a duration compared with the worker's monotonic interval: a ps host's wall clock stepped back
    (NTP, a VM resumed) made it ``time.time() - started``, an hour short: task 3, running on, looked restarted
    since the call, and the worker took its own failure for a readmission."""
    services, client, _ = _trained(tmp_path)
    other, began = _left_on_a_dead_idle_task(services)
    other.channels[3] = client.channels[3]  # the same process as before the call
    stepped = time.time() - 3600.0
    monkeypatch.setattr(time, "time", lambda: stepped)  # the wall clock set back an hour
    waiting = ClusterRecovery(other, SGD, checkpoint_dir=str(tmp_path), leader=lambda: None, timeout=10.0)
    assert services[3].stats_reply().counters["uptime"] >= 0.0
    assert waiting.needed(since=began) is False
    assert waiting.wait(since=began) == (False, None)
