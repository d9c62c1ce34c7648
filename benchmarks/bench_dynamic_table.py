"""A dynamic table against a static partition on the ps: lookup + apply throughput, and call latency while eviction runs.

    .venv/bin/python benchmarks/bench_dynamic_table.py [--out benchmarks/results/dynamic_table.json] [--quick] [--calls-only]

No processes, no RPC: one ps task's data structures, called as the parameter
service calls them. A *step* on one batch is a pull then a push of the same ids:

* static:  ``ParameterStore.read(part, rows)`` + ``ParameterStore.apply_sparse(part, rows, grads)``
  on a ``[rows, dim]`` partition, the ids folded into ``[0, rows)`` by
  ``psflow.models.features.fold_ids`` (as today, on the worker, so not timed);
* dynamic: ``DynamicTable.lookup(ids)`` + ``DynamicTable.apply_gradients(ids, grads, step)``
  with ``capacity_rows = rows``, filled to capacity before timing, so every call
  that meets new ids also evicts (LFU, sampled).

Batches are drawn from a Zipf stream (exponent 1.05 over ranks; each rank is a
64-bit id), deduplicated and sorted as a client sends them, at 1,000 and 10,000
ids per batch. Workloads: ``sparse_lr`` (dim 1, FTRL: the tf_peer sparse-LR
shape) and ``embedding`` (dim 16, Adagrad), both with 2**20 rows.

Throughput is measured side by side: rounds alternate a block of static steps
and a block of dynamic steps (the order flips every round), and the reported
ratio is the median of the per-round ratios, so the drift of a shared machine
hits both sides alike (``ratio_by_cpu_time``: the same from each block's CPU time).

Per-call cost (``calls``): lookup and apply_gradients of one batch of distinct
sorted ids, dim 8, Adagrad, on a full table: 200 ids on 5,000 rows (the small
per-table batches of a model with many tables, e.g. Wide & Deep's 52) and
20,000 ids on 2**20 rows, with the table's C loops (the id index, a batch's
distinct ids) and with their numpy twins (alternated in blocks), beside the static partition's read and apply of
as many rows: medians of each call's wall time and of its CPU time, in us.
``--calls-only`` runs just this part.

Eviction latency: a table of 2**17 rows under a stream with more than 10x as
many distinct ids; every step's lookup + apply is timed on its own, and in a
second run with ``ttl_steps`` every step also calls ``evict(step)`` (a bounded
TTL scan). Reports p50, p99 and the worst call, beside the static step's, in
wall-clock time and in the calling thread's CPU time (which a busy shared
machine's preemption does not inflate).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from psflow.models.features import fold_ids  # noqa: E402
from psflow.optim import OptimizerSpec  # noqa: E402
from psflow.ps.dynamic import DynamicTable, DynamicTableSpec, id_index  # noqa: E402
from psflow.ps.dynamic import rows as row_loops  # noqa: E402
from psflow.ps.optimizers import make_optimizer  # noqa: E402
from psflow.ps.store import ParameterStore, PartitionState  # noqa: E402

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "dynamic_table.json")
WORKLOADS = {
    "sparse_lr": (1, OptimizerSpec("ftrl", {"learning_rate": 0.05, "l1_regularization_strength": 0.001})),
    "embedding": (16, OptimizerSpec("adagrad", {"learning_rate": 0.05})),
}
ZIPF_EXPONENT = 1.05
_MIX = np.uint64(0x9E3779B97F4A7C15)


class ZipfIds:
    """A stream of 64-bit ids whose ranks are Zipf-distributed (rank r -> a fixed pseudo-random id).

    ``vocabulary``: ranks are folded into ``[1, vocabulary]``, so the stream
    only ever draws that many ids; None: unbounded (new ids keep coming).
    """

    def __init__(self, seed: int, vocabulary: int | None = None) -> None:
        self._rng = np.random.default_rng(seed)
        self.vocabulary = vocabulary

    @staticmethod
    def ids_of(ranks: np.ndarray) -> np.ndarray:
        z = ranks.astype(np.uint64) * _MIX
        z ^= z >> np.uint64(31)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(29)
        return z.view(np.int64)

    def batch(self, draws: int) -> np.ndarray:
        """Distinct sorted ids of ``draws`` Zipf draws (what a client sends)."""
        ranks = self._rng.zipf(ZIPF_EXPONENT, draws)
        if self.vocabulary is not None:
            ranks = (ranks - 1) % self.vocabulary + 1
        return np.unique(self.ids_of(ranks))


def _static(dim: int, rows: int, optimizer: OptimizerSpec) -> PartitionState:
    store = ParameterStore()
    return store.create("w", 0, (rows, dim), 0, rows, "float32", {"name": "zeros"}, make_optimizer(optimizer))


def _dynamic(dim: int, rows: int, optimizer: OptimizerSpec, fill: np.ndarray, **options: Any) -> DynamicTable:
    """A table of capacity ``rows``, first given a row for each of ``fill``."""
    table = DynamicTable(DynamicTableSpec("w", dim, optimizer=optimizer, capacity_rows=rows, **options))
    for start in range(0, fill.size, 65536):
        table.lookup(fill[start:start + 65536], step=0)
    if options.get("admit_after"):
        for start in range(0, fill.size, 65536):  # the fill ids' later sightings
            table.lookup(fill[start:start + 65536], step=0)
    return table


def _other_ids(count: int) -> np.ndarray:
    """``count`` ids a ZipfIds stream does not draw."""
    return np.arange(count, dtype=np.int64) * 7919 - (1 << 40)


Step = tuple[np.ndarray, np.ndarray, np.ndarray]  # ids, folded static rows, grads


def _steps(stream: ZipfIds, draws: int, count: int, dim: int, rows: int, rng: np.random.Generator) -> list[Step]:
    out = []
    for _ in range(count):
        ids = stream.batch(draws)
        folded = np.unique(fold_ids(ids, rows))
        out.append((ids, folded, rng.normal(0, 0.1, (ids.size, dim)).astype(np.float32)))
    return out


Latency = tuple[float, float]  # wall seconds, this thread's CPU seconds


def _run_static(part: PartitionState, steps: list[Step], latencies: list[Latency] | None = None) -> tuple[int, Latency]:
    """Runs the static steps; returns (ids, (wall seconds, CPU seconds))."""
    ids_done, started, cpu_started = 0, time.perf_counter(), time.thread_time()
    for _, rows, grads in steps:
        t0, c0 = time.perf_counter(), time.thread_time()
        ParameterStore.read(part, rows)
        ParameterStore.apply_sparse(part, rows, grads[:rows.size])
        if latencies is not None:
            latencies.append((time.perf_counter() - t0, time.thread_time() - c0))
        ids_done += rows.size
    return ids_done, (time.perf_counter() - started, time.thread_time() - cpu_started)


def _run_dynamic(table: DynamicTable, steps: list[Step], step0: int, latencies: list[Latency] | None = None,
                 evict_latencies: list[Latency] | None = None) -> tuple[int, Latency]:
    """Runs the dynamic steps (and evict calls, where their latencies are wanted); returns (ids, (wall, CPU seconds))."""
    ids_done, started, cpu_started = 0, time.perf_counter(), time.thread_time()
    for k, (ids, _, grads) in enumerate(steps):
        t0, c0 = time.perf_counter(), time.thread_time()
        table.lookup(ids, step=step0 + k)
        table.apply_gradients(ids, grads, step0 + k)
        t1, c1 = time.perf_counter(), time.thread_time()
        if evict_latencies is not None:
            table.evict(step0 + k)
            evict_latencies.append((time.perf_counter() - t1, time.thread_time() - c1))
        if latencies is not None:
            latencies.append((t1 - t0, c1 - c0))
        ids_done += ids.size
    return ids_done, (time.perf_counter() - started, time.thread_time() - cpu_started)


#: Throughput streams: (vocabulary as a fraction of the rows or None, dynamic table options).
STREAMS: dict[str, tuple[float | None, dict[str, Any]]] = {
    "resident": (0.5, {}),  # a vocabulary of rows/2 ids, all resident: no creation, no eviction
    "churn": (None, {}),  # unbounded Zipf, table full: new ids on every call, each evicts a row
    "churn_admit_after_2": (None, {"admit_after": 2}),  # the same, ids admitted at their second sighting
}


def throughput(workload: str, stream_kind: str, draws: int, rounds: int, steps_per_round: int, rows: int) -> dict[str, Any]:
    dim, optimizer = WORKLOADS[workload]
    fraction, options = STREAMS[stream_kind]
    vocabulary = None if fraction is None else int(rows * fraction)
    fill = ZipfIds.ids_of(np.arange(1, vocabulary + 1)) if vocabulary else _other_ids(rows)
    part, table = _static(dim, rows, optimizer), _dynamic(dim, rows, optimizer, fill, **options)
    stream, rng = ZipfIds(1, vocabulary), np.random.default_rng(2)
    static_rates, dynamic_rates, ratios, cpu_ratios = [], [], [], []
    step = 1
    for r in range(rounds):
        steps = _steps(stream, draws, steps_per_round, dim, rows, rng)
        if r % 2 == 0:
            (s_ids, s_sec), (d_ids, d_sec) = _run_static(part, steps), _run_dynamic(table, steps, step)
        else:
            (d_ids, d_sec), (s_ids, s_sec) = _run_dynamic(table, steps, step), _run_static(part, steps)
        step += steps_per_round
        static_rates.append(s_ids / s_sec[0])
        dynamic_rates.append(d_ids / d_sec[0])
        ratios.append(dynamic_rates[-1] / static_rates[-1])
        cpu_ratios.append((d_ids / d_sec[1]) / (s_ids / s_sec[1]))
    stats = table.stats()
    return {
        "workload": workload, "stream": stream_kind, "dim": dim, "optimizer": optimizer.name, "rows": rows,
        "zipf_draws_per_batch": draws,
        "mean_distinct_ids_per_batch": round(d_ids / steps_per_round, 1),
        "dynamic_admitted": stats.admitted, "dynamic_rejected_lookups": stats.rejected_lookups,
        "static_ids_per_s": round(statistics.median(static_rates)),
        "dynamic_ids_per_s": round(statistics.median(dynamic_rates)),
        "ratio_dynamic_over_static": round(statistics.median(ratios), 3),
        "ratio_quartiles": [round(q, 3) for q in statistics.quantiles(ratios, n=4)] if len(ratios) > 1 else None,
        "ratio_by_cpu_time": round(statistics.median(cpu_ratios), 3),
        "dynamic_evicted_capacity": stats.evicted_capacity, "dynamic_index_rebuilds": stats.index_rebuilds,
        "dynamic_memory_bytes": stats.memory_bytes, "static_parameter_bytes": part.value.nbytes
        + sum(s.nbytes for s in part.slots.values()),
    }


def _summary(latencies: list[Latency]) -> dict[str, float | int]:
    """Wall-clock p50/p99/max, and the same of the call's own CPU time (free of the shared machine's preemption)."""
    wall, cpu = (np.array(column) * 1e3 for column in zip(*latencies, strict=True))
    out: dict[str, float | int] = {"calls": int(wall.size)}
    for name, ms in (("", wall), ("cpu_", cpu)):
        out.update({f"{name}p50_ms": round(float(np.percentile(ms, 50)), 3),
                    f"{name}p99_ms": round(float(np.percentile(ms, 99)), 3), f"{name}max_ms": round(float(ms.max()), 3)})
    return out


def eviction_latency(capacity: int, draws: int, steps: int, ttl_steps: int | None) -> dict[str, Any]:
    dim, optimizer = WORKLOADS["embedding"]
    options: dict[str, Any] = {"ttl_steps": ttl_steps} if ttl_steps else {}
    table, part = _dynamic(dim, capacity, optimizer, _other_ids(capacity), **options), _static(dim, capacity, optimizer)
    stream = ZipfIds(3)
    batches = _steps(stream, draws, steps, dim, capacity, np.random.default_rng(4))
    distinct = np.unique(np.concatenate([ids for ids, _, _ in batches])).size
    dynamic: list[Latency] = []
    static: list[Latency] = []
    evicts: list[Latency] | None = [] if ttl_steps else None
    chunk = 20
    for start in range(0, steps, chunk):  # alternate in chunks, so both see the same machine
        _run_static(part, batches[start:start + chunk], static)
        _run_dynamic(table, batches[start:start + chunk], 1 + start, dynamic, evicts)
    stats = table.stats()
    out = {"capacity_rows": capacity, "ids_per_batch": draws, "distinct_ids_in_stream": int(distinct),
           "distinct_over_capacity": round(distinct / capacity, 1), "ttl_steps": ttl_steps,
           "dynamic_lookup_plus_apply": _summary(dynamic), "static_read_plus_apply": _summary(static),
           "evicted_capacity": stats.evicted_capacity, "evicted_ttl": stats.evicted_ttl,
           "index_rebuilds": stats.index_rebuilds, "rows_at_end": stats.rows, "memory_bytes": stats.memory_bytes}
    if evicts is not None:
        out["evict_call"] = _summary(evicts)
    return out


def per_call(rows: int, batch: int, rounds: int, calls_per_round: int) -> dict[str, Any]:
    """Median us per call (wall and CPU) of lookup, apply_gradients, the index's find and remove + insert,
    on the table's C loops and on their numpy twins, and of a static partition's read and apply_sparse."""
    dim, optimizer = 8, OptimizerSpec("adagrad", {"learning_rate": 0.05})
    fill = ZipfIds.ids_of(np.arange(1, rows + 1))
    table, part = _dynamic(dim, rows, optimizer, fill), _static(dim, rows, optimizer)
    rng = np.random.default_rng(5)
    batches = [np.sort(rng.choice(fill, batch, replace=False)) for _ in range(calls_per_round)]
    static_rows = [np.sort(rng.choice(rows, batch, replace=False)) for _ in range(calls_per_round)]
    grads = [rng.normal(0, 0.1, (batch, dim)).astype(np.float32) for _ in range(calls_per_round)]
    index, kernels = table._index, (id_index._KERNELS, row_loops._KERNELS)
    ops: dict[str, Any] = {
        "lookup": lambda k: table.lookup(batches[k], step=1),
        "apply_gradients": lambda k: table.apply_gradients(batches[k], grads[k], 1),
        "index_find": lambda k: index.find(batches[k]),
        "index_remove_insert": lambda k: (lambda slots, where: (index.remove(where), index.insert(batches[k], slots)))(
            *index.find(batches[k])),
    }
    static_ops: dict[str, Any] = {"static_read": lambda k: ParameterStore.read(part, static_rows[k]),
                                  "static_apply": lambda k: ParameterStore.apply_sparse(part, static_rows[k], grads[k])}
    impls = ["c", "numpy"] if kernels[0] is not None else ["numpy"]
    times: dict[str, list[Latency]] = {}

    def timed(name: str, op: Any) -> None:
        for k in range(calls_per_round):
            t0, c0 = time.perf_counter(), time.thread_time()
            op(k)
            times.setdefault(name, []).append((time.perf_counter() - t0, time.thread_time() - c0))

    try:
        for r in range(rounds):  # alternate the implementations (and flip their order) so both see the same machine
            for impl in impls if r % 2 == 0 else impls[::-1]:
                id_index._KERNELS, row_loops._KERNELS = kernels if impl == "c" else (None, None)
                for name, op in ops.items():
                    timed(f"{name}/{impl}", op)
            for name, op in static_ops.items():
                timed(name, op)
    finally:
        id_index._KERNELS, row_loops._KERNELS = kernels

    def median_us(name: str) -> dict[str, float]:
        wall, cpu = zip(*times[name], strict=True)
        return {"wall_us": round(statistics.median(wall) * 1e6, 1), "cpu_us": round(statistics.median(cpu) * 1e6, 1)}

    return {"rows": rows, "ids_per_call": batch, "dim": dim, "optimizer": "adagrad", "index_loops": impls,
            **{name: median_us(name) for name in times}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON results file (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="smaller tables and fewer rounds (a smoke run)")
    parser.add_argument("--calls-only", action="store_true", help="only the per-call costs (the calls section)")
    args = parser.parse_args()
    started = time.perf_counter()
    rows, rounds, per_round = (1 << 16, 3, 10) if args.quick else (1 << 20, 5, 20)
    results: dict[str, Any] = {
        "command": "python " + " ".join(sys.argv), "python": platform.python_version(), "numpy": np.__version__,
        "cpus": os.cpu_count(), "index_loops": "numpy" if id_index._KERNELS is None else "c",
        "calls": [], "throughput": [], "eviction": []}
    for call_rows, batch, call_rounds, calls in ((5_000, 200, 10, 100), (rows, 20_000, 6 if args.quick else 10, 5)):
        results["calls"].append(per_call(call_rows, batch, call_rounds, calls))
        print(json.dumps(results["calls"][-1]), flush=True)
    for workload in WORKLOADS if not args.calls_only else ():
        for stream_kind in STREAMS:
            for draws in (1_000, 10_000):
                results["throughput"].append(throughput(workload, stream_kind, draws, rounds, per_round, rows))
                print(json.dumps(results["throughput"][-1]), flush=True)
    capacity, steps = (1 << 13, 60) if args.quick else (1 << 17, 300)
    for ttl in (None, 50) if not args.calls_only else ():
        results["eviction"].append(eviction_latency(capacity, 10_000, steps, ttl))
        print(json.dumps(results["eviction"][-1]), flush=True)
    results["wall_seconds"] = round(time.perf_counter() - started, 1)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    print(f"wrote {args.out} ({results['wall_seconds']} s)")


if __name__ == "__main__":
    main()
