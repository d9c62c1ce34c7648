"""psflow against an earlier psflow: many alternated pairs, the median of their ratios.

    .venv/bin/python benchmarks/bench_ab.py --baseline-rev 67f07c5 [--rev HEAD] [--pairs 12]   # ~12 min on 2 cores

On a shared 2-core machine the speed of the same code swings by 1.5x within
minutes, so a few repetitions of each side cannot show a 10% difference. This
runs the same work as benchmarks/bench_tf_peer.py's psflow rows (one epoch of
the 400,000-example sparse-LR TFRecord workload: the in-process fast path,
1 ps + 2 workers async and sync, 2 ps + 2 workers async) at two git
revisions, as fresh child processes (bench_tf_peer.py's ``--child`` mode),
``--pairs`` times per shape, the order flipped every other pair, and reports
the median and quartiles of the per-pair ratios ``rev / baseline``: machine
drift hits both runs of a pair about equally.

Needs the workload bench_tf_peer.py generates with TensorFlow's harness
(``<workdir>/data/sparse_lr``). Writes benchmarks/results/ab.json and the
"ab" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_tf_peer import extract_psflow  # noqa: E402
from results_md import replace_section  # noqa: E402

#: (row, child request kind, spec after the data dir and format)
SHAPES = [
    ("in-process fast path", "fast", []),
    ("1 ps + 2 workers, async", "cluster", [1, "async"]),
    ("1 ps + 2 workers, sync", "cluster", [1, "sync"]),
    ("2 ps + 2 workers, async", "cluster", [2, "async"]),
]


def one_run(src: str, kind: str, spec: list[object], args: argparse.Namespace) -> float:
    request = {"kind": kind, "spec": [args.data, "tfrecord", *spec], "workdir": args.workdir,
               "sync_averaging": "sparse_sum", "psflow_transport": "tcp"}
    p = subprocess.run([sys.executable, os.path.join(HERE, "bench_tf_peer.py"), "--child", json.dumps(request)], cwd=src,
                       env=dict(os.environ, PYTHONPATH=src), capture_output=True, text=True, timeout=600)
    lines = p.stdout.strip().splitlines()
    run = json.loads(lines[-1]) if p.returncode == 0 and lines else {"failed": True}
    if run.get("failed"):
        raise RuntimeError(f"{src}: {kind} {spec} failed: {(p.stdout + p.stderr)[-800:]}")
    return float(run["examples_per_sec"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rev", default="HEAD", help="the revision measured")
    p.add_argument("--baseline-rev", required=True, help="the revision it is compared with")
    p.add_argument("--pairs", type=int, default=12, help="alternated pairs per shape")
    p.add_argument("--workdir", default=os.environ.get("TF_PEER_WORKDIR", "/tmp/tf_peer"))
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    args.data = os.path.join(args.workdir, "data", "sparse_lr")
    if not os.path.exists(os.path.join(args.data, "manifest.json")):
        p.error(f"no workload in {args.data}: run benchmarks/bench_tf_peer.py --tf-venv ... once (it generates it)")
    revs = {name: extract_psflow(rev, args.workdir) for name, rev in (("rev", args.rev), ("baseline", args.baseline_rev))}
    results = []
    for row, kind, spec in SHAPES:
        ratios, rates = [], {"rev": [], "baseline": []}
        for k in range(args.pairs):
            got = {}
            for name in (("rev", "baseline") if k % 2 == 0 else ("baseline", "rev")):
                got[name] = one_run(revs[name][1], kind, spec, args)
                rates[name].append(got[name])
            ratios.append(got["rev"] / got["baseline"])
            print(f"[{row} {k + 1}/{args.pairs}] rev {got['rev']:,.0f} baseline {got['baseline']:,.0f} "
                  f"ratio {ratios[-1]:.3f}", flush=True)
        q = statistics.quantiles(ratios, n=4)
        results.append({"shape": row, "ratios": ratios, "rates": rates, "median": statistics.median(ratios),
                        "quartiles": [q[0], q[2]]})
    lines = [f"Command: `benchmarks/bench_ab.py {' '.join(sys.argv[1:])}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}). "
             f"psflow at {args.rev} = {revs['rev'][0][:10]} against {args.baseline_rev} = {revs['baseline'][0][:10]}: "
             f"{args.pairs} alternated pairs per shape, each one epoch of the tf_peer sparse-LR TFRecord workload "
             "(as bench_tf_peer.py's psflow rows, `--transport tcp`); fresh child processes.", "",
             "| shape | rev / baseline, median of pair ratios | quartiles | rev examples/s, median | baseline examples/s, median |",
             "|---|---:|---|---:|---:|"]
    for r in results:
        lines.append(f"| {r['shape']} | {r['median']:.3f} | {r['quartiles'][0]:.3f}–{r['quartiles'][1]:.3f} | "
                     f"{statistics.median(r['rates']['rev']):,.0f} | {statistics.median(r['rates']['baseline']):,.0f} |")
    print("\n".join(lines))
    if not args.no_write:
        with open(os.path.join(HERE, "results", "ab.json"), "w") as f:
            json.dump({"rev": revs["rev"][0], "baseline": revs["baseline"][0], "results": results}, f, indent=1)
        replace_section("ab", "\n".join(lines))


if __name__ == "__main__":
    main()
