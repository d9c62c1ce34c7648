"""A W&D-shaped ps store's step cost and memory with huge pages, small pages, and small pages then collapsed.

    .venv/bin/python benchmarks/bench_lazy_pages.py [--rounds 3] [--steps 782] [--out FILE.json]

No network and no workers: one process holds issue 29's W&D ps state (26 deep tables of 2^20 x 8 float32
under Adagrad, 26 wide ones of 2^20 x 1 under FTRL, all lazy partitions of a
:class:`psflow.ps.store.ParameterStore`) and runs the ps side of a step per batch: for each of the 52 tables,
a read of the batch's rows and a sparse apply of a gradient on them (512 rows a field). Each field's ids are
``--vocab`` distinct hashed rows (uniform over 2^20, as psflow's hashing spreads them; the default sizes are the
26 fields' distinct values in the W&D training data), drawn per batch with a Zipf-like skew (a rank's weight
1 / rank). The CPU seconds of the first ``--steps`` steps (an epoch of both workers: rows built and pages
committed as they come; drawing the batches is in it, the same in every mode) and of ``--steady-steps`` more
(the steady state: pre-drawn batches whose rows are all built) are timed.

Modes, each in a fresh process, alternated in order every round:

- ``huge``: numpy's default for the lazy arrays and the row marks (``MADV_HUGEPAGE`` from numpy, psflow's
  behaviour before 178668d), by undoing psflow's small-page advice right after creation;
- ``small``: psflow's small pages (``MADV_NOHUGEPAGE``);
- ``collapse``: small pages, and after the first ``--steps`` steps every table whose touched 4 KiB pages are
  ``--collapse-at`` (0.9) of its pages or more is advised ``MADV_HUGEPAGE`` and collapsed (``MADV_COLLAPSE``,
  Linux 6.1+) into huge pages: what a hybrid would do; its seconds are reported.

Reported per mode: RSS after the first window, CPU s of each window, the collapse's seconds.

psflow did the ``collapse`` switch itself at 44b5ea2 (as soon as a table passed 0.9; that revision's version of
this script measured it as mode ``psflow``) and dropped it at the next commit: benchmarks/RESULTS.md, section
``wd_small_pages``.
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
import time
from typing import Any

import numpy as np

ROWS = 1 << 20
BATCH = 512
MODES = ("huge", "small", "collapse")
# Distinct values of the 26 categorical fields in /tmp/tf_peer/data/ctr_wd/train-*.tsv.
W_AND_D_VOCAB = (4, 6, 10, 15, 23, 35, 54, 83, 128, 197, 303, 467, 720, 1111, 1712, 2605, 4036, 5967, 8377, 9633,
                 9657, 13580, 16875, 19717, 20946, 27219)
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25


def _madvise(array: np.ndarray, advice: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    start = -(-array.ctypes.data // 4096) * 4096
    length = (array.ctypes.data + array.nbytes) // 4096 * 4096 - start
    return 0 if libc.madvise(start, length, advice) == 0 else ctypes.get_errno()


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_mode(mode: str, steps: int, steady_steps: int, vocab: list[int], collapse_at: float,
             seed: int) -> dict[str, Any]:
    """One mode in this process: the store, a window of ``steps`` steps and one of ``steady_steps``, the figures."""
    from psflow.optim import OptimizerSpec
    from psflow.ps.optimizers import make_optimizer
    from psflow.ps.store import ParameterStore

    store = ParameterStore()
    adagrad = make_optimizer(OptimizerSpec("adagrad", {"learning_rate": 0.05}))
    ftrl = make_optimizer(OptimizerSpec("ftrl", {"learning_rate": 0.05}))
    parts = []
    for f in range(len(vocab)):
        parts.append(store.create(f"deep_{f}", 0, (ROWS, 8), 0, ROWS, "float32",
                                  {"name": "random_uniform", "minval": -0.05, "maxval": 0.05, "seed": f}, adagrad))
        parts.append(store.create(f"wide_{f}", 0, (ROWS, 1), 0, ROWS, "float32", {"name": "zeros"}, ftrl))
    arrays = [a for p in parts for a in (p.value, *p.slots.values(), *(() if p.marks is None else (p.marks.changed_at,)))]
    if mode == "huge":
        for a in arrays:
            _madvise(a, _MADV_HUGEPAGE)  # numpy's advice back (psflow's small-page advice undone)
    rng = np.random.default_rng(seed)
    ids = [rng.choice(ROWS, v, replace=False).astype(np.int64) for v in vocab]
    weights = [1.0 / np.arange(1, v + 1) for v in vocab]
    weights = [w / w.sum() for w in weights]
    batches = [[np.unique(ids[f][rng.choice(len(ids[f]), BATCH, p=weights[f])]) for f in range(len(vocab))]
               for _ in range(64)]  # drawn once: the timed loop is the ps's work alone

    def window(first: int, count: int) -> float:
        t = _cpu()
        for s in range(first, first + count):
            # The first window ends with the pre-drawn batches, so the second builds no row: it is steady.
            batch = batches[s % len(batches)] if s >= steps - len(batches) else [
                np.unique(ids[f][rng.choice(len(ids[f]), BATCH, p=weights[f])]) for f in range(len(vocab))]
            for f, rows in enumerate(batch):
                for part in (parts[2 * f], parts[2 * f + 1]):
                    got = store.read(part, rows)
                    store.apply_sparse(part, rows, np.full_like(got, 0.01), step=s)
        return _cpu() - t

    first = window(0, steps)
    rss_first = _rss_mib()
    collapse_s, collapsed = 0.0, 0
    if mode == "collapse":
        t = time.perf_counter()
        for p in parts:
            per_page = max(1, 4096 // (p.value.itemsize * (p.value.shape[1] if p.value.ndim > 1 else 1)))
            marks = p.lazy.marks if p.lazy is not None else np.ones(p.value.shape[0], np.bool_)
            touched = marks[: marks.size // per_page * per_page].reshape(-1, per_page).any(axis=1).mean()
            if touched >= collapse_at:
                collapsed += 1
                for a in (p.value, *p.slots.values()):
                    _madvise(a, _MADV_HUGEPAGE)
                    _madvise(a, _MADV_COLLAPSE)
        collapse_s = time.perf_counter() - t
    steady = window(steps, steady_steps)
    with open("/proc/self/smaps_rollup") as f:
        huge = next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages:")) / 1024
    return {"mode": mode, "first_window_cpu_s": first, "steady_window_cpu_s": steady, "rss_mib_after_first": rss_first,
            "rss_mib_end": _rss_mib(), "anon_huge_mib_end": huge, "collapse_s": collapse_s,
            "tables_collapsed": collapsed}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=782, help="steps a window (782: one W&D epoch of 2 workers' pulls)")
    p.add_argument("--steady-steps", type=int, default=3128, help="steps of the steady window (4 epochs)")
    p.add_argument("--collapse-at", type=float, default=0.9)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--out")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(run_mode(args.child, args.steps, args.steady_steps, list(W_AND_D_VOCAB), args.collapse_at, 0)))
        return
    modes = [m for m in args.modes.split(",") if m]
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in (modes if r % 2 == 0 else modes[::-1]):
            child = [sys.executable, __file__, "--child", mode, "--steps", str(args.steps),
                     "--steady-steps", str(args.steady_steps), "--collapse-at", str(args.collapse_at)]
            out = subprocess.run(child, capture_output=True, text=True, check=True, timeout=1800).stdout
            got = dict(json.loads(out.strip().splitlines()[-1]), loadavg_1min_before=os.getloadavg()[0])
            runs[mode].append(got)
            print(f"round {r} {mode}: {got}", file=sys.stderr, flush=True)
    base = runs[modes[0]]
    print("| mode | first window CPU s | steady window CPU s | steady / " + modes[0] + " per round | RSS MiB after "
          "the first window | huge-page MiB at the end | collapse s (tables) |\n|---|---|---|---|---|---|---|")
    for m in modes:
        rs = runs[m]
        med = {k: statistics.median(x[k] for x in rs) for k in rs[0] if k != "mode"}
        ratios = ", ".join(f"{x['steady_window_cpu_s'] / b['steady_window_cpu_s']:.2f}" for x, b in zip(rs, base, strict=True))
        print(f"| {m} | {med['first_window_cpu_s']:.2f} | {med['steady_window_cpu_s']:.2f} | {ratios} | "
              f"{med['rss_mib_after_first']:,.0f} | {med['anon_huge_mib_end']:,.0f} | {med['collapse_s']:.3f} "
              f"({med['tables_collapsed']:.0f}) |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": "benchmarks/bench_lazy_pages.py " + " ".join(sys.argv[1:]), "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
