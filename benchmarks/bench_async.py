"""Async training throughput: ``psflow train`` vs one NumPy process, side by side.

    .venv/bin/python benchmarks/bench_async.py            # ~3-4 minutes on 2 cores

Workload: benchmarks/workload.py (200,000 Criteo-like examples, 39 ids each in
a 2^20 space, LIBSVM, 4 shards), sparse logistic regression, FTRL
(lr 0.1, power -0.5, initial accumulator 0.1), batch 512, one epoch.
Configurations, alternated within each repetition:
    numpy       one process, the same model and FTRL update, no RPC
    psflow 1x2  psflow train, 1 ps + 2 workers (async)
    psflow 2x2  psflow train, 2 ps + 2 workers (async)
    ... tcp     the same two over --transport tcp (the lean carrier)
    in-process  psflow train --in-process (one worker, no RPC, input included)
Rates: training examples / training seconds (for psflow: from each worker's
first batch to its last, the slowest worker; process start-up excluded, shown
separately as end-to-end). Writes benchmarks/results/async.json and the
"async" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_md import replace_section  # noqa: E402
from workload import NUM_IDS, ensure_workload  # noqa: E402

from psflow.data import read_all  # noqa: E402
from psflow.launch.local import run_local  # noqa: E402
from psflow.models.metrics import auc  # noqa: E402
from psflow.train.config import TrainConfig  # noqa: E402

LR, POWER, INIT_ACC, BATCH = 0.1, -0.5, 0.1, 512


def numpy_reference(train: list[str], eval_path: str) -> dict[str, float]:
    t0 = time.perf_counter()
    batch = read_all(train, "libsvm")
    data = batch.column()  # LIBSVM: one sparse feature (CSR rows)
    parse_s = time.perf_counter() - t0
    w = np.zeros(NUM_IDS)
    z = np.zeros(NUM_IDS)
    n = np.full(NUM_IDS, INIT_ACC)
    wb = zb = 0.0
    nb = INIT_ACC
    t1 = time.perf_counter()
    for s in range(0, batch.num_examples, BATCH):
        e = min(s + BATCH, batch.num_examples)
        lo, hi = data.indptr[s], data.indptr[e]
        ids, vals = data.ids[lo:hi], data.values[lo:hi]
        rows = np.repeat(np.arange(e - s), np.diff(data.indptr[s:e + 1]))
        uniq, inv = np.unique(ids, return_inverse=True)
        logit = np.bincount(rows, vals * w[uniq][inv], minlength=e - s) + wb
        d = (1.0 / (1.0 + np.exp(-logit)) - batch.labels[s:e]) / (e - s)
        g = np.bincount(inv, vals * d[rows], minlength=uniq.size)
        n_new = n[uniq] + g * g  # FTRL-Proximal, l1 = l2 = 0, power -0.5 (TF's formula)
        z[uniq] += g - (np.sqrt(n_new) - np.sqrt(n[uniq])) / LR * w[uniq]
        n[uniq] = n_new
        w[uniq] = -z[uniq] * LR / np.sqrt(n_new)
        gb = float(d.sum())
        nb_new = nb + gb * gb
        zb += gb - (np.sqrt(nb_new) - np.sqrt(nb)) / LR * wb
        nb = nb_new
        wb = -zb * LR / np.sqrt(nb)
    train_s = time.perf_counter() - t1
    ev = read_all([eval_path], "libsvm")
    col = ev.column()
    rows = np.repeat(np.arange(ev.num_examples), np.diff(col.indptr))
    score = np.bincount(rows, col.values * w[col.ids], minlength=ev.num_examples) + wb
    return {
        "examples_per_sec": batch.num_examples / train_s,
        "examples_per_sec_with_parse": batch.num_examples / (train_s + parse_s),
        "eval_auc": auc(ev.labels, score),
    }


def psflow_run(train: list[str], eval_path: str, num_ps: int, workdir: str, **kw: object) -> dict[str, float]:
    config = TrainConfig.flat(train=tuple(train), eval=(eval_path,), num_features=NUM_IDS, optimizer="ftrl",
                              learning_rate=LR, batch_size=BATCH, epochs=1, num_ps=num_ps, num_workers=2,
                              log_every=10**9, **kw)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    m = run_local(config, tempfile.mkdtemp(dir=workdir), progress=None)
    wall = time.perf_counter() - t0
    train_s = max(float(r["wall_seconds"]) for r in m.get("workers", m.get("client", [])))
    return {
        "examples_per_sec": m["examples"] / train_s,
        "examples_per_sec_end_to_end": m["examples"] / wall,
        "eval_auc": m["eval"]["auc"],
        "global_step": m["global_step"],
    }


def psflow_in_process(train: list[str], eval_path: str, workdir: str) -> dict[str, float]:
    from psflow.launch.in_process import run_in_process

    config = TrainConfig.flat(train=tuple(train), eval=(eval_path,), num_features=NUM_IDS, optimizer="ftrl",
                              learning_rate=LR, batch_size=BATCH, epochs=1, num_ps=1, num_workers=1, log_every=10**9)
    m = run_in_process(config, tempfile.mkdtemp(dir=workdir))
    return {"examples_per_sec": m["examples_per_sec"], "eval_auc": m["eval"]["auc"], "global_step": m["global_step"]}


def parse_args(doc: str | None) -> argparse.Namespace:
    """The options every throughput benchmark takes."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--examples", type=int, default=200_000)
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "psflow-bench"))
    return p.parse_args()


