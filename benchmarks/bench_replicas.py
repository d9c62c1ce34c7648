"""What replicated ps shards cost: ``psflow train --ps-replicas 1`` against 0, alternated pairs (issue 28).

    .venv/bin/python benchmarks/bench_replicas.py [--rev HEAD] [--pairs 5] [--shapes lr-p1w2-async,wd-p1w2-async] [--replicas 1]
        [--steps-in-flight K] [--plain-steps-in-flight K] [--plain-replicas 0] [--section replicas]

Each pair runs one epoch of a tf_peer workload twice with ``python -m psflow train``
of a ``git archive`` snapshot of ``--rev`` (built as bench_ab.py builds one, so
uncommitted edits in the working tree do not enter the figures) in fresh processes, once unreplicated (no ``--ps-replicas``, the
default) and once with ``--ps-replicas N`` (default 1), the order flipped every
other pair and the shapes interleaved (pair k of every shape, then pair k + 1),
so drift of a shared machine's speed hits both sides of a pair about equally.
The shapes and their commands are bench_ab.py's (``lr-p1w2-async``: sparse LR of
bench_tf_peer.py, 1 ps + 2 workers, async; ``wd-p1w2-async``: bench_tf_peer_wd.py's
W&D at 1 ps + 2 workers; ``--transport tcp --log-every 1``); the data is in
``<workdir>/data/sparse_lr`` and ``<workdir>/data/ctr_wd`` (those two scripts generate it).
``--steps-in-flight K`` runs both sides with ``--steps-in-flight K`` (default 1: the flag is not
passed); ``--plain-steps-in-flight K`` gives the unreplicated side its own K (e.g. replicated at 2
against today's default of 1), and ``--plain-replicas N`` makes that side replicated too (to compare two K's
at the same ``--ps-replicas``; "plain" then names the other side, not an unreplicated one).
``lr-user-p1w2`` and ``wd-user-p1w2`` run the same workloads as a user types them (psflow's defaults: no
``--transport`` or ``--log-every``; W&D with issue 29's flags, 2^20 hash rows per field), timed from
"initialized the variables" to the workers' last "done after" line (they log every 100 steps).
``--section`` names the RESULTS.md section and the
``results/<section>.json`` file written (default ``replicas``).

Per run:

* **steady** examples/s: the examples over the time from the chief's "initialized
  the variables" log line to the last ``step=`` line (as bench_tf_peer*.py time psflow);
* **end to end** examples/s: the examples over the wall time of the whole command
  (start-up, the backups' start and join, eval, shutdown included);
* **CPU seconds**: every process of the command (launcher, ps, backups, workers),
  from ``os.wait4``'s resource usage of the command, which counts each descendant
  it reaped; and each ps member's own (``/proc/<pid>/stat``, sampled);
* **peak RSS** of the ps primary and of its backup: ``VmHWM`` of the task's process
  (``/proc/<pid>/status``), sampled every ``--sample-every`` seconds until it exits;
* the replicated run's ``pushes_applied``, ``pushes_acknowledged`` and ``updates_lost``
  (metrics.json), checked equal, equal and 0, and the examples checked equal on both sides.

Reports, per shape, the median and quartiles of the per-pair ratios replicated /
unreplicated (steady and end to end; the goal of issue 28 is >= 0.75), the
medians of CPU seconds and peak RSS, and the 1-minute load average at each pair
(the machine is shared). Writes benchmarks/results/replicas.json and the
``--section`` of benchmarks/RESULTS.md (default "replicas").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_ab  # noqa: E402
import bench_tf_peer_wd as wd  # noqa: E402
from bench_tf_peer import extract_psflow, machine  # noqa: E402
from results_md import replace_section  # noqa: E402

DEFAULT_SHAPES = "lr-p1w2-async,wd-p1w2-async"
TICK = os.sysconf("SC_CLK_TCK")
SIDES = ("plain", "replicated")


def _task_of(pid: int) -> str | None:
    """``job-index`` of a ``python -m psflow.launch.task`` process, else None."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    if "psflow.launch.task" not in argv:
        return None
    try:
        return f"{argv[argv.index('--job') + 1]}-{argv[argv.index('--task') + 1]}"
    except (ValueError, IndexError):
        return None


