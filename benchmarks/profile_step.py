"""Where a training step's time goes: one worker against real ps processes.

    .venv/bin/python benchmarks/profile_step.py [--ps 1] [--steps 300]

Starts the ps tasks as real processes (gRPC on 127.0.0.1), runs one worker's
loop in this process on the sparse-LR workload (benchmarks/workload.py,
batch 512, FTRL) and times each phase of every step with perf_counter:
    input      next batch from the dataset (parse + batch; prefetch on)
    unique     the model's prepare step (fold and unique the batch's ids)
    pull       the pull RPCs (client encode + wire + ps read + decode)
    compute    forward and backward in numpy
    push       the push RPCs (client encode + wire + ps optimizer apply)
Two variants, alternated in blocks of 50 steps in the same run:
    before     a Pull RPC and a Push RPC per step
    after      one PushPull RPC per step that pushes this step's gradient and
               pulls the next step's rows (the lookahead TrainStep uses)
(Results recorded before the model seam compared np.unique with the lookup-table
unique as well; the model's prepare step now always uses the latter.)
Prints a table (ms per step) and writes benchmarks/results/profile_step.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_md import replace_section  # noqa: E402
from workload import NUM_IDS, ensure_workload  # noqa: E402

from psflow.data import DatasetConfig, open_dataset  # noqa: E402
from psflow.launch.processes import LocalCluster  # noqa: E402
from psflow.train.build import build_model  # noqa: E402
from psflow.train.config import TrainConfig  # noqa: E402
from psflow.train.worker import connect_client  # noqa: E402

PHASES = ("input", "unique", "pull", "compute", "push")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ps", type=int, default=1)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "psflow-bench"))
    args = p.parse_args()
    wl = ensure_workload(args.workdir)
    config = TrainConfig.flat(train=tuple(wl.train), num_features=NUM_IDS, optimizer="ftrl", learning_rate=0.1,
                              num_ps=args.ps, num_workers=1)
    out = tempfile.mkdtemp(dir=args.workdir)
    config_path = os.path.join(out, "config.json")
    with open(config_path, "w") as f:
        f.write(config.to_json())
    variants = {"before": {k: 0.0 for k in PHASES}, "after": {k: 0.0 for k in PHASES}}
    totals = {"before": 0.0, "after": 0.0}
    counts = {"before": 0, "after": 0}
    with LocalCluster.create(args.ps, 1, out) as lc:
        for i in range(args.ps):
            lc.start_task("ps", i, config_path)
        model, variables = build_model(config, lc.cluster)
        client = connect_client(config, lc.cluster, variables, "/job:worker/task:0", lc.token)
        data = open_dataset(DatasetConfig(tuple(wl.train), "libsvm", batch_size=512, num_epochs=None), start=True)
        it = iter(data)
        # Alternate blocks of 50 steps so both variants see the same machine load.
        for block in range(2 * args.steps // 50):
            name = "before" if block % 2 == 0 else "after"
            ph, t_block = variants[name], time.perf_counter()
            pulled, pending = None, None
            for _ in range(50):
                t0 = time.perf_counter()
                batch = next(it) if pending is None else pending
                t1 = time.perf_counter()
                if name == "before":
                    prepared = model.prepare(batch)
                    t2 = time.perf_counter()
                    pulled = client.pull(model.lookups(prepared))
                    t3 = time.perf_counter()
                    out = model.compute(prepared, pulled)
                    t4 = time.perf_counter()
                    client.push(out.gradients, examples=batch.num_examples, loss=out.loss)
                else:
                    if pulled is None:
                        prepared = model.prepare(batch)
                        pulled = client.pull(model.lookups(prepared))
                    t2 = t3 = time.perf_counter()
                    out = model.compute(prepared, pulled)
                    t4 = time.perf_counter()
                    pending = next(it)  # the lookahead batch (its read time counts as unique here; ~0.02 ms)
                    prepared = model.prepare(pending)
                    t3b = time.perf_counter()
                    _, pulled = client.push_pull(out.gradients, model.lookups(prepared), examples=batch.num_examples,
                                                 loss=out.loss)
                    ph["unique"] += t3b - t4
                    t4 = t3b
                t5 = time.perf_counter()
                for k, a, b in (("input", t0, t1), ("unique", t1, t2), ("pull", t2, t3), ("compute", t3, t4),
                                ("push", t4, t5)):
                    ph[k] += b - a
            totals[name] += time.perf_counter() - t_block
            counts[name] += 50
        data.close()
        client.close()
    result: dict[str, object] = {"ps": args.ps}
    print(f"{args.ps} ps, batch 512, one worker against real ps processes; blocks of 50 steps alternated")
    print("| phase | before: ms/step | after: ms/step |\n|---|---:|---:|")
    per = {n: {k: v / counts[n] * 1e3 for k, v in variants[n].items()} for n in variants}
    for k in PHASES:
        label = k if k != "push" else "push (after: push+pull of next step, one RPC)"
        print(f"| {label} | {per['before'][k]:.3f} | {per['after'][k]:.3f} |")
    for n in variants:
        ms = totals[n] / counts[n] * 1e3
        result[n] = {"ms_per_step": ms, "examples_per_s": 512 / ms * 1e3, "phases_ms": per[n]}
    total = f"| **total** | {result['before']['ms_per_step']:.3f} | {result['after']['ms_per_step']:.3f} |"  # type: ignore[index]
    print(total)
    rows = [f"| {k if k != 'push' else 'push (after: push + pull of the next step, one RPC)'} | "
            f"{per['before'][k]:.3f} | {per['after'][k]:.3f} |" for k in PHASES]
    replace_section("profile", "\n".join([
        f"Command: `.venv/bin/python benchmarks/profile_step.py --ps {args.ps} --steps {args.steps}` "
        f"({time.strftime('%Y-%m-%d')}). One worker in this process against a real ps process over gRPC, "
        "sparse-LR batch 512 (19,968 ids), FTRL; blocks of 50 steps of each variant alternated. "
        "before = a Pull RPC and a Push RPC; after = one PushPull RPC (push + the next step's pull).",
        "",
        "| phase (ms per step) | before | after |",
        "|---|---:|---:|",
        *rows,
        total,
        "",
        "Phase times include contention for the GIL with the input thread, which parses the next batches while the main "
        "thread waits on an RPC: with fewer round trips (after) more of its parsing lands inside `compute` "
        "(0.16 ms alone, measured apart). The total is what counts.",
        "",
        "The carrier, measured separately (same process, alternated, median of 6 x 100 calls, 20,000 rows): one PushPull "
        "took 1.10 ms over gRPC and 0.71 ms over `--transport tcp`; the ps handler itself is ~0.35 ms of that.",
    ]))
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    with open(os.path.join(os.path.dirname(__file__), "results", "profile_step.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
