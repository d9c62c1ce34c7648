"""Timing a psflow run from the outside: its workers' log lines, its CPU seconds, its ps tasks' peak RSS.

Shared by bench_tf_peer.py (sparse LR) and bench_tf_peer_wd.py (W&D), which time psflow the same way:

- :func:`parse_worker_logs`: from the chief's "initialized the variables" line to the last ``step=`` line any
  worker logs (``--log-every 1``), or, for a run at psflow's default ``--log-every 100`` (``until_done``), to the
  workers' last "done after N local steps" line; plus the rate after ``warmup_steps`` global steps, read from
  the same lines (a run logging every 100 steps starts it at step 100, its first logged step >= 40).
- :func:`rate_after_warmup`: that rate from (time, global step) samples, psflow's or TF's.
- :func:`stamped_lines`, :func:`stamp`, :data:`STEP_LINE`: a run's log lines with their times, for the other
  benchmarks that read them (bench_startup.py, bench_dynamic_e2e.py, netns_delay.py).
- :func:`run_psflow_train`: one ``psflow train`` command in a child process, as a user types it.
- :func:`measured`: a run plus the CPU seconds of every process it waited for (``RUSAGE_CHILDREN``) and the peak
  RSS (``VmHWM``) of its ps task processes (TF's and psflow's), sampled every 0.1 s.
"""

from __future__ import annotations

import datetime as dt
import glob
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

Run = dict[str, Any]

#: Global steps left out of the "after warm-up" rates (the TF instruments' default).
WARMUP_STEPS = 40

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
#: A worker's ``step=`` line: groups (worker, global step).
STEP_LINE = re.compile(r"psflow\.worker: worker (\d+): step=(\d+) ")
_DONE = re.compile(r"psflow\.worker: worker (\d+): done after \d+ local steps \(\d+ examples\), last global step (\d+)")


def stamp(line: str) -> float | None:
    """The time of a log line (its ``asctime``, local time), or None for a line without one."""
    m = _STAMP.match(line)
    return dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if m else None


def stamped_lines(paths: list[str]) -> Iterator[tuple[float, str]]:
    """Each line of the log files ``paths`` (in that order) that has a time, with its time (:func:`stamp`)."""
    for path in paths:
        with open(path, errors="replace") as f:
            for line in f:
                t = stamp(line)
                if t is not None:
                    yield t, line


def parse_worker_logs(run_dir: str, per_step: int = 512, *, until_done: bool = False,
                      warmup_steps: int = WARMUP_STEPS) -> Run:
    """Timing and step accounting from the workers' logs: from "initialized the variables" to the last ``step=`` line.

    Also the rate after ``warmup_steps`` global steps, as the instruments take TF's: from the first line with
    step >= ``warmup_steps`` to the last one, (last step - that step) x ``per_step`` examples.

    ``until_done``: a run that logs at an interval (not every step) ends at the workers' last "done after N local
    steps ..., last global step G" line instead, counted as a line of step G (what was not logged is not counted
    as missing).
    """
    start: float | None = None
    lines: list[tuple[float, int, int]] = []  # (time, worker, step)
    done: list[tuple[float, int, int]] = []
    for t, line in stamped_lines(sorted(glob.glob(os.path.join(run_dir, "logs", "worker-*.log")))):
        if "initialized the variables" in line:
            start = t
        s = STEP_LINE.search(line)
        if s:
            lines.append((t, int(s.group(1)), int(s.group(2))))
        d = _DONE.search(line) if until_done else None
        if d:
            done.append((t, int(d.group(1)), int(d.group(2))))
    if start is None or not (done if until_done else lines):
        raise RuntimeError(f"{run_dir}: no 'initialized the variables' or step= (done) lines in the worker logs")
    if until_done:
        lines = sorted(lines + [max(done)])
    end = max(t for t, _, _ in lines)
    owners: dict[int, set[int]] = {}
    first: dict[int, float] = {}
    for t, worker, step in lines:
        owners.setdefault(step, set()).add(worker)
        first[worker] = min(first.get(worker, t), t)
    out: Run = {"seconds": end - start, "worker_start_skew_s": max(first.values()) - min(first.values()),
                "step_values_logged": sum(len(v) for v in owners.values()),
                "step_values_logged_by_2plus_workers": sum(1 for v in owners.values() if len(v) > 1),
                "step_values_missing": None if until_done else sum(1 for s in range(1, max(owners) + 1) if s not in owners)}
    warm = rate_after_warmup([(t, step) for t, _, step in lines], per_step, warmup_steps)
    if warm is not None:
        out["examples_per_sec_after_warmup"] = warm
    return out


def rate_after_warmup(samples: list[tuple[float, int]], per_step: int, warmup_steps: int = WARMUP_STEPS) -> float | None:
    """Examples a second from the first (time, global step) of ``samples`` at a step >= ``warmup_steps`` to the last
    time, (highest step - that step) x ``per_step`` examples; None without such a sample or time after it. How psflow's
    log lines (:func:`parse_worker_logs`) and TF's workers' samples (bench_tf_peer.tf_after_warmup) are read alike."""
    warm = min(((t, step) for t, step in samples if step >= warmup_steps), default=None)
    if warm is None:
        return None
    end, top = max(t for t, _ in samples), max(step for _, step in samples)
    return (top - warm[1]) * per_step / (end - warm[0]) if end > warm[0] else None