def _usage(pid: int) -> tuple[int, float] | None:
    """(VmHWM in KiB, CPU seconds) of ``pid``, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            hwm = next((int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:")), 0)
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return hwm, (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15 of stat)
    except (OSError, ValueError, IndexError):
        return None


class TaskSampler(threading.Thread):
    """Samples the peak RSS and CPU time of each task process of one ``psflow train`` (by its pid) until stopped."""

    def __init__(self, root: int, every: float) -> None:
        super().__init__(daemon=True)
        self.root, self.every = root, every
        self.tasks: dict[str, dict[str, float]] = {}  # job-index -> {"peak_rss_mib", "cpu_seconds", "samples"}
        self._stop_event = threading.Event()
        self._known: dict[int, str] = {}

    def run(self) -> None:
        while not self._stop_event.is_set():
            for pid in wd.child_pids(self.root):
                if pid not in self._known:
                    name = _task_of(pid)
                    if name is None:
                        continue
                    self._known[pid] = name
            for pid, name in self._known.items():
                got = _usage(pid)
                if got is None:
                    continue
                entry = self.tasks.setdefault(name, {"peak_rss_mib": 0.0, "cpu_seconds": 0.0, "samples": 0})
                entry["peak_rss_mib"] = max(entry["peak_rss_mib"], got[0] / 1024)
                entry["cpu_seconds"] = max(entry["cpu_seconds"], got[1])
                entry["samples"] += 1
            self._stop_event.wait(self.every)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)


def one_run(src: str, shape: str, side: str, args: argparse.Namespace) -> dict[str, Any]:
    """One epoch of ``shape`` by the psflow snapshot at ``src``, with ``side``'s flags (:func:`side_flags`)."""
    replicas = args.replicas if side == "replicated" else args.plain_replicas
    output = tempfile.mkdtemp(prefix=f"rep-{shape}-{side}-", dir=os.path.join(args.workdir, "runs_replicas"))
    cmd = bench_ab.command(shape, args, output) + side_flags(args, side)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "psflow", *cmd[1:]], cwd=src, env=dict(os.environ, PYTHONPATH=src),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    sampler = TaskSampler(proc.pid, args.sample_every)
    sampler.start()
    timer = threading.Timer(args.run_timeout, proc.kill)
    timer.start()
    assert proc.stdout is not None
    console = proc.stdout.read().decode(errors="replace")
    _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    timer.cancel()
    sampler.stop()
    metrics_path = os.path.join(output, "metrics.json")
    if proc.returncode != 0 or not os.path.exists(metrics_path):
        reason = next((ln.strip() for ln in reversed(console.splitlines()) if "rror:" in ln), console[-300:])
        raise RuntimeError(f"exited {proc.returncode}: {reason} (run directory {output})")
    with open(metrics_path) as f:
        m = json.load(f)
    # a shape as a user types it logs every 100 steps: timed to the workers' "done after" lines (bench_ab.py)
    seconds = float(wd.parse_worker_logs(output, 512 * bench_ab.SHAPES[shape][3],
                                         until_done=bench_ab.SHAPES[shape][1].endswith("_user"))["seconds"])
    out: dict[str, Any] = {
        "steady": m["examples"] / seconds, "end_to_end": m["examples"] / wall, "wall_seconds": wall,
        "cpu_seconds": rusage.ru_utime + rusage.ru_stime, "examples": m["examples"], "global_step": m["global_step"],
        "auc": (m.get("eval") or {}).get("auc"), "tasks": sampler.tasks, "run_dir": output,
        "ps_peak_rss_mib": sampler.tasks.get("ps-0", {}).get("peak_rss_mib"),
        "ps_cpu_seconds": sampler.tasks.get("ps-0", {}).get("cpu_seconds"),
        "backup_peak_rss_mib": sampler.tasks.get("ps_backup-0", {}).get("peak_rss_mib"),
        "backup_cpu_seconds": sampler.tasks.get("ps_backup-0", {}).get("cpu_seconds"),
    }
    if replicas:
        counts = {k: m.get(k) for k in ("pushes_applied", "pushes_acknowledged", "updates_lost")}
        if counts["updates_lost"] != 0 or counts["pushes_applied"] != counts["pushes_acknowledged"]:
            raise RuntimeError(f"{shape} ({side}, {output}): lost updates: {counts}")
        out.update(counts)
    return out


