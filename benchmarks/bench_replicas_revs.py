"""Replicated runs of two psflow revisions, alternated: the CPU each task spends on one epoch (issue 28).

    .venv/bin/python benchmarks/bench_replicas_revs.py --old REV --new REV [--shapes lr-user-p1w2,wd-user-p1w2]
        [--pairs 4] [--replicas 1]

Each revision is a ``git archive`` snapshot, built and byte-compiled (bench_tf_peer.py's ``extract_psflow``).
Per shape, ``--pairs`` pairs of one-epoch runs with ``--ps-replicas`` (bench_replicas.py's ``one_run``: the
command as bench_ab.py writes it, each task's CPU from /proc, the command's from wait4), the order flipped every
other pair. Prints one JSON line per run, then per shape and task the median CPU seconds of each revision and
the per-pair ratios new / old, with the 1-minute load average at each run. Throughput is printed but not judged:
on a loaded machine it swings with the other load (RESULTS.md, replicas_defaults); CPU moves far less.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_replicas  # noqa: E402
from bench_tf_peer import extract_psflow  # noqa: E402


def _cpu(run: dict[str, Any]) -> dict[str, float]:
    """The command's CPU seconds and each task's."""
    return {"command": run["cpu_seconds"], **{t: v["cpu_seconds"] for t, v in sorted(run["tasks"].items())}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True, help="the revision measured against")
    p.add_argument("--new", required=True, help="the revision measured")
    p.add_argument("--shapes", default="lr-user-p1w2,wd-user-p1w2", help="bench_ab.py's cluster shapes, comma-separated")
    p.add_argument("--pairs", type=int, default=4, help="alternated pairs per shape")
    p.add_argument("--replicas", type=int, default=1, help="--ps-replicas of every run (default 1)")
    p.add_argument("--workdir", default=os.environ.get("TF_PEER_WORKDIR", "/tmp/tf_peer"))
    args = p.parse_args()
    run_args = argparse.Namespace(replicas=args.replicas, plain_replicas=0, steps_in_flight=1, plain_steps_in_flight=1,
                                  sample_every=0.1, run_timeout=600.0, workdir=args.workdir)
    os.makedirs(os.path.join(args.workdir, "runs_replicas"), exist_ok=True)
    trees = {"old": extract_psflow(args.old, args.workdir), "new": extract_psflow(args.new, args.workdir)}
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    got: dict[str, list[dict[str, Any]]] = {s: [] for s in shapes}
    for k in range(args.pairs):
        for shape in shapes:
            pair: dict[str, Any] = {}
            for side in ("old", "new") if k % 2 == 0 else ("new", "old"):
                run = bench_replicas.one_run(trees[side][1], shape, "replicated", run_args)
                pair[side] = {"cpu": _cpu(run), "steady": run["steady"], "load": os.getloadavg()[0]}
                print(json.dumps({"shape": shape, "pair": k, "rev": trees[side][0][:10], "side": side, **pair[side]}),
                      flush=True)
            got[shape].append(pair)
    for shape, pairs in got.items():
        loads = [pair[s]["load"] for pair in pairs for s in ("old", "new")]
        print(f"{shape}: {len(pairs)} pairs, load {min(loads):.1f}-{max(loads):.1f}; CPU s, old -> new (medians), "
              f"per-pair new / old")
        for task in pairs[0]["old"]["cpu"]:
            old = [pair["old"]["cpu"][task] for pair in pairs]
            new = [pair["new"]["cpu"][task] for pair in pairs]
            ratios = ", ".join(f"{n / o:.2f}" for o, n in zip(old, new, strict=True) if o)
            print(f"  {task:12s} {statistics.median(old):6.2f} -> {statistics.median(new):6.2f}   ({ratios})")


if __name__ == "__main__":
    main()