def run_psflow_train(cmd: list[str], *, src: str, output: str, timeout: float, per_step: int,
                     until_done: bool) -> Run:
    """Runs ``cmd`` (``["psflow", "train", ...]``, writing into ``output``) as ``python -m psflow`` from ``src``.

    Blocks until the command ends (or ``timeout`` seconds, then it is killed and the run recorded as failed).
    ``src`` is the psflow tree imported (its folder is the child's working directory and PYTHONPATH).
    Returns the steady rate (:func:`parse_worker_logs`), the end-to-end rate (examples over the command's wall
    time: start-up, eval and the final checkpoint included), eval AUC and step accounting; or a failure record.
    """
    env = dict(os.environ, PYTHONPATH=src)
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-m", "psflow", *cmd[1:]], cwd=src, env=env, capture_output=True, text=True,
                           timeout=timeout)
        tail = (p.stdout + p.stderr).strip().splitlines()[-3:]
        ok = p.returncode == 0 and os.path.exists(os.path.join(output, "metrics.json"))
    except subprocess.TimeoutExpired:
        ok, tail = False, [f"timed out after {timeout} s"]
    wall = time.perf_counter() - t0
    if not ok:
        return {"failed": True, "tail": tail, "run_dir": output, "command": shlex.join(cmd)}
    with open(os.path.join(output, "metrics.json")) as f:
        m = json.load(f)
    try:
        timing = parse_worker_logs(output, per_step, until_done=until_done)
    except RuntimeError:  # no step lines: the worker's own wall time (session, input, every step)
        timing = {"seconds": float(m["workers"][0]["wall_seconds"]), "timed_by": "worker wall_seconds"}
    return {"examples_per_sec": m["examples"] / timing["seconds"], "examples": m["examples"],
            "eval_auc": (m.get("eval") or {}).get("auc"), "eval_logloss": (m.get("eval") or {}).get("logloss"),
            "final_global_step": m["global_step"], "examples_per_sec_end_to_end": m["examples"] / wall, "wall_s": wall,
            "run_dir": output, "command": shlex.join(cmd), **timing}


# ------------------------------------------------------------------------------ peak RSS of the ps tasks
def child_pids(pid: int) -> list[int]:
    """The children of ``pid`` (every thread's: a launcher starts tasks from more than one thread)."""
    out: list[int] = []
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(path) as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def _process_name(pid: int, parent: int) -> str | None:
    """``ps-0``, ``single-0`` ... of a TF task or psflow task process, ``in-process`` of ``psflow train --in-process``
    started by this script (``parent``), else None (launchers, workers' readers forked with their parent's argv)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    flag = "--task" if "psflow.launch.task" in argv else "--index" if "task" in argv and "--job" in argv else None
    if flag is not None and flag in argv:
        return f"{argv[argv.index('--job') + 1]}-{argv[argv.index(flag) + 1]}"
    if parent == os.getpid() and "--in-process" in argv and "psflow" in argv:
        return "in-process"
    return None


def _peak_rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:")), None)
    except (OSError, ValueError, IndexError):
        return None


class PeakRss(threading.Thread):
    """Samples VmHWM (the kernel's exact peak of the resident set) of this script's descendant task processes.

    Runs until :meth:`stop`; a process's figure is its VmHWM at the last sample before it exited (every ``every``
    seconds), so growth in its last ``every`` seconds can be missed. A forked child named like its parent is skipped.
    """

    def __init__(self, every: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.every = every
        self.peak_mib: dict[str, float] = {}
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            stack: list[tuple[int, str | None]] = [(os.getpid(), None)]
            while stack:
                pid, parent_name = stack.pop()
                for child in child_pids(pid):
                    name = _process_name(child, pid)
                    hwm = _peak_rss_kib(child) if name is not None and name != parent_name else None
                    if name is not None and hwm is not None:
                        self.peak_mib[name] = max(self.peak_mib.get(name, 0.0), hwm / 1024)
                    stack.append((child, name))
            self._stop_event.wait(self.every)

    def stop(self) -> dict[str, float]:
        self._stop_event.set()
        self.join(timeout=5)
        return self.peak_mib


def measured(fn: Callable[[], Run]) -> Run:
    """``fn()`` plus the peak RSS of its ps task processes and the CPU seconds of every process it waited for."""
    sampler = PeakRss()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    sampler.start()
    try:
        r = fn()
    finally:
        peaks = sampler.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    ps = [v for k, v in peaks.items() if k.startswith("ps-")]
    single = [v for k, v in peaks.items() if k in ("single-0", "in-process")]
    return dict(r, peak_rss_mib_by_process=peaks, ps_peak_rss_mib=max(ps or single) if ps or single else None,
                ps_peak_rss_mib_sum=sum(ps or single) if ps or single else None,
                cpu_seconds=(after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