def side_flags(args: argparse.Namespace, side: str) -> list[str]:
    """The flags one side adds to the shape's command: ``--ps-replicas`` (unless 0), ``--steps-in-flight``
    (unless 1)."""
    k = args.steps_in_flight if side == "replicated" else args.plain_steps_in_flight
    replicas = args.replicas if side == "replicated" else args.plain_replicas
    return ((["--ps-replicas", str(replicas)] if replicas else [])
            + (["--steps-in-flight", str(k)] if k != 1 else []))


def _sides(args: argparse.Namespace) -> str:
    """What the two sides ran, in words."""
    def k(n: int) -> str:
        return f" at `--steps-in-flight {n}`" if n != 1 else " at `--steps-in-flight 1` (the default)"
    plain = f"`--ps-replicas {args.plain_replicas}`" if args.plain_replicas else "none"
    return f"`--ps-replicas {args.replicas}`{k(args.steps_in_flight)} against {plain}{k(args.plain_steps_in_flight)}"


def summary(values: list[float]) -> dict[str, Any]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "quartiles": [q[0], q[2]], "values": values}


def _median(pairs: list[dict[str, Any]], side: str, key: str) -> float | None:
    got = [p[side][key] for p in pairs if p[side].get(key) is not None]
    return statistics.median(got) if got else None


