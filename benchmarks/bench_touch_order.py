"""What storing a lazy table's rows in the order they are first touched would save a ps task (issue 29): a prototype.

    .venv/bin/python benchmarks/bench_touch_order.py [--workdir /tmp/tf_peer] [--batches 390] [--rounds 5] [--pages]

psflow's lazy tables (``psflow/ps/lazy_rows.py``) keep a full-size ``(rows, dim)`` value and slots whose 4 KiB
pages the kernel commits, zero-filled, at their first write: a W&D request's few hundred new rows, spread over
2^20-row tables by hashed ids, each land on a fresh page of each array. This measures a touch-order layout without
changing psflow: two arms replay the same requests as ``bench_ps_rows.py`` does (the W&D model's 52 lazy tables,
``materialize_together`` + one ``read`` per table, then a sparse apply per table) on psflow's real store:

* ``rows``: the row ids as they are (today's layout);
* ``touch``: each table's ids first translated by a small C loop (compiled here with ``cc``, called through ctypes)
  to slots handed out in order of first touch (``slot_of``: a uint32 a row, 0 = not placed yet), so new rows land
  next to each other; the store then builds, gathers and updates slots instead of rows.

Both arms apply with ``distinct=True`` (the rows are distinct on both; the touch arm's are not sorted, which the
store's ``apply_sparse`` would otherwise sort). The touch arm keeps psflow's per-row build marks beside
``slot_of`` (a real implementation would drop them), so it overstates the layout's cost a little. Each arm runs
in its own fresh process, alternated ``--rounds`` times; reported per round: the thread's CPU per request (reads +
builds, and the whole request) and the minor page faults per request (``getrusage(RUSAGE_THREAD)``).

``--pages``: instead, count the 4 KiB pages each request commits for the first time under three layouts (rows as
today, value and slots interleaved in one array, touch order plus a uint32 index a row), from the same ids.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_ps_rows as replay  # noqa: E402  (the same requests, ids and tables)

_TRANSLATE_C = r"""
#include <stdint.h>
/* slot_of[r] = 1 + the slot of row r (0: not placed). Rows not placed get the next slots in order of first
 * appearance; out[i] = the slot of rows[i]. Returns the new count of placed rows. */
int64_t translate(uint32_t *slot_of, const int64_t *rows, int64_t n, int64_t *out, int64_t count) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t s = slot_of[rows[i]];
        if (!s) { s = (uint32_t)(++count); slot_of[rows[i]] = s; }
        out[i] = (int64_t)s - 1;
    }
    return count;
}
"""


def _translator(tmp: str) -> ctypes.CDLL:
    src, lib = os.path.join(tmp, "translate.c"), os.path.join(tmp, "translate.so")
    with open(src, "w") as f:
        f.write(_TRANSLATE_C)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", lib, src], check=True)
    dll = ctypes.CDLL(lib)
    dll.translate.restype = ctypes.c_int64
    dll.translate.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
    return dll


def measure(workdir: str, count: int, layout: str) -> dict[str, float]:
    """One process's replay in ``layout`` ("rows" or "touch"): CPU per request (ms) and minor faults per request."""
    from psflow.optim import OptimizerSpec
    from psflow.ps.lazy_rows import unbuilt_array
    from psflow.ps.optimizers import make_optimizer
    from psflow.ps.store import ParameterStore

    store = ParameterStore()
    deep = make_optimizer(OptimizerSpec("adagrad", {"learning_rate": 0.05}))
    wide = make_optimizer(OptimizerSpec("ftrl", {"learning_rate": 0.05}))
    rows_n = replay.ROWS
    parts = [store.create(f"wide/C{i + 1}", 0, (rows_n, 1), 0, rows_n, "float32", {"name": "zeros"}, wide) for i in range(26)]
    parts += [store.create(f"deep/emb_C{i + 1}", 0, (rows_n, replay.DIM), 0, rows_n, "float32",
                           {"name": "truncated_normal", "stddev": 1 / np.sqrt(replay.DIM), "seed": i}, deep) for i in range(26)]
    with tempfile.TemporaryDirectory() as tmp:
        dll = _translator(tmp) if layout == "touch" else None
    slot_of = [unbuilt_array((rows_n,), np.uint32) for _ in parts] if dll is not None else []
    placed = [0] * len(parts)

    def where(j: int, rows: np.ndarray) -> np.ndarray:
        if dll is None:
            return rows
        out = np.empty(rows.size, np.int64)
        placed[j] = dll.translate(slot_of[j].ctypes.data, rows.ctypes.data, rows.size, out.ctypes.data, placed[j])
        return out

    rng = np.random.default_rng(0)
    read_cpu = total_cpu = 0.0
    faults = 0
    batches = replay._batches(workdir, count)
    for step, batch in enumerate(batches):
        ids = [np.unique(batch[:, i % 26]) for i in range(len(parts))]
        grads = [rng.standard_normal((r.size, *p.value.shape[1:])).astype(np.float32) for p, r in zip(parts, ids, strict=True)]
        f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        t0 = time.thread_time()
        wanted = [(part, where(j, r)) for j, (part, r) in enumerate(zip(parts, ids, strict=True))]
        built = store.materialize_together(wanted)
        for part, rows in wanted:
            store.read(part, rows, built=part.key in built)
        t1 = time.thread_time()
        for j, (part, grad) in enumerate(zip(parts, grads, strict=True)):
            rows = where(j, ids[j])
            with part.lock:  # ParameterStore.apply_sparse, with distinct=True
                stamped = part.materialize(rows, changed=part.marks)
                part.optimizer.apply_sparse(part.value, part.slots, rows, grad, checked=True, distinct=True, step=step)
                if part.marks is not None and not stamped:
                    part.marks.mark(rows)
        t2 = time.thread_time()
        faults += resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0
        read_cpu += t1 - t0
        total_cpu += t2 - t0
    n = len(batches)
    return {"read_ms": 1e3 * read_cpu / n, "request_ms": 1e3 * total_cpu / n, "faults": faults / n}


