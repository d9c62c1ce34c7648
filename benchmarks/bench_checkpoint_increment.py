"""Incremental against full checkpoint: bytes and seconds of each save after 100 steps (issue 29's goal: <= 10%).

One command::

    python benchmarks/bench_checkpoint_increment.py [--rows 1048576] [--tables 26] [--dim 8] [--steps 100]
        [--batch 512] [--dir DIR] [--out FILE.json]

One ps task in this process (a :class:`~psflow.ps.service.ParameterService`, called through its handlers: no
sockets, ``transport="local"``: the task writes its shard file itself) holds ``--tables`` tables of
``--rows`` x ``--dim`` float32 under Adagrad (lazy rows: created in O(1)). A checkpoint manager with
``full_every=10`` saves the first (full) checkpoint; then ``--steps`` steps each push a sparse gradient of
``--batch`` random ids (uniform over the rows) to every table; then that manager saves an increment, and a second
manager (``full_every=1``, another directory) a full checkpoint of the same state. Printed: each save's
bytes (the manifest's shard sizes) and wall seconds, and their ratios; the increment restored through its chain
is checked against the full checkpoint (every variable and slot, bit for bit) unless ``--no-check``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from psflow.checkpoint.manifest import read_manifest  # noqa: E402
from psflow.checkpoint.save import CheckpointManager  # noqa: E402
from psflow.checkpoint.variables import read_variables  # noqa: E402
from psflow.cluster import ClusterSpec  # noqa: E402
from psflow.optim import OptimizerSpec  # noqa: E402
from psflow.placement import VariableSet, replica_device_setter  # noqa: E402
from psflow.ps.service import ParameterService  # noqa: E402
from psflow.rpc.api import ConnectConfig  # noqa: E402
from psflow.rpc.framing import Frame  # noqa: E402


class _Done:
    def __init__(self, frame: Frame) -> None:
        self.frame = frame

    def result(self) -> Frame:
        return self.frame


class InProcess:
    """The surface of a ParameterClient the checkpoint manager uses, over one in-process ps task."""

    def __init__(self, tables: int, rows: int, dim: int) -> None:
        self.cluster = ClusterSpec({"ps": ["127.0.0.1:1"]})
        vs = VariableSet(replica_device_setter(cluster=self.cluster))
        for t in range(tables):
            vs.get_variable(f"emb{t}", (rows, dim), initializer={"name": "random_normal", "stddev": 0.01, "seed": t})
        self.layout = {p.var.name: p for p in vs.placements()}
        self.client_name, self.step_task = "bench", 0
        self.config = ConnectConfig()  # its save_timeout: a shard save's deadline
        self.service = ParameterService(0, holds_global_step=True)
        self.handlers = self.service.handlers()
        self.channels = {0: self.handlers}
        optimizer = OptimizerSpec("adagrad", {"learning_rate": 0.05}).to_json()
        self.handlers["Register"](Frame({"layout": [p.to_json() for p in self.layout.values()],
                                         "optimizer": optimizer, "chief": True}))

    def global_step(self) -> int:
        gs = self.service.global_step
        return gs.value if gs is not None else 0

    def call_async(self, task: int, request: Any, **kw: Any) -> _Done:
        frame = request.to_frame()
        meta, arrays = self.handlers[request.METHOD](frame)
        return _Done(Frame(meta, arrays))

    def call(self, task: int, request: Any, **kw: Any) -> Frame:
        return self.call_async(task, request).result()

    def step(self, rng: np.random.Generator, batch: int, rows: int, dim: int) -> None:
        entries, arrays = [], {}
        for name in self.layout:
            key = f"{name}/part_0"
            ids = np.unique(rng.integers(0, rows, batch)).astype(np.int64)
            entries.append([key, "sparse"])
            arrays[f"g/{key}"] = rng.standard_normal((ids.size, dim)).astype(np.float32)
            arrays[f"i/{key}"] = ids
        self.handlers["Push"](Frame({"grads": entries, "step": True, "step_hint": self.global_step()}, arrays))


def _timed_save(manager: CheckpointManager, client: InProcess) -> tuple[str, float, int]:
    started = time.perf_counter()
    path = manager.save(client).path  # type: ignore[arg-type]
    seconds = time.perf_counter() - started
    return path, seconds, sum(s["bytes"] for s in read_manifest(path).shards)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1 << 20)
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--dir", help="where the checkpoints go (default: a temp directory, removed)")
    parser.add_argument("--out", help="also write the figures as JSON here")
    parser.add_argument("--no-check", action="store_true", help="skip the bit-for-bit comparison")
    args = parser.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="psflow-bench-ckpt-")
    try:
        client = InProcess(args.tables, args.rows, args.dim)
        rng = np.random.default_rng(0)
        incremental = CheckpointManager(os.path.join(root, "inc"), full_every=10)
        first, first_s, first_b = _timed_save(incremental, client)
        for _ in range(args.steps):
            client.step(rng, args.batch, args.rows, args.dim)
        inc, inc_s, inc_b = _timed_save(incremental, client)
        full, full_s, full_b = _timed_save(CheckpointManager(os.path.join(root, "full")), client)
        assert read_manifest(inc).kind == "increment" and read_manifest(full).kind == "full"
        result = {"tables": args.tables, "rows": args.rows, "dim": args.dim, "steps": args.steps, "batch": args.batch,
                  "global_step": read_manifest(inc).global_step,
                  "first_full": {"bytes": first_b, "seconds": round(first_s, 3)},
                  "increment": {"bytes": inc_b, "seconds": round(inc_s, 3)},
                  "full": {"bytes": full_b, "seconds": round(full_s, 3)},
                  "bytes_ratio": round(inc_b / full_b, 4), "seconds_ratio": round(inc_s / full_s, 4)}
        if not args.no_check:
            a, b = read_variables(inc, slots=True), read_variables(full, slots=True)
            result["bit_equal"] = sorted(a) == sorted(b) and all(a[k].tobytes() == b[k].tobytes() for k in a)
        print(f"| save | bytes | seconds |\n|---|---:|---:|\n"
              f"| full (step 0) | {first_b:,} | {first_s:.3f} |\n"
              f"| increment after {args.steps} steps | {inc_b:,} | {inc_s:.3f} |\n"
              f"| full, same step | {full_b:,} | {full_s:.3f} |\n"
              f"| increment / full | {result['bytes_ratio']:.2%} | {result['seconds_ratio']:.2%} |")
        if "bit_equal" in result:
            print(f"increment read through its chain == full checkpoint, every variable and slot: {result['bit_equal']}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