def report(args: argparse.Namespace, shapes: list[str], runs: dict[str, list[dict[str, Any]]]) -> tuple[list[str], list[dict[str, Any]]]:
    """The RESULTS.md lines and the per-shape results."""
    n = min(len(runs[s]) for s in shapes)
    loads = [p["loadavg_1min"] for s in shapes for p in runs[s]]
    failures = [f"{bench_ab.SHAPES[s][0]}, {side}, pair {k + 1}: {p[side]['error'][-300:]}" for s in shapes
                for k, p in enumerate(runs[s]) for side in SIDES if "error" in p[side]]
    title = ("what replicated ps shards cost" if args.steps_in_flight == args.plain_steps_in_flight == 1 else
             f"{args.replicas} at --steps-in-flight {args.steps_in_flight} against {args.plain_replicas} at "
             f"{args.plain_steps_in_flight}")
    lines = [f"## --ps-replicas: {title} ({time.strftime('%Y-%m-%d', time.gmtime())}, issue 28)", "",
             f"Command: `.venv/bin/python benchmarks/bench_replicas.py {' '.join(sys.argv[1:])}` "
             f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {machine()}; 1-minute load average at the pairs "
             f"{min(loads):.1f}–{max(loads):.1f}, median {statistics.median(loads):.1f}, on a machine shared with other "
             f"work). {n} alternated pairs per shape (shapes interleaved, order flipped every other pair), each one epoch "
             f"by `python -m psflow train` of psflow at {args.rev} = {args.commit[:10]} (a git archive snapshot) in fresh "
             f"processes, {_sides(args)} "
             f"(commands in benchmarks/results/{args.section}.json). Steady = examples over \"initialized the variables\" to the "
             "last `step=` line (a shape as a user types it, which logs every 100 steps: the workers' last \"done after\" "
             "line); end to end = examples over the command's wall time; CPU = every process of the command "
             "(wait4); peak RSS = the task process's VmHWM. Every replicated run that ended 0 ended with "
             "pushes_applied == pushes_acknowledged and updates_lost 0; a pair with a failed run is left out of the "
             f"figures{' and listed below the table' if failures else ' (none failed)'}.", "",
             "| shape | replicated / plain, steady examples/s (quartiles) | end to end (quartiles) | steady examples/s, "
             "plain → replicated | CPU s, plain → replicated | ps peak RSS MiB, plain → replicated primary | backup "
             "peak RSS MiB | ps CPU s, plain → primary + backup |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    results = []
    for shape in shapes:
        pairs = [p for p in runs[shape] if not any("error" in p[side] for side in SIDES)]
        entry: dict[str, Any] = {"shape": shape, "row": bench_ab.SHAPES[shape][0], "pairs": len(pairs),
                                 "failed_pairs": len(runs[shape]) - len(pairs),
                                 "command": shlex.join(bench_ab.command(shape, args, "RUN_DIR")),
                                 "replicated_flags": side_flags(args, "replicated"),
                                 "plain_flags": side_flags(args, "plain"), "runs": runs[shape]}
        if not pairs:
            results.append(entry)
            lines.append(f"| {entry['row']} | no pair completed ({entry['failed_pairs']} failed) | | | | | | |")
            continue
        for rate in ("steady", "end_to_end"):
            entry[rate] = summary([p["replicated"][rate] / p["plain"][rate] for p in pairs])
        for key in ("steady", "end_to_end", "cpu_seconds", "ps_peak_rss_mib", "ps_cpu_seconds", "backup_peak_rss_mib",
                    "backup_cpu_seconds"):
            entry[key + "_medians"] = {side: _median(pairs, side, key) for side in SIDES}
        results.append(entry)
        med = {k: entry[k + "_medians"] for k in ("steady", "cpu_seconds", "ps_peak_rss_mib", "ps_cpu_seconds",
                                                  "backup_peak_rss_mib", "backup_cpu_seconds")}
        s, e = entry["steady"], entry["end_to_end"]
        lines.append(
            f"| {entry['row']} | {s['median']:.3f} ({s['quartiles'][0]:.3f}–{s['quartiles'][1]:.3f}) | "
            f"{e['median']:.3f} ({e['quartiles'][0]:.3f}–{e['quartiles'][1]:.3f}) | "
            f"{med['steady']['plain']:,.0f} → {med['steady']['replicated']:,.0f} | "
            f"{med['cpu_seconds']['plain']:.1f} → {med['cpu_seconds']['replicated']:.1f} | "
            f"{_fmt(med['ps_peak_rss_mib']['plain'])} → {_fmt(med['ps_peak_rss_mib']['replicated'])} | "
            f"{_fmt(med['backup_peak_rss_mib']['replicated'])} | "
            f"{_fmt(med['ps_cpu_seconds']['plain'], 1)} → {_fmt(med['ps_cpu_seconds']['replicated'], 1)} + "
            f"{_fmt(med['backup_cpu_seconds']['replicated'], 1)} |")
    if failures:
        lines += ["", "Failed runs:", ""] + [f"* {f}" for f in failures]
    return lines, results


def _fmt(x: float | None, digits: int = 0) -> str:
    return "?" if x is None else f"{x:,.{digits}f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rev", default="HEAD", help="the revision measured (a git archive snapshot of it; default HEAD)")
    p.add_argument("--shapes", default=DEFAULT_SHAPES,
                   help=f"comma-separated, of bench_ab.py's {', '.join(bench_ab.SHAPES)} (default {DEFAULT_SHAPES})")
    p.add_argument("--replicas", type=int, default=1, help="--ps-replicas of the replicated side (default 1)")
    p.add_argument("--steps-in-flight", type=int, default=1,
                   help="--steps-in-flight of both sides (default 1: not passed); see --plain-steps-in-flight")
    p.add_argument("--plain-steps-in-flight", type=int, default=None,
                   help="--steps-in-flight of the unreplicated side only (default: --steps-in-flight)")
    p.add_argument("--plain-replicas", type=int, default=0,
                   help="--ps-replicas of the other side (default 0: unreplicated; e.g. 1 to compare two K's)")
    p.add_argument("--section", default="replicas",
                   help="the RESULTS.md section (and results/<section>.json) written (default replicas)")
    p.add_argument("--pairs", type=int, default=5, help="alternated pairs per shape (at most)")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="start no pair round after this many minutes (every shape keeps the same number of pairs)")
    p.add_argument("--sample-every", type=float, default=0.1, help="seconds between two samples of the tasks' /proc")
    p.add_argument("--run-timeout", type=float, default=600.0, help="seconds one run may take")
    p.add_argument("--workdir", default=os.environ.get("TF_PEER_WORKDIR", "/tmp/tf_peer"))
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md and results/ as they are")
    args = p.parse_args()
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    # an --in-process shape has no backups to start (psflow train refuses --ps-replicas with it)
    clusters = [s for s, (_, _, flags, _) in bench_ab.SHAPES.items() if "--in-process" not in flags]
    if not shapes or set(shapes) - set(clusters):
        p.error(f"--shapes: want cluster shapes of {', '.join(clusters)}, got {args.shapes}")
    if args.replicas < 1:
        p.error(f"--replicas: want at least 1, got {args.replicas}")
    if args.plain_steps_in_flight is None:
        args.plain_steps_in_flight = args.steps_in_flight
    if not 0 <= args.plain_replicas < args.replicas + (args.steps_in_flight != args.plain_steps_in_flight):
        p.error(f"--plain-replicas: want 0 to --replicas ({args.replicas}), equal only with another --steps-in-flight; "
                f"got {args.plain_replicas}")
    if not 1 <= args.steps_in_flight <= 2 or not 1 <= args.plain_steps_in_flight <= (2 if args.plain_replicas else 8):
        p.error(f"--steps-in-flight: want 1 or 2 with --ps-replicas (got {args.steps_in_flight}); "
                f"--plain-steps-in-flight: 1 to 8, 2 with --plain-replicas (got {args.plain_steps_in_flight})")
    if not re.fullmatch(r"[a-z0-9_]+", args.section):
        p.error(f"--section: want lower-case letters, digits and _, got {args.section!r}")
    for workload, maker in (("sparse_lr", "bench_tf_peer.py --tf-venv ..."), ("ctr_wd", "bench_tf_peer_wd.py")):
        if any(bench_ab.SHAPES[s][1].removesuffix("_user") == workload for s in shapes):
            if not os.path.exists(os.path.join(args.workdir, "data", workload, "manifest.json")):
                p.error(f"no workload in {args.workdir}/data/{workload}: run benchmarks/{maker} once (it generates it)")
    os.makedirs(os.path.join(args.workdir, "runs_replicas"), exist_ok=True)
    args.commit, src = extract_psflow(args.rev, args.workdir)
    bench_ab.check_snapshot(src)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in shapes}
    t_start = time.monotonic()
    for k in range(args.pairs):
        if args.max_minutes is not None and k > 0 and time.monotonic() - t_start > 60 * args.max_minutes:
            break
        for shape in shapes:
            got: dict[str, Any] = {}
            for side in (SIDES if k % 2 == 0 else SIDES[::-1]):
                try:
                    got[side] = one_run(src, shape, side, args)
                except RuntimeError as e:  # recorded and reported; the other pairs go on
                    got[side] = {"error": str(e)}
            got["loadavg_1min"] = os.getloadavg()[0]
            runs[shape].append(got)
            failed = [f"{side}: {got[side]['error'][-600:]}" for side in SIDES if "error" in got[side]]
            if failed:
                print(f"[{time.strftime('%H:%M:%S')} {shape} {k + 1}/{args.pairs}] failed: " + "; ".join(failed),
                      flush=True)
                continue
            r, b = got["replicated"], got["plain"]
            print(f"[{time.strftime('%H:%M:%S')} {shape} {k + 1}/{args.pairs}] steady plain {b['steady']:,.0f} "
                  f"replicated {r['steady']:,.0f} ratio {r['steady'] / b['steady']:.3f}; end to end ratio "
                  f"{r['end_to_end'] / b['end_to_end']:.3f}; CPU s {b['cpu_seconds']:.1f} -> {r['cpu_seconds']:.1f}; "
                  f"ps peak RSS MiB {_fmt(b['ps_peak_rss_mib'])} -> {_fmt(r['ps_peak_rss_mib'])} + backup "
                  f"{_fmt(r['backup_peak_rss_mib'])}; load {got['loadavg_1min']:.1f}", flush=True)
    lines, results = report(args, shapes, runs)
    print("\n".join(lines))
    if not args.no_write:
        with open(os.path.join(HERE, "results", f"{args.section}.json"), "w") as f:
            json.dump({"command": sys.argv[1:], "rev": args.commit, "replicas": args.replicas,
                       "steps_in_flight": {"replicated": args.steps_in_flight, "plain": args.plain_steps_in_flight},
                       "results": results}, f, indent=1)
        replace_section(args.section, "\n".join(lines))


if __name__ == "__main__":
    main()
