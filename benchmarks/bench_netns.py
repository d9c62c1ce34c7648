"""Sparse-LR throughput with each task in its own network namespace vs all on loopback: the ratio.

    sudo .venv/bin/python benchmarks/bench_netns.py [--pairs 3] [--epochs 2] [--rate 1gbit]   # ~2 min on 2 cores
    sudo .venv/bin/python benchmarks/bench_netns.py --delay 1 [--pairs 3] [--steps-in-flight 1,2]  # latency

Needs root (network namespaces; tests/netns.py). Runs ``psflow train``'s
launcher (:func:`psflow.launch.local.run_local`) on a9a (logistic regression,
FTRL, 2 ps + 2 workers, ``--transport tcp``, batch 512) ``--pairs`` times on
each side, alternating (the order flipped every other pair, so machine drift
hits both sides about equally): once every task on 127.0.0.1, once each task
in its own namespace on its own address behind a veth and one bridge
(:class:`psflow.launch.processes.TaskHosts`), optionally with ``tc tbf`` at
``--rate`` on every link. Reports each run's examples/s (metrics.json's,
the exactly-once count over the training time) and the median of the
per-pair ratios ``netns / loopback``. With ``--delay``, the latency benchmark
instead (:mod:`netns_delay`: sparse LR through the delaying relay, ratios to the
same relay at 0 ms and to loopback). Writes benchmarks/results/netns.json and
the "netns" section of benchmarks/RESULTS.md (the tracked results); with
``--output FILE``, only FILE (a trial run leaves the tracked results alone).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, HERE)

import netns_delay  # noqa: E402
from netns import NetnsLab, netns_available  # noqa: E402
from results_md import replace_section  # noqa: E402

from psflow.launch.local import run_local  # noqa: E402
from psflow.launch.processes import TaskHosts  # noqa: E402
from psflow.status.server import StatusConfig  # noqa: E402
from psflow.train.config import TrainConfig  # noqa: E402

TASKS = [("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1)]
#: The tracked results: written (with RESULTS.md's section) when no --output is given.
TRACKED_JSON = os.path.join(HERE, "results", "netns.json")


def _config(epochs: int) -> TrainConfig:
    return TrainConfig.flat(train=(os.path.join(REPO, "data", "a9a", "a9a"),), num_features=124, num_ps=2, num_workers=2,
                            epochs=epochs, batch_size=512, transport="tcp", optimizer="ftrl")


def _run(side: str, epochs: int, rate: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-netns-") as out:
        if side == "loopback":
            metrics = run_local(_config(epochs), out, progress=None, status=StatusConfig(enabled=False))
        else:
            with NetnsLab([f"{job}{i}" for job, i in TASKS]) as lab:
                if rate:
                    for host in lab.hosts:
                        lab.limit_rate(host, rate)
                placement = TaskHosts(
                    hosts={t: lab.hosts[f"{t[0]}{t[1]}"].address for t in TASKS},
                    prefixes={t: ("ip", "netns", "exec", lab.hosts[f"{t[0]}{t[1]}"].netns) for t in TASKS})
                metrics = run_local(_config(epochs), out, progress=None, status=StatusConfig(enabled=False),
                                    placement=placement)
    return {"side": side, "examples_per_sec": metrics["examples_per_sec"], "wall_seconds": metrics["wall_seconds"],
            "examples": metrics["examples"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--rate", help="tc tbf rate on every namespace link (e.g. 1gbit); default: none")
    p.add_argument("--output", metavar="FILE", help="write the results (JSON) here, and nothing else; default: the "
                   "tracked benchmarks/results/netns.json and the netns section of benchmarks/RESULTS.md")
    netns_delay.add_arguments(p)
    args = p.parse_args(argv)
    why = netns_available()
    if why is not None:
        print(f"bench_netns: {why}", file=sys.stderr)
        return 1
    if args.delay is not None:
        return netns_delay.main(args)
    runs, ratios = [], []
    for pair in range(args.pairs):
        order = ["loopback", "netns"] if pair % 2 == 0 else ["netns", "loopback"]
        done = {side: _run(side, args.epochs, args.rate) for side in order}
        runs += [done[s] for s in order]
        ratios.append(done["netns"]["examples_per_sec"] / done["loopback"]["examples_per_sec"])
        print(f"pair {pair + 1}: loopback {done['loopback']['examples_per_sec']:,.0f} ex/s, "
              f"netns {done['netns']['examples_per_sec']:,.0f} ex/s, ratio {ratios[-1]:.3f}", flush=True)
    result = {
        "workload": f"a9a sparse LR (FTRL), 2 ps + 2 workers, --transport tcp, batch 512, {args.epochs} epochs",
        "rate": args.rate, "pairs": args.pairs, "median_ratio_netns_over_loopback": statistics.median(ratios),
        "ratios": ratios, "runs": runs, "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    output = args.output or TRACKED_JSON
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as f:
        json.dump(result, f, indent=1)
    if args.output is None:
        replace_section("netns", _markdown(result, args))
    print(f"median ratio netns/loopback {result['median_ratio_netns_over_loopback']:.3f}; results: {output}")
    return 0


def _markdown(result: dict[str, Any], args: argparse.Namespace) -> str:
    """The netns section of RESULTS.md."""
    ratios, runs = result["ratios"], result["runs"]
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    median_eps = {side: statistics.median(r["examples_per_sec"] for r in runs if r["side"] == side)
                  for side in ("loopback", "netns")}
    return "\n".join([
        f"Command: `benchmarks/bench_netns.py --pairs {args.pairs} --epochs {args.epochs}"
        f"{' --rate ' + args.rate if args.rate else ''}` ({result['date']}): {result['workload']}; each task in its "
        "own network namespace (veth + bridge) vs all on 127.0.0.1, alternated pairs.", "",
        "| netns / loopback, median of pair ratios | quartiles | loopback examples/s, median | netns examples/s, median |",
        "|---:|---|---:|---:|",
        f"| {result['median_ratio_netns_over_loopback']:.3f} | {q[0]:.3f}–{q[2]:.3f} | {median_eps['loopback']:,.0f} | "
        f"{median_eps['netns']:,.0f} |"])


if __name__ == "__main__":
    sys.exit(main())
