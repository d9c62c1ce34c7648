"""Loses ps task 1 as the chief's final evaluation starts, while the other worker, finished, still lingers (for
tests/integration/test_ps_lost_in_final_eval.py; on a process's path only where the test puts this directory on
PYTHONPATH, with ``PSFLOW_TEST_LOSE_IN_FINAL_EVAL`` set to the run's output directory). In each worker process:

- worker 0 sleeps 2 s before its ``Leave``, so worker 1 finishes first, resigns the chief lease and lingers, and
  worker 0, the last to finish, holds the duties at its session's end;
- the worker that FinalEvalOnce.end runs in (the holder, after its final save) SIGKILLs ps task 1 (by the pid
  listening on its port in cluster.json), waits until that process is gone, and writes ``ps1-killed`` in the output
  directory, once per run; the launcher's restart policy starts the task again, empty;
- a lingering worker that resigned sees no other worker finished (``Stats.finished`` reduced to itself) until
  ``ps1-killed`` exists, so it is still lingering when the task is lost (written: ``linger-held``).

Every other process runs unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from typing import Any

_RUN = os.environ.get("PSFLOW_TEST_LOSE_IN_FINAL_EVAL")

if _RUN:
    from psflow.ps.client import ParameterClient
    from psflow.train import final_eval, recovery

    _KILLED = os.path.join(_RUN, "ps1-killed")

    def _listener(port: int) -> int:
        inodes = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in open(table).read().splitlines()[1:]:
                f = line.split()
                if f[3] == "0A" and int(f[1].split(":")[1], 16) == port:
                    inodes.add(f[9])
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        return int(pid)
            except OSError:
                continue
        raise RuntimeError(f"no process listens on port {port}")

    def _gone(pid: int) -> bool:
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            return True
        return stat[stat.rindex(")") + 2] in "ZX"

    _end = final_eval.FinalEvalOnce.end

    def _lose_ps1_then_end(self: Any, session: Any) -> Any:
        if not os.path.exists(_KILLED):
            cluster = json.load(open(os.path.join(_RUN, "cluster.json")))
            ps = cluster.get("cluster", cluster)["ps"]
            pid = _listener(int(ps[1].rsplit(":", 1)[1]))
            os.kill(pid, signal.SIGKILL)
            while not _gone(pid):
                time.sleep(0.05)
            open(_KILLED, "w").close()
        return _end(self, session)

    final_eval.FinalEvalOnce.end = _lose_ps1_then_end  # type: ignore[method-assign]

    _leave = ParameterClient.leave

    def _leave_late(self: ParameterClient) -> None:
        if self.client_name == "/job:worker/task:0":
            time.sleep(2.0)
        _leave(self)

    ParameterClient.leave = _leave_late  # type: ignore[method-assign]

    _linger = recovery.ClusterRecovery.linger

    def _linger_held(self: Any, num_workers: int, *, before_waiting: Any = None, **kwargs: Any) -> Any:
        resigned: list[bool] = []

        def resign() -> None:
            resigned.append(True)
            if before_waiting is not None:
                before_waiting()

        stats_of = self.client.ps_stats

        def held_stats(*args: Any, **kw: Any) -> Any:
            stats = stats_of(*args, **kw)
            if resigned and not os.path.exists(_KILLED) and stats.finished:
                open(os.path.join(_RUN, "linger-held"), "w").close()
                stats = dataclasses.replace(stats, finished=tuple(
                    w for w in stats.finished if w == self.client.client_name))
            return stats

        self.client.ps_stats = held_stats
        try:
            return _linger(self, num_workers, before_waiting=resign, **kwargs)
        finally:
            del self.client.ps_stats

    recovery.ClusterRecovery.linger = _linger_held  # type: ignore[method-assign]