def main() -> None:
    args = parse_args(__doc__)
    wl = ensure_workload(args.workdir, n_train=args.examples)
    configs = {
        "numpy (1 process, no RPC)": lambda: numpy_reference(wl.train, wl.eval),
        "psflow in-process (1 worker, no RPC, input included)": lambda: psflow_in_process(wl.train, wl.eval, args.workdir),
        "psflow 1 ps + 2 workers": lambda: psflow_run(wl.train, wl.eval, 1, args.workdir),
        "psflow 2 ps + 2 workers": lambda: psflow_run(wl.train, wl.eval, 2, args.workdir),
        "psflow 1 ps + 2 workers, --transport tcp": lambda: psflow_run(wl.train, wl.eval, 1, args.workdir, transport="tcp"),
        "psflow 2 ps + 2 workers, --transport tcp": lambda: psflow_run(wl.train, wl.eval, 2, args.workdir, transport="tcp"),
    }
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in configs}
    for rep in range(args.repeats):
        for name, fn in configs.items():
            r = fn()
            runs[name].append(r)
            print(f"[{rep + 1}/{args.repeats}] {name}: {r['examples_per_sec']:,.0f} examples/s, AUC {r['eval_auc']:.4f}",
                  flush=True)
    base = statistics.median(r["examples_per_sec"] for r in runs["numpy (1 process, no RPC)"])
    lines = [
        "| configuration | examples/s (median) | min–max | ratio to numpy | eval AUC |",
        "|---|---|---|---|---|",
    ]
    for name, rs in runs.items():
        rates = [r["examples_per_sec"] for r in rs]
        med = statistics.median(rates)
        lines.append(f"| {name} | {med:,.0f} | {min(rates):,.0f}–{max(rates):,.0f} | {med / base:.2f} | "
                     f"{statistics.median(r['eval_auc'] for r in rs):.4f} |")
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    with open(os.path.join(os.path.dirname(__file__), "results", "async.json"), "w") as f:
        json.dump({"examples": wl.examples, "repeats": args.repeats, "runs": runs}, f, indent=1)
    body = "\n".join([
        f"Command: `.venv/bin/python benchmarks/bench_async.py --repeats {args.repeats} --examples {args.examples}` "
        f"({time.strftime('%Y-%m-%d')}, 2 cores, configurations alternated in each repetition).",
        "",
        *lines,
    ])
    replace_section("async", body)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
