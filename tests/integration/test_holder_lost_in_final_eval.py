"""The last worker to finish, holding the chief duties, lost in its final evaluation (after its final checkpoint)
under ``psflow server`` with ``--checkpoint-dir`` and ``--eval``: the final model is still evaluated once.

Before: the worker that had handed the duties on (:meth:`psflow.train.take_over.TakeOver.await_holder`) took the
holder's final checkpoint for the run's end ('the final checkpoint at global_step 312 is written already (by a
worker that took the chief duties over); leaving'), exited 0, and nobody evaluated the final model.

Real ``psflow server`` processes, as test_chief_lost_at_end starts them; worker 0 stops itself (SIGSTOP) in its
final evaluation (tests/integration/stall_chief). Asserted on log lines, exit codes and manifests, never on time.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import test_server_run_end
from support import wait_until
from test_chief_lost_at_end import _start
from test_server_run_end import _SAFETY, _cluster, _Tasks

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.cluster import ClusterSpec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

#: The chief lease's ttl: worker 1 finishes its data seconds before worker 0's final save, and a stall of worker 0
#: (or of ps task 0, which serves its renewals) as long as the ttl under load would hand the duties over while worker 0
#: still trains, which is not the case these tests are about.
_TTL = 6

tasks = test_server_run_end.tasks  # the fixture: its psflow server processes are killed by pid after the test


def _stall_in_final_eval(monkeypatch: pytest.MonkeyPatch) -> None:
    """The psflow server processes started next stop worker 0 (SIGSTOP, by itself) in its final evaluation."""
    here = Path(__file__).parent / "stall_chief"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(here), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("PSFLOW_TEST_STALL", "mid_final_eval")


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (its state in /proc/PID/stat is T)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


def test_a_holder_killed_in_its_final_evaluation_leaves_the_evaluation_to_a_take_over(
        tasks: Callable[[ClusterSpec], _Tasks], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker 0, the chief and the last to finish (3,000 lines against worker 1's 300), writes its final checkpoint
    and is killed in its final evaluation. Worker 1 takes the duties over once nobody held the lease for its ttl and
    evaluates the final model: one ``eval step=S`` line, S the final checkpoint's global_step; it exits 0."""
    _stall_in_final_eval(monkeypatch)
    cluster = tasks(_cluster(1, 2))
    ckpt = _start(cluster, tmp_path, [3000, 300], lease_ttl=_TTL)
    chief = cluster.procs["worker-0"]
    wait_until(lambda: _stopped(chief.pid) or chief.poll() is not None, "worker 0 stopped in its final evaluation",
               limit=_SAFETY)
    assert chief.poll() is None, cluster.log("worker-0")[-3000:]
    final = latest_checkpoint(str(ckpt))
    assert final is not None and read_manifest(final).final, final  # its final save came before the evaluation
    step = read_manifest(final).global_step
    os.kill(chief.pid, signal.SIGKILL)
    chief.wait(timeout=_SAFETY)
    assert cluster.exit_code("worker-1") == 0, cluster.log("worker-1")[-3000:]
    evals = re.findall(r"eval step=(\d+)", cluster.log("worker-1"))
    assert evals == [str(step)], cluster.log("worker-1")[-3000:]


def test_a_holder_stalled_in_its_final_evaluation_and_resumed_reports_no_second_one(
        tasks: Callable[[ClusterSpec], _Tasks], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same, worker 0 resumed (SIGCONT) once worker 1 took the duties over, evaluated and exited (not
    killed): worker 0 drops its own evaluation (:mod:`psflow.train.final_eval`) and exits 0; one ``eval step=S``
    line in all, the final checkpoint the one worker 0 wrote. Before, worker 1 left without evaluating and worker
    0's evaluation was the run's: it held up, and must still."""
    _stall_in_final_eval(monkeypatch)
    cluster = tasks(_cluster(1, 2))
    ckpt = _start(cluster, tmp_path, [3000, 300], lease_ttl=_TTL)
    chief = cluster.procs["worker-0"]
    try:
        wait_until(lambda: _stopped(chief.pid) or chief.poll() is not None, "worker 0 stopped in its final evaluation",
                   limit=_SAFETY)
        assert chief.poll() is None, cluster.log("worker-0")[-3000:]
        code1 = cluster.exit_code("worker-1")
    finally:
        os.kill(chief.pid, signal.SIGCONT)
    assert code1 == 0, cluster.log("worker-1")[-3000:]
    assert cluster.exit_code("worker-0") == 0, cluster.log("worker-0")[-3000:]
    final = latest_checkpoint(str(ckpt))
    assert final is not None and read_manifest(final).final, final
    evals = re.findall(r"eval step=(\d+)", cluster.log("worker-1") + cluster.log("worker-0"))
    assert evals == [str(read_manifest(final).global_step)], evals
