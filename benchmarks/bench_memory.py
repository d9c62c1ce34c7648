"""ps memory per parameter: resident bytes of a ps task vs the raw bytes of its arrays.

    .venv/bin/python benchmarks/bench_memory.py [--rows 8388608]

Starts one real ps process, reads its resident set (VmRSS from /proc) before
the variables exist, after the chief registers a [rows, 1] float32 weight
table with FTRL (variable + 'accum' + 'linear' slots = 12 bytes per
parameter), and after 200 training pushes of 20,000 rows each (sparse
updates must not grow it). Reports the ratio of the growth to the raw array
bytes (target: <= 1.2). Writes the "memory" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_md import replace_section  # noqa: E402

from psflow.gradients import DenseGradient, SparseGradient  # noqa: E402
from psflow.launch.local import LocalCluster  # noqa: E402
from psflow.train.build import build_model  # noqa: E402
from psflow.train.config import TrainConfig  # noqa: E402
from psflow.train.worker import connect_client  # noqa: E402


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=1 << 23)
    args = p.parse_args()
    config = TrainConfig(train=("unused",), num_features=args.rows, optimizer="ftrl", learning_rate=0.1,
                         num_ps=1, num_workers=1)
    out = tempfile.mkdtemp(prefix="psflow-mem-")
    config_path = os.path.join(out, "config.json")
    with open(config_path, "w") as f:
        f.write(config.to_json())
    with LocalCluster.create(1, 1, out) as lc:
        ps = lc.start_task("ps", 0, config_path)
        model, variables = build_model(config, lc.cluster)
        client = connect_client(config, lc.cluster, variables, "/job:worker/task:0", lc.token, register=False)
        time.sleep(0.5)
        before = rss(ps.popen.pid)
        client.register(config.optimizer_spec(), chief=True)
        after_init = rss(ps.popen.pid)
        rng = np.random.default_rng(0)
        for _ in range(200):
            rows = np.unique(rng.integers(0, args.rows, 20_000))
            client.push({"weights": SparseGradient(rows, rng.normal(size=(rows.size, 1)).astype(np.float32)),
                         "bias": DenseGradient(np.ones(1, np.float32))})
        after_training = rss(ps.popen.pid)
        stats = client.stats()
        client.close()
    raw = args.rows * 4 * 3  # float32 variable + accum + linear
    result = {
        "rows": args.rows, "raw_bytes": raw, "parameter_bytes_reported": stats["parameter_bytes"],
        "rss_before": before, "rss_after_init": after_init, "rss_after_training": after_training,
        "ratio_after_init": (after_init - before) / raw, "ratio_after_training": (after_training - before) / raw,
    }
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    with open(os.path.join(os.path.dirname(__file__), "results", "memory.json"), "w") as f:
        json.dump(result, f, indent=1)
    body = "\n".join([
        f"Command: `.venv/bin/python benchmarks/bench_memory.py --rows {args.rows}` ({time.strftime('%Y-%m-%d')}). "
        f"One ps task, a [{args.rows:,}, 1] float32 table with FTRL (variable + accum + linear = 12 bytes/parameter).",
        "",
        "| | resident bytes | growth / raw array bytes |",
        "|---|---:|---:|",
        f"| ps before registration | {before:,} | |",
        f"| after the chief initialized | {after_init:,} | {result['ratio_after_init']:.3f} |",
        f"| after 200 pushes of ~20,000 rows | {after_training:,} | {result['ratio_after_training']:.3f} |",
        f"| raw arrays (rows x 12 bytes) | {raw:,} | 1.000 |",
    ])
    replace_section("memory", body)
    print(body)


if __name__ == "__main__":
    main()
