"""Where a step's time goes, replicated against unreplicated: per-phase medians of real runs (issue 28).

    .venv/bin/python benchmarks/step_phases.py [--shape lr-user-p1w2] [--pairs 2] [--epochs 3] [--replicas 1]
        [--workdir /tmp/tf_peer] [--out benchmarks/results/step_phases.json]

Runs bench_ab.py's ``--shape`` command (the workload as a user types it, data in ``<workdir>/data``, made by
bench_tf_peer.py / bench_tf_peer_wd.py) of the psflow in this checkout, ``--epochs`` epochs, alternated
pairs with ``--ps-replicas N`` and without, every process started with ``benchmarks/phase_trace`` first on
its PYTHONPATH: its ``sitecustomize`` times the worker's step and its parts (compute, the wait for the rows,
the wait for the backups' acknowledgement, a plain push_pull) and the ps task's handlers and Replicate calls
with ``time.perf_counter`` (no behaviour changes; a few microseconds per call). Prints, per side, each
phase's count, median, 90th percentile and mean in ms, and writes them to ``--out``.

Latency phases are only meaningful on a machine with a core per process (a ps, its backup and two workers
on 2 cores measure the scheduler); on 2 cores read the worker's compute and the counts.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_ab  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def one_run(args: argparse.Namespace, replicated: bool, pair: int) -> dict[str, list[float]]:
    """Every process's phases of one run, merged by (role, phase)."""
    side = "replicated" if replicated else "plain"
    run = tempfile.mkdtemp(prefix=f"phases-{side}-{pair}-", dir=args.workdir)
    traces = os.path.join(run, "phases")
    os.makedirs(traces)
    extra = ["--epochs", str(args.epochs), *(["--ps-replicas", str(args.replicas)] if replicated else [])]
    cmd = [a for a in bench_ab.command(args.shape, args, os.path.join(run, "out")) if a != "--quiet"]
    cmd = [sys.executable, "-m", "psflow", *cmd[1:], *extra]
    env = dict(os.environ, PSFLOW_PHASE_TRACE_DIR=traces,
               PYTHONPATH=os.pathsep.join([os.path.join(HERE, "phase_trace"), ROOT]))
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=args.run_timeout)
    if done.returncode != 0:
        raise SystemExit(f"{side} run {pair} exited {done.returncode} (run directory {run}): {done.stdout[-500:]}")
    merged: dict[str, list[float]] = {}
    for path in glob.glob(os.path.join(traces, "*.json")):
        with open(path) as f:
            trace = json.load(f)
        argv = " ".join(trace["argv"])
        role = "backup " if "ps_backup" in argv else ""
        for phase, seconds in trace["phases"].items():
            merged.setdefault(role + phase, []).extend(seconds)
    print(f"{side} run {pair}: {sum(len(v) for v in merged.values())} timed calls ({run})", flush=True)
    return merged


def summary(seconds: list[float]) -> dict[str, Any]:
    ordered = sorted(seconds)
    return {"count": len(ordered), "median_ms": 1e3 * statistics.median(ordered),
            "p90_ms": 1e3 * ordered[int(0.9 * (len(ordered) - 1))], "mean_ms": 1e3 * statistics.fmean(ordered)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="lr-user-p1w2", choices=[s for s, v in bench_ab.SHAPES.items()
                                                              if "--in-process" not in v[2]])
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--workdir", default="/tmp/tf_peer")
    p.add_argument("--run-timeout", type=float, default=600.0)
    p.add_argument("--out", default=os.path.join(HERE, "results", "step_phases.json"))
    args = p.parse_args()
    sides: dict[str, dict[str, list[float]]] = {"plain": {}, "replicated": {}}
    for pair in range(args.pairs):
        for replicated in ([False, True] if pair % 2 == 0 else [True, False]):
            for phase, seconds in one_run(args, replicated, pair + 1).items():
                sides["replicated" if replicated else "plain"].setdefault(phase, []).extend(seconds)
    result = {"shape": args.shape, "pairs": args.pairs, "epochs": args.epochs, "replicas": args.replicas,
              "load_1min": os.getloadavg()[0],
              "phases": {side: {k: summary(v) for k, v in sorted(ph.items())} for side, ph in sides.items()}}
    for side, phases in result["phases"].items():
        print(f"\n{side} ({args.shape}, {args.epochs} epochs x {args.pairs} runs):")
        for phase, s in phases.items():
            print(f"  {phase:45s} n={s['count']:7d}  median {s['median_ms']:7.3f}  p90 {s['p90_ms']:7.3f}  "
                  f"mean {s['mean_ms']:7.3f} ms")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
