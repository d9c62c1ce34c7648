"""What the status snapshot says about ps tasks and tasks at the run's end (issue 30, item 6).

The collector watches a cluster whose ports nobody serves (free ports, closed again): no task answers,
which is all the end-of-run states need; the ranking and the restore time are pure functions of a
snapshot's rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from psflow.cluster import ClusterSpec
from psflow.launch.ports import free_ports
from psflow.status.collector import ProcessInfo, StatusCollector
from psflow.status.views import busiest_ps, restored_at


def ps_row(index: int, *, pushes: float, pulls: float, bytes_in: float, bytes_out: float, apply: float,
           totals: tuple[float, float, float] = (0, 0, 0)) -> dict[str, Any]:
    return {"task": f"/job:ps/task:{index}", "index": index, "bytes_in": totals[0], "bytes_out": totals[1],
            "apply_seconds": totals[2],
            "rates": {"pushes_per_sec": pushes, "pulls_per_sec": pulls, "bytes_in_per_sec": bytes_in,
                      "bytes_out_per_sec": bytes_out, "apply_seconds_per_sec": apply}}


def test_the_busiest_ps_task_is_the_one_moving_bytes_not_the_one_answering_more_requests() -> None:
    """The issue's picture: ps task 0 holds a 12-byte bias and answers a few more requests (each push and pull
    of every step reaches it) in about the same apply time; ps task 1 serves 439 KiB/s. Task 1 is the busy one."""
    bias = ps_row(0, pushes=65, pulls=65, bytes_in=260, bytes_out=260, apply=0.0031)
    weights = ps_row(1, pushes=60, pulls=60, bytes_in=380 * 1024, bytes_out=59 * 1024, apply=0.0030)
    assert busiest_ps([bias, weights]) == 1
    # Apply time counts too: a task with few bytes but most of the apply time (a dense optimizer's slots).
    dense = ps_row(0, pushes=10, pulls=10, bytes_in=40_000, bytes_out=40_000, apply=0.40)
    sparse = ps_row(1, pushes=10, pulls=10, bytes_in=50_000, bytes_out=50_000, apply=0.01)
    assert busiest_ps([dense, sparse]) == 0


def test_no_busiest_with_one_ps_task_a_tie_or_nothing_moving() -> None:
    one = ps_row(0, pushes=5, pulls=5, bytes_in=10, bytes_out=10, apply=0.1)
    assert busiest_ps([one]) is None
    twin = dict(one, index=1, task="/job:ps/task:1")
    assert busiest_ps([one, twin]) is None
    idle = [ps_row(i, pushes=0, pulls=0, bytes_in=0, bytes_out=0, apply=0) for i in range(2)]
    assert busiest_ps(idle) is None


def test_an_idle_or_finished_run_ranks_by_its_totals() -> None:
    """Once nothing moves (the run ended: the final snapshot's rates are from its last sample, or zero), the
    busiest is the task that moved the most over the run."""
    rows = [ps_row(0, pushes=0, pulls=0, bytes_in=0, bytes_out=0, apply=0, totals=(512, 512, 0.0016)),
            ps_row(1, pushes=0, pulls=0, bytes_in=0, bytes_out=0, apply=0, totals=(232_148, 46_732, 0.0208))]
    assert busiest_ps(rows) == 1


def test_a_restore_generation_reads_as_the_time_of_the_restore() -> None:
    """A ps task's generation is 0 until the chief restores the cluster, then the restore's wall-clock time in
    milliseconds (psflow.train.recovery): the page shows that time, not 1700000000123."""
    assert restored_at(0) is None and restored_at(None) is None
    assert restored_at(1_700_000_000_123) == pytest.approx(1_700_000_000.123)
    assert restored_at(7) is None  # not a time (no restore writes one): shown as is, never as 1970


@pytest.fixture
def silent_cluster() -> ClusterSpec:
    ports = free_ports(3)
    return ClusterSpec({"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{p}" for p in ports[1:]]})


def watched(cluster: ClusterSpec, tmp_path: Path, processes: dict[str, ProcessInfo]) -> Iterator[StatusCollector]:
    c = StatusCollector(cluster, token="t", run={"run_dir": str(tmp_path)}, timeout=0.3, run_dir=str(tmp_path),
                        processes=lambda: dict(processes))
    try:
        yield c
    finally:
        c.stop()


@pytest.mark.parametrize("phase, running_shows", [("finished", "finished"), ("failed", "stopped"),
                                                   ("interrupted", "stopped")])
def test_once_the_run_is_over_no_task_shows_up(silent_cluster: ClusterSpec, tmp_path: Path, phase: str,
                                               running_shows: str) -> None:
    """The ps tasks still run when the run's end is written (the launcher stops them next): they show as
    finished (or stopped, when the run did not finish), and a later sample does not change what the end said."""
    processes = {"/job:ps/task:0": ProcessInfo(101, "running"),
                 "/job:worker/task:0": ProcessInfo(102, "finished", "exited 0"),
                 "/job:worker/task:1": ProcessInfo(103, "dead", "killed by signal SIGKILL")}
    for c in watched(silent_cluster, tmp_path, processes):
        before = {t["task"]: t["state"] for t in c.sample()["tasks"]}
        assert before["/job:ps/task:0"] == "starting"  # running, never answered
        end = c.finish({"phase": phase, "global_step": 5})
        states = {t["task"]: t["state"] for t in end["tasks"]}
        assert states == {"/job:ps/task:0": running_shows, "/job:worker/task:0": "finished",
                          "/job:worker/task:1": "dead"}
        processes["/job:ps/task:0"] = ProcessInfo(101, "dead", "killed by signal SIGTERM")  # stopped by the launcher
        assert {t["task"]: t["state"] for t in c.sample()["tasks"]} == states
