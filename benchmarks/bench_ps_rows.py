"""What issue 29's W&D requests cost a ps task's store, without sockets or workers: CPU per request.

    .venv/bin/python benchmarks/bench_ps_rows.py [--workdir /tmp/tf_peer] [--batches 200] [--rounds 3]
        [--baseline-src DIR]

Builds the W&D model's 52 lazy tables as a ps task does (26 deep ``[2^20, 8]`` truncated-normal tables under
Adagrad, 26 wide ``[2^20, 1]`` zero tables under FTRL, psflow's defaults) and replays the first ``--batches``
batches of 512 examples of ``<workdir>/data/ctr_wd`` (bench_tf_peer_wd.py generates it): each request reads
every table's distinct rows of the batch (the service's read path: ``materialize_together`` where the
psflow imported has it, then one ``read`` per table, told which tables it built), then applies a sparse gradient to the same rows. The ids
are the TSV's hex values spread over the table by a multiplicative hash (not psflow's Criteo hashing: the
store sees the same number of distinct rows, spread as uniformly). Reported: the thread's CPU per request
(reads, builds, applies), and the read part alone.

``--baseline-src DIR``: also run a psflow source tree (e.g. a bench_ab snapshot, ``/tmp/tf_peer/psflow-src/<commit>-compiled``)
in its own processes, alternated with this tree's, ``--rounds`` times each, and print the ratio of the medians.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

ROWS, DIM, BATCH = 1 << 20, 8, 512


def _batches(workdir: str, count: int) -> list[np.ndarray]:
    """``count`` batches of ``[512, 26]`` row ids (int64)."""
    ids: list[list[int]] = []
    for path in sorted(glob.glob(os.path.join(workdir, "data", "ctr_wd", "train-*.tsv"))):
        with open(path) as f:
            for line in f:
                cols = line.rstrip("\n").split("\t")[14:40]
                ids.append([int(c, 16) if c else 0xFFFFFFFF for c in cols])
                if len(ids) >= count * BATCH:
                    break
        if len(ids) >= count * BATCH:
            break
    raw = np.array(ids, dtype=np.uint64) + np.arange(26, dtype=np.uint64) * np.uint64(1 << 32)
    with np.errstate(over="ignore"):
        rows = ((raw * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(44)).astype(np.int64)  # 20 bits
    return [rows[i * BATCH:(i + 1) * BATCH] for i in range(len(rows) // BATCH)]


def measure(workdir: str, count: int) -> dict[str, float]:
    """One process's run: CPU per request (ms), reads alone and reads + applies."""
    from psflow.optim import OptimizerSpec
    from psflow.ps.optimizers import make_optimizer
    from psflow.ps.store import ParameterStore

    store = ParameterStore()
    deep = make_optimizer(OptimizerSpec("adagrad", {"learning_rate": 0.05}))
    wide = make_optimizer(OptimizerSpec("ftrl", {"learning_rate": 0.05}))
    parts = []
    for i in range(26):
        parts.append(store.create(f"wide/C{i + 1}", 0, (ROWS, 1), 0, ROWS, "float32", {"name": "zeros"}, wide))
    for i in range(26):
        spec = {"name": "truncated_normal", "stddev": 1 / np.sqrt(DIM), "seed": i}
        parts.append(store.create(f"deep/emb_C{i + 1}", 0, (ROWS, DIM), 0, ROWS, "float32", spec, deep))
    together = getattr(store, "materialize_together", None)
    rng = np.random.default_rng(0)
    read_cpu = total_cpu = 0.0
    batches = _batches(workdir, count)  # fewer than count where the data ends first
    for step, batch in enumerate(batches):
        wanted = [(part, np.unique(batch[:, i % 26])) for i, part in enumerate(parts)]
        grads = [rng.standard_normal((rows.size, *part.value.shape[1:])).astype(np.float32) for part, rows in wanted]
        t0 = time.thread_time()
        built = together(wanted) if together is not None else None  # (None: a psflow where it returns nothing)
        for part, rows in wanted:
            if built is None:
                store.read(part, rows)
            else:
                store.read(part, rows, built=part.key in built)
        t1 = time.thread_time()
        for (part, rows), grad in zip(wanted, grads, strict=True):
            store.apply_sparse(part, rows, grad, step=step)
        t2 = time.thread_time()
        read_cpu += t1 - t0
        total_cpu += t2 - t0
    n = len(batches)
    return {"read_ms": 1e3 * read_cpu / n, "request_ms": 1e3 * total_cpu / n}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default=os.environ.get("TF_PEER_WORKDIR", "/tmp/tf_peer"))
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--baseline-src", default=None)
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child process: print one run's JSON
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args.workdir, args.batches)))
        return
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sides = {"this": here, **({"baseline": args.baseline_src} if args.baseline_src else {})}
    got: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for r in range(args.rounds):
        for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", "--workdir", args.workdir,
                                  "--batches", str(args.batches)], cwd=sides[name], env=dict(os.environ, PYTHONPATH=sides[name]),
                                 capture_output=True, text=True, check=True)
            got[name].append(json.loads(out.stdout))
            print(f"round {r + 1} {name}: {got[name][-1]}", flush=True)
    for key in ("read_ms", "request_ms"):
        med = {name: statistics.median(run[key] for run in runs) for name, runs in got.items()}
        line = ", ".join(f"{name} {value:.3f}" for name, value in med.items())
        ratio = f"; this / baseline {med['this'] / med['baseline']:.3f}" if "baseline" in med else ""
        print(f"{key} (median of {args.rounds}): {line}{ratio}")


if __name__ == "__main__":
    main()
