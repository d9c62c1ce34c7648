"""Scaling measurements for benchmarks/SCALING.md: 1-3 workers x 1-3 ps tasks.

    .venv/bin/python benchmarks/bench_scaling.py [--examples 100000] [--transport grpc]

For each cluster shape, one async epoch of the sparse-LR workload
(benchmarks/workload.py: 39 ids per example in 2^20, batch 512, FTRL) with
``psflow train``; records examples/s (slowest worker's first-to-last batch),
the CPU seconds each process used while training (its own time.process_time()
after start-up, reported in its result or Stats),
the global steps and the ps tasks' byte and row counters. From these:
worker CPU per step, ps CPU per step (all ps tasks together) and per row,
bytes on the wire per step. Writes benchmarks/results/scaling.json; the
model built on them is in SCALING.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workload import NUM_IDS, ensure_workload  # noqa: E402

from psflow.launch.local import run_local  # noqa: E402
from psflow.train.config import TrainConfig  # noqa: E402


def run_shape(train: list[str], workers: int, ps: int, transport: str, workdir: str) -> dict[str, Any]:
    config = TrainConfig.flat(train=tuple(train), num_features=NUM_IDS, optimizer="ftrl", learning_rate=0.1, batch_size=512,
                              epochs=1, num_ps=ps, num_workers=workers, log_every=10**9, transport=transport)
    m = run_local(config, tempfile.mkdtemp(dir=workdir), progress=None)
    steps = int(m["global_step"])
    train_s = max(float(w["wall_seconds"]) for w in m["workers"])
    # CPU spent while training: each worker after its start-up, each ps task after the chief's initialization.
    worker_cpu = sum(float(w["train_cpu_seconds"]) for w in m["workers"])
    ps_cpu = sum(float(p["cpu_seconds_since_init"] or 0.0) for p in m["ps"])
    rows = sum(int(p["rows_pulled"]) + int(p["rows_pushed"]) for p in m["ps"])
    wire = sum(int(p["bytes_in"]) + int(p["bytes_out"]) for p in m["ps"])
    return {
        "workers": workers, "ps": ps, "transport": transport, "examples_per_sec": m["examples"] / train_s,
        "steps": steps, "steps_per_sec": steps / train_s,
        "worker_cpu_ms_per_step": worker_cpu / steps * 1e3, "ps_cpu_ms_per_step": ps_cpu / steps * 1e3,
        "ps_cpu_us_per_row": ps_cpu / max(rows, 1) * 1e6, "rows_per_step": rows / steps,
        "wire_bytes_per_step": wire / steps,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", type=int, default=100_000)
    p.add_argument("--transport", default="grpc", choices=["grpc", "tcp"])
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "psflow-bench"))
    args = p.parse_args()
    wl = ensure_workload(args.workdir, n_train=args.examples)
    rows = []
    for workers in (1, 2, 3):
        for ps in (1, 2, 3):
            r = run_shape(wl.train, workers, ps, args.transport, args.workdir)
            rows.append(r)
            print(f"{workers} workers x {ps} ps: {r['examples_per_sec']:,.0f} ex/s, worker CPU "
                  f"{r['worker_cpu_ms_per_step']:.2f} ms/step, ps CPU {r['ps_cpu_ms_per_step']:.2f} ms/step "
                  f"({r['ps_cpu_us_per_row']:.3f} us/row), {r['wire_bytes_per_step'] / 1e3:.0f} kB/step", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    with open(os.path.join(os.path.dirname(__file__), "results", f"scaling-{args.transport}.json"), "w") as f:  # noqa: PTH123
        json.dump({"commit": commit, "examples": args.examples, "date": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