def pages(workdir: str, count: int) -> dict[str, float]:
    """4 KiB pages committed for the first time per request, by layout (deep: value + Adagrad accumulator, 32 bytes
    a row each; wide: value + FTRL accumulator and linear, 4 bytes a row each)."""
    batches = replay._batches(workdir, count)
    arrays = {"deep": [32, 32], "wide": [4, 4, 4]}
    got = {"rows": 0.0, "interleaved": 0.0, "touch": 0.0, "touch_index": 0.0}
    for sizes in arrays.values():
        for t in range(26):
            seen: set[int] = set()
            by_row = {size: set() for size in (*sizes, sum(sizes))}
            for batch in batches:
                u = np.unique(batch[:, t])
                seen.update(u.tolist())
                for size, touched in by_row.items():
                    touched.update((u * size // 4096).tolist())
            got["rows"] += sum(len(by_row[size]) for size in sizes)
            got["interleaved"] += len(by_row[sum(sizes)])
            got["touch"] += sum(-(-len(seen) * size // 4096) for size in sizes)
            got["touch_index"] += len({r * 4 // 4096 for r in seen})
    return {name: value / len(batches) for name, value in got.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default=os.environ.get("TF_PEER_WORKDIR", "/tmp/tf_peer"))
    p.add_argument("--batches", type=int, default=390)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--pages", action="store_true")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child process: one run's JSON
    args = p.parse_args()
    if args.pages:
        print(json.dumps({k: round(v, 1) for k, v in pages(args.workdir, args.batches).items()}))
        return
    if args.one:
        print(json.dumps(measure(args.workdir, args.batches, args.one)))
        return
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    got: dict[str, list[dict[str, float]]] = {"rows": [], "touch": []}
    for r in range(args.rounds):
        for layout in (["rows", "touch"] if r % 2 == 0 else ["touch", "rows"]):
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", layout, "--workdir", args.workdir,
                                  "--batches", str(args.batches)], cwd=here, env=dict(os.environ, PYTHONPATH=here),
                                 capture_output=True, text=True, check=True)
            got[layout].append(json.loads(out.stdout))
            print(f"round {r + 1} {layout}: {got[layout][-1]} (load {os.getloadavg()[0]:.1f})", flush=True)
    for key in ("read_ms", "request_ms", "faults"):
        ratios = [t[key] / w[key] for t, w in zip(got["touch"], got["rows"], strict=True)]
        med = {layout: statistics.median(run[key] for run in runs) for layout, runs in got.items()}
        print(f"{key}: rows {med['rows']:.3f}, touch {med['touch']:.3f}; touch / rows per round "
              f"{', '.join(f'{x:.3f}' for x in ratios)}; median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
