"""Dynamic embedding tables end to end (issue #14): throughput, ps memory and eval AUC through ``psflow train``.

    .venv/bin/python benchmarks/bench_dynamic_e2e.py                  # all three (~12 min on 2 cores)
    .venv/bin/python benchmarks/bench_dynamic_e2e.py --quick          # smoke run, smaller sizes (~1-2 min)
    .venv/bin/python benchmarks/bench_dynamic_e2e.py --only memory    # one part (repeatable: --only auc --only memory)

Every run is a real ``psflow train`` command (``python -m psflow train ...`` in a
child process: a local cluster of ps and worker processes); the exact argument
lists are recorded in the JSON and printed in RESULTS.md. Configurations that are
compared are run alternately inside each repetition (the order flips every
repetition) and the figures are medians, because the machine is shared and noisy.

1. **throughput**: the tf_peer sparse-LR workload (``benchmarks/workload.py``:
   400,000 train examples in 4 LIBSVM shards + 50,000 eval, 39 ids in 2^20 each;
   ``--quick``: 100,000 + 20,000), logistic regression with FTRL as
   ``bench_tf_peer.py`` configures psflow (lr 0.1, batch 512, one epoch), a static
   table of 2^20 rows (``--num-features 1048576``) against a dynamic table of the
   same size (``--embedding-table dynamic --capacity 1048576``), 1 ps + 2 workers
   and 2 ps + 2 workers, async. Timed as ``bench_tf_peer.py`` times psflow
   (``--log-every 1``; from the chief's "initialized the variables" log line to the
   last ``step=`` line: start-up excluded, input included). Goal: dynamic >= 0.7x static.

2. **memory**: a synthetic LIBSVM file of Zipf-distributed 48-bit ids (ranks drawn as
   ``floor(U ** (-1 / (s - 1)))``, a discrete power law with P(rank = k) ~ k^-s,
   s = 1.1; 39 distinct ids per example; label from a hidden logistic model) with at
   least 10x more distinct ids than the table's row limit, trained (2 ps + 2 workers,
   logistic, FTRL, one epoch) into ``--embedding-table dynamic --capacity-bytes BUDGET``
   and, alternately, into a tiny table (``--capacity-bytes 1048576``) on the same file.
   Each ps process's resident memory is read from /proc every 10 ms (VmRSS and VmHWM;
   psutil is not in the venv, /proc gives the same figures, VmHWM even the exact peak).
   "Peak while training" is the VmHWM read last before the last worker ``step=`` line;
   "peak, whole run" also covers evaluation and the final checkpoint save. Fixed overhead
   of ps task i = its peak while training with the tiny table - the tiny table's
   ``memory_bytes`` (its Stats) + ``DynamicTable.overhead_bytes()`` of the budget
   table's share (Python + numpy + gRPC + the batch's temporaries, measured on the same
   data). Target: peak <= 1.1 x ceil(BUDGET / num_ps) + fixed overhead. Recall: the
   final checkpoint's ``weights@ids`` (``psflow.checkpoint.variables.read_variables``)
   against the 1% most frequent ids of the file (by examples containing them, ties by
   Zipf rank). Target >= 0.99.

3. **auc**: the Criteo sample ``shared/data/criteo/criteo_1tb_day0_10k.txt`` (first
   8,000 rows train, last 2,000 eval, written to the work dir), ``--format criteo``,
   a hashed static table of 2^20 rows (``--num-features 1048576``; the torch models:
   2^20 buckets per feature) against dynamic tables keyed by the raw 64-bit hashes,
   models logistic, fm, wide_deep, deepfm (psflow train's default optimizers and learning
   rates), 3 epochs, 2 ps + 1 worker (one worker: a run is deterministic for its seed),
   each seed run static and dynamic with the same ``--seed``. Target: dynamic >=
   static - 0.002 (mean of the per-seed differences).

Writes benchmarks/results/dynamic_e2e.json (every run) and the "dynamic_e2e" section
of benchmarks/RESULTS.md (``--no-write``: print only). Measures psflow as it is in this
working tree (the task processes import it from the repository root).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_dynamic_table import ZipfIds  # noqa: E402
from bench_memory import proc_status  # noqa: E402
from bench_tf_peer import machine, median_range, parse_worker_logs  # noqa: E402
from psflow_timing import STEP_LINE, stamped_lines  # noqa: E402
from results_md import replace_section  # noqa: E402
from workload import _mix, ensure_workload, write_libsvm  # noqa: E402

from psflow.checkpoint.variables import read_variables  # noqa: E402
from psflow.ps.dynamic import DynamicTable, owner_of, share_spec  # noqa: E402
from psflow.train.config import TrainConfig  # noqa: E402

Run = dict[str, Any]
TABLE_ROWS = 1 << 20
CRITEO = os.path.join(os.path.dirname(REPO), "shared", "data", "criteo", "criteo_1tb_day0_10k.txt")
TINY_BYTES = 1 << 20
RSS_TARGET = 1.1
RECALL_TARGET = 0.99
AUC_TOLERANCE = 0.002
THROUGHPUT_GOAL = 0.7
MMAP_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}  # glibc: a fixed threshold (no dynamic raise after a free)


# --------------------------------------------------------------------------- running psflow train
class PsMemory:
    """Samples VmRSS and VmHWM of the ps task processes under a ``psflow train`` process every ``every`` s."""

    def __init__(self, launcher_pid: int, every: float = 0.01) -> None:
        self.launcher, self.every = launcher_pid, every
        self.samples: dict[int, list[tuple[float, int, int]]] = {}  # ps index -> (time, VmRSS, VmHWM)
        self._pids: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _find(self) -> None:
        try:
            with open(f"/proc/{self.launcher}/task/{self.launcher}/children") as f:
                children = [int(p) for p in f.read().split()]
        except OSError:
            return
        for pid in children:
            if pid in self._pids.values():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().decode(errors="replace").split("\0")
            except OSError:
                continue
            if "psflow.launch.task" in argv and "--job" in argv and argv[argv.index("--job") + 1] == "ps":
                self._pids[int(argv[argv.index("--task") + 1])] = pid

    def _run(self) -> None:
        while not self._stop.is_set():
            self._find()
            for index, pid in list(self._pids.items()):
                try:
                    s = proc_status(pid)
                except (OSError, RuntimeError):  # exited (or a zombie without memory figures)
                    continue
                self.samples.setdefault(index, []).append((time.time(), s["VmRSS"], s["VmHWM"]))
            self._stop.wait(self.every)

    def __enter__(self) -> PsMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def peaks(self, until: float | None) -> dict[int, dict[str, int]]:
        """Per ps task: VmHWM at the last sample before ``until`` (None: the last sample), the sampled VmRSS peak."""
        out = {}
        for index, rows in sorted(self.samples.items()):
            before = [r for r in rows if until is None or r[0] <= until]
            if before:
                out[index] = {"vmhwm": before[-1][2], "sampled_rss_peak": max(r[1] for r in before),
                              "samples": len(before)}
        return out


def psflow_train(argv: list[str], run_dir: str, *, timeout: float, sample_ps: bool = False,
                 env: dict[str, str] | None = None) -> Run:
    """Runs ``python -m psflow train ARGV --output RUN_DIR --quiet --no-status`` (``env``: added to the
    environment, which the task processes inherit); returns its metrics (or a failure)."""
    cmd = [sys.executable, "-m", "psflow", "train", *argv, "--output", run_dir, "--quiet", "--no-status"]
    t0 = time.perf_counter()
    load = os.getloadavg()[0]
    memory: PsMemory | None = None
    with tempfile.TemporaryFile("w+") as log:
        p = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=dict(os.environ, **(env or {})))
        try:
            if sample_ps:
                with PsMemory(p.pid) as memory:
                    p.wait(timeout=timeout)
            else:
                p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.seek(0)
        output = log.read()
    wall = time.perf_counter() - t0
    base = {"argv": argv, "run_dir": run_dir, "wall_s": wall, "loadavg_1min_before": load, "memory": memory}
    metrics_path = os.path.join(run_dir, "metrics.json")
    if p.returncode != 0 or not os.path.exists(metrics_path):
        errors = [open(e).read()[-600:] for e in glob.glob(os.path.join(run_dir, "error-*.json"))]
        return {**base, "failed": True, "returncode": p.returncode,
                "tail": output.strip().splitlines()[-12:] + errors}
    with open(metrics_path) as f:
        metrics = json.load(f)
    return {**base, "metrics": metrics}


def last_step_time(run_dir: str) -> float:
    """Wall-clock time (epoch s) of the last ``step=`` line any worker logged."""
    paths = glob.glob(os.path.join(run_dir, "logs", "worker-*.log"))
    return max((t for t, line in stamped_lines(paths) if STEP_LINE.search(line)), default=0.0)


def shown(argv: list[str]) -> str:
    return "psflow train " + shlex.join(argv) + " --output RUN_DIR --quiet --no-status"


def ok_runs(runs: list[Run]) -> list[Run]:
    return [r for r in runs if not r.get("failed")]


def fail_line(r: Run) -> str:
    return "FAILED (rc " + str(r.get("returncode")) + "): " + " | ".join(r.get("tail", []))[-1500:]


# --------------------------------------------------------------------------------- 1. throughput
THROUGHPUT_CONFIGS = {
    "static": ["--num-features", str(TABLE_ROWS)],
    "dynamic": ["--embedding-table", "dynamic", "--capacity", str(TABLE_ROWS)],
}


def throughput(args: argparse.Namespace) -> dict[str, Any]:
    n_train, n_eval = (100_000, 20_000) if args.quick else (400_000, 50_000)
    wl = ensure_workload(args.workdir, n_train=n_train, n_eval=n_eval, shards=4)
    train_glob = os.path.join(os.path.dirname(wl.eval), "train-*-of-00004.libsvm")
    common = ["--train", train_glob, "--eval", wl.eval, "--format", "libsvm", "--model", "logistic", "--optimizer", "ftrl",
              "--learning-rate", "0.1", "--batch-size", "512", "--epochs", "1", "--mode", "async", "--log-every", "1"]
    shapes = [(1, 2), (2, 2)]
    runs: dict[str, dict[str, list[Run]]] = {}
    commands: dict[str, dict[str, str]] = {}
    for rep in range(args.repeats):
        for k, (ps, workers) in enumerate(shapes):
            shape = f"p{ps}w{workers}"
            order = list(THROUGHPUT_CONFIGS) if (rep + k) % 2 == 0 else list(THROUGHPUT_CONFIGS)[::-1]
            for name in order:
                argv = [*common, "--ps", str(ps), "--workers", str(workers), *THROUGHPUT_CONFIGS[name]]
                commands.setdefault(shape, {})[name] = shown(argv)
                run_dir = tempfile.mkdtemp(prefix=f"thr-{shape}-{name}-", dir=args.runs)
                r = psflow_train(argv, run_dir, timeout=args.run_timeout)
                if not r.get("failed"):
                    m = r.pop("metrics")
                    try:
                        timing = parse_worker_logs(run_dir)
                    except RuntimeError as e:
                        r.update(failed=True, tail=[str(e)])
                    else:
                        r.update(examples=m["examples"], examples_per_sec=m["examples"] / timing["seconds"],
                                 eval_auc=m["eval"]["auc"], global_step=m["global_step"],
                                 parameter_bytes=sum(int(s.get("parameter_bytes") or 0) for s in m["ps"]),
                                 dynamic_tables=m.get("dynamic_tables"), **timing)
                r.pop("memory", None)
                r.update(repetition=rep)
                runs.setdefault(shape, {}).setdefault(name, []).append(r)
                print(f"[throughput {rep + 1}/{args.repeats} {time.strftime('%H:%M:%S')}] {shape} {name}: " + (
                    fail_line(r) if r.get("failed") else
                    f"{r['examples_per_sec']:,.0f} examples/s, eval AUC {r['eval_auc']:.4f}"), flush=True)
    return {"data": os.path.dirname(wl.eval), "train_examples": n_train, "eval_examples": n_eval,
            "commands": commands, "runs": runs}


def throughput_table(res: dict[str, Any]) -> list[str]:
    lines = ["| shape | table | examples/s: median [min–max] | dynamic / static: ratio of medians [per-repetition min–max] "
             f"| goal ≥ {THROUGHPUT_GOAL}× | eval AUC: median [min–max] | rows at the end | table bytes on the ps |",
             "|---|---|---|---|---|---|---|---|"]
    what = {"p1w2": "1 ps + 2 workers, async", "p2w2": "2 ps + 2 workers, async"}
    for shape, sides in res["runs"].items():
        static = {r["repetition"]: r for r in ok_runs(sides.get("static", []))}
        for name, rs in sorted(sides.items(), key=lambda kv: list(THROUGHPUT_CONFIGS).index(kv[0])):
            ok = ok_runs(rs)
            rate = [r["examples_per_sec"] for r in ok]
            auc = [r["eval_auc"] for r in ok]
            ratio = goal = ""
            if name == "dynamic" and ok and static:
                paired = [r["examples_per_sec"] / static[r["repetition"]]["examples_per_sec"] for r in ok if r["repetition"] in static]
                x = statistics.median(rate) / statistics.median([r["examples_per_sec"] for r in static.values()])
                ratio = f"{x:.2f}× [{min(paired):.2f}–{max(paired):.2f}]"
                goal = "met" if x >= THROUGHPUT_GOAL else "not met"
            if ok and name == "dynamic":
                d = ok[-1]["dynamic_tables"]["weights"]
                rows, nbytes = f"{d['rows']:,} of {d['row_limit']:,}", f"{d['memory_bytes']:,} (Stats memory_bytes)"
            elif ok:
                rows, nbytes = f"{TABLE_ROWS:,} (all)", f"{ok[-1]['parameter_bytes']:,} (Stats parameter_bytes)"
            else:
                rows = nbytes = ""
            failed = f" ({len(rs) - len(ok)} failed)" if len(rs) > len(ok) else ""
            lines.append(f"| {what.get(shape, shape)} | {name}{failed} | {median_range(rate)} | {ratio} | {goal} | "
                         f"{median_range(auc, '{:.4f}')} | {rows} | {nbytes} |")
    return lines


# ------------------------------------------------------------------------------------ 2. memory
def zipf_data(args: argparse.Namespace, distinct_wanted: int, ids_per_example: int = 39, exponent: float = 1.1,
              seed: int = 7) -> dict[str, Any]:
    """A LIBSVM file of Zipf ids with at least ``distinct_wanted`` distinct ids; cached in the work dir."""
    d = os.path.join(args.workdir, f"zipf_{exponent}_{distinct_wanted}")
    info_path = os.path.join(d, "info.json")
    if os.path.exists(info_path):
        with open(info_path) as f:
            return json.load(f)
    os.makedirs(d, exist_ok=True)
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)

    def draw(n: int) -> np.ndarray:
        r = np.floor((1.0 - rng.random(n)) ** (-1.0 / (exponent - 1.0)))
        return np.minimum(r, float(1 << 40)).astype(np.int64)

    chunks: list[np.ndarray] = []
    seen = np.zeros(0, np.int64)
    # Distinct ranks grow like draws ** (1 / s): draw in chunks until there are enough.
    per_chunk = max(10_000, distinct_wanted // (4 * ids_per_example))
    while seen.size < distinct_wanted:
        ranks = draw(per_chunk * ids_per_example).reshape(per_chunk, ids_per_example)
        while True:  # distinct ids within a row: redraw duplicates
            ranks.sort(axis=1)
            dup = np.zeros(ranks.shape, bool)
            dup[:, 1:] = ranks[:, 1:] == ranks[:, :-1]
            if not dup.any():
                break
            ranks[dup] = draw(int(dup.sum()))
        chunks.append(ranks)
        seen = np.union1d(seen, ranks.ravel())
    ranks = np.concatenate(chunks)
    unique_ranks, counts = np.unique(ranks, return_counts=True)  # counts = examples holding the id
    ids_of = (ZipfIds.ids_of(unique_ranks).view(np.uint64) >> np.uint64(16)).astype(np.int64)  # 48-bit ids
    if np.unique(ids_of).size != unique_ranks.size:
        raise RuntimeError("48-bit id collision; pick another seed")
    ids = ids_of[np.searchsorted(unique_ranks, ranks)]
    hidden = ((_mix(ids.view(np.uint64)) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 - 0.5) * 1.2
    score = hidden.sum(axis=1)
    labels = (rng.random(ids.shape[0]) < 1.0 / (1.0 + np.exp(-(-1.2 + score - score.mean())))).astype(np.float32)
    ids.sort(axis=1)
    path = os.path.join(d, "train.libsvm")
    write_libsvm(path, ids, labels)
    top = max(1, math.ceil(0.01 * unique_ranks.size))
    order = np.lexsort((unique_ranks, -counts))[:top]  # most examples first, ties by Zipf rank
    np.save(os.path.join(d, "top1pct_ids.npy"), ids_of[order])
    info = {"path": path, "examples": int(ids.shape[0]), "ids_per_example": ids_per_example, "exponent": exponent,
            "seed": seed, "distinct_ids": int(unique_ranks.size), "id_occurrences": int(ids.size),
            "top1pct": top, "top1pct_min_examples": int(counts[order[-1]]),
            "top_ids": os.path.join(d, "top1pct_ids.npy"), "bytes": os.path.getsize(path),
            "generate_s": round(time.perf_counter() - t0, 1)}
    with open(info_path, "w") as f:
        json.dump(info, f, indent=1)
    return info


def memory(args: argparse.Namespace) -> dict[str, Any]:
    budget, num_ps, workers = args.budget_bytes, 2, 2
    optimizer = TrainConfig.flat(train=("unused",), optimizer="ftrl", learning_rate=0.1).optimizer_spec()
    share = share_spec("weights", 1, {"capacity_bytes": budget}, optimizer=optimizer, initializer={"name": "zeros"},
                       num_shares=num_ps)
    probe = DynamicTable(share)
    row_limit_total = probe.row_limit * num_ps
    data = zipf_data(args, distinct_wanted=10 * row_limit_total + 1)
    print(f"[memory] {data['examples']:,} examples, {data['distinct_ids']:,} distinct ids "
          f"({data['distinct_ids'] / row_limit_total:.1f}x the {row_limit_total:,}-row limit), "
          f"file {data['bytes'] / 1e6:.0f} MB", flush=True)
    top_ids = np.load(data["top_ids"])
    common = ["--train", data["path"], "--format", "libsvm", "--model", "logistic", "--optimizer", "ftrl",
              "--learning-rate", "0.1", "--batch-size", "512", "--epochs", "1", "--ps", str(num_ps),
              "--workers", str(workers), "--log-every", "1", "--embedding-table", "dynamic"]
    # (capacity bytes, environment): "budget_mmap" is the budget run with glibc's mmap threshold fixed, so freed
    # large arrays go back to the OS (what part of the RSS is the allocator keeping freed memory).
    configs = {"tiny": (TINY_BYTES, {}), "budget": (budget, {}), "budget_mmap": (budget, MMAP_ENV)}
    runs: dict[str, list[Run]] = {}
    commands = {}
    for rep in range(args.memory_repeats):
        for name in (list(configs) if rep % 2 == 0 else list(configs)[::-1]):
            ckpt = tempfile.mkdtemp(prefix=f"mem-{name}-ckpt-", dir=args.runs)
            capacity, env = configs[name]
            argv = [*common, "--capacity-bytes", str(capacity), "--checkpoint-dir", ckpt]
            commands[name] = "".join(f"{k}={v} " for k, v in env.items()) + shown(argv).replace(ckpt, "CKPT_DIR")
            run_dir = tempfile.mkdtemp(prefix=f"mem-{name}-", dir=args.runs)
            r = psflow_train(argv, run_dir, timeout=args.run_timeout, sample_ps=True, env=env)
            mem: PsMemory = r.pop("memory")  # None only if sampling never started
            if not r.get("failed"):
                m = r.pop("metrics")
                end = last_step_time(run_dir)
                during, whole = mem.peaks(end), mem.peaks(None)
                tables = {int(s["task"].rsplit(":", 1)[1]): s["dynamic_tables"] for s in m["ps"]}
                r["ps"] = {}
                for i in sorted(during):
                    (part,) = tables[i].values()
                    r["ps"][i] = {"peak_training": during[i]["vmhwm"], "sampled_rss_peak_training": during[i]["sampled_rss_peak"],
                                  "peak_whole_run": max(whole[i]["vmhwm"], whole[i]["sampled_rss_peak"]),
                                  "samples": whole[i]["samples"], "table": part}
                latest = sorted(glob.glob(os.path.join(ckpt, "ckpt-*")))[-1]
                kept = read_variables(latest)["weights@ids"]
                r.update(recall_top1pct=float(np.isin(top_ids, kept).mean()), rows_in_checkpoint=int(kept.size),
                         checkpoint=latest, totals=m.get("dynamic_tables", {}).get("weights"),
                         examples=m["examples"], train_seconds=parse_worker_logs(run_dir)["seconds"])
            r.update(repetition=rep)
            runs.setdefault(name, []).append(r)
            print(f"[memory {rep + 1}/{args.memory_repeats} {time.strftime('%H:%M:%S')}] {name}: " + (
                fail_line(r) if r.get("failed") else
                "peak RSS while training " + ", ".join(f"ps{i} {v['peak_training'] / 2**20:.1f} MiB" for i, v in r["ps"].items())
                + f"; recall of the top 1% {r['recall_top1pct']:.4f}"), flush=True)
    alone = {name: table_alone(budget, num_ps, steps=args.probe_steps, env=env)
             for name, env in (("default", {}), ("mmap", MMAP_ENV), ("numpy_index", {"PSFLOW_NATIVE": "0"}))}
    for name, a in alone.items():
        print(f"[memory] table alone, {name} malloc: " + (fail_line(a) if a.get("failed") else
              f"memory_bytes {a['memory_bytes'] / 2**20:.1f} MiB, RSS growth {a['rss_growth'] / 2**20:.1f} MiB, "
              f"peak growth {a['hwm_growth'] / 2**20:.1f} MiB"), flush=True)
    return {"budget_bytes": budget, "num_ps": num_ps, "workers": workers, "share_bytes": share.capacity_bytes,
            "share_row_limit": probe.row_limit, "row_limit_total": row_limit_total,
            "bytes_per_row": share.capacity_bytes // probe.row_limit if probe.row_limit else None,
            "overhead_bytes": probe.overhead_bytes(), "tiny_bytes": TINY_BYTES, "data": data, "mmap_env": MMAP_ENV,
            "commands": commands, "runs": runs, "table_alone": alone,
            "verdict": memory_verdict(budget, share.capacity_bytes, probe.overhead_bytes(), runs)}


def table_alone(budget: int, num_ps: int, *, steps: int, env: dict[str, str]) -> Run:
    """ps task 0's share of the budget table alone, in a fresh child process (``--probe-table``), fed the same kind
    of stream (batches of 512 examples x 39 Zipf draws, the ids ps task 0 owns): its RSS against its memory_bytes."""
    request = json.dumps({"budget": budget, "num_ps": num_ps, "steps": steps})
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe-table", request], cwd=REPO,
                           capture_output=True, text=True, timeout=600, env=dict(os.environ, **env))
    except subprocess.TimeoutExpired:
        return {"failed": True, "tail": ["timed out"]}
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        return {"failed": True, "returncode": p.returncode, "tail": (p.stdout + p.stderr).strip().splitlines()[-8:]}
    return dict(json.loads(lines[-1]), env=env)


def probe_table(request: dict[str, Any]) -> None:
    """The child side of :func:`table_alone`; prints its JSON as the last line."""
    optimizer = TrainConfig.flat(train=("unused",), optimizer="ftrl", learning_rate=0.1).optimizer_spec()
    spec = share_spec("weights", 1, {"capacity_bytes": request["budget"]}, optimizer=optimizer,
                      initializer={"name": "zeros"}, num_shares=request["num_ps"])
    rng = np.random.default_rng(11)

    def batch(table: DynamicTable, step: int) -> None:
        ranks = np.minimum(np.floor((1.0 - rng.random(512 * 39)) ** (-1.0 / 0.1)), float(1 << 40)).astype(np.int64)
        ids = np.unique((ZipfIds.ids_of(ranks).view(np.uint64) >> np.uint64(16)).astype(np.int64))
        mine = ids[owner_of(ids, request["num_ps"]) == 0]
        table.lookup(mine, step=step)
        table.apply_gradients(mine, np.full((mine.size, 1), 0.01, np.float32), step)

    warm = DynamicTable(dataclasses.replace(spec, capacity_bytes=None, capacity_rows=1024))
    for step in range(request.get("warm", 3)):  # the batches' own temporaries, before the baseline is read
        batch(warm, step)
    del warm
    before = proc_status(os.getpid())["VmRSS"]
    table = DynamicTable(spec)
    steps, jump = [], (0, -1)
    hwm = proc_status(os.getpid())["VmHWM"]
    for step in range(request["steps"]):
        batch(table, step)
        s, stats = proc_status(os.getpid()), table.stats()
        jump = max(jump, (s["VmHWM"] - hwm, step))
        hwm = s["VmHWM"]
        steps.append((s["VmRSS"] - before, s["VmHWM"] - before, stats.memory_bytes, stats.index_rebuilds))
    k = jump[1]
    print(json.dumps({
        "steps": request["steps"], "rows": table.stats().rows, "row_limit": table.row_limit,
        "memory_bytes": steps[-1][2], "rss_growth": steps[-1][0], "hwm_growth": steps[-1][1],
        "largest_peak_jump": {"step": k, "bytes": jump[0], "memory_bytes_before": steps[k - 1][2] if k > 0 else 0,
                              "memory_bytes_after": steps[k][2],
                              "index_rebuild": k > 0 and steps[k][3] > steps[k - 1][3]},
        "per_step": steps}))


def memory_verdict(budget: int, share: int, overhead: int, runs: dict[str, list[Run]]) -> dict[str, Any]:
    tiny, big = ok_runs(runs.get("tiny", [])), ok_runs(runs.get("budget", []))
    if not tiny or not big:
        return {}
    out: dict[str, Any] = {"per_ps": {}}
    for i in big[0]["ps"]:
        fixed = statistics.median(r["ps"][i]["peak_training"] - r["ps"][i]["table"]["memory_bytes"] for r in tiny) + overhead
        peak = statistics.median(r["ps"][i]["peak_training"] for r in big)
        whole = statistics.median(r["ps"][i]["peak_whole_run"] for r in big)
        limit = RSS_TARGET * share + fixed
        out["per_ps"][i] = {"fixed_overhead": fixed, "limit": limit, "peak_training": peak, "peak_whole_run": whole,
                            "peak_over_limit": peak / limit, "growth_over_share": (peak - fixed) / share,
                            "whole_run_growth_over_share": (whole - fixed) / share,
                            "table_memory_bytes": statistics.median(r["ps"][i]["table"]["memory_bytes"] for r in big),
                            "tiny_peak_training": statistics.median(r["ps"][i]["peak_training"] for r in tiny)}
    mm = ok_runs(runs.get("budget_mmap", []))
    for i, v in out["per_ps"].items():
        if mm:
            v["mmap_peak_training"] = statistics.median(r["ps"][i]["peak_training"] for r in mm)
            v["mmap_growth_over_share"] = (v["mmap_peak_training"] - v["fixed_overhead"]) / share
            v["mmap_peak_whole_run"] = statistics.median(r["ps"][i]["peak_whole_run"] for r in mm)
    out["rss_met"] = all(v["peak_training"] <= v["limit"] for v in out["per_ps"].values())
    out["recall"] = statistics.median(r["recall_top1pct"] for r in big)
    out["recall_met"] = out["recall"] >= RECALL_TARGET
    return out


def memory_table(res: dict[str, Any]) -> list[str]:
    v = res["verdict"]
    if not v:
        return ["Memory: no successful run pair; see the JSON."]
    mib = 2 ** 20
    lines = ["| ps task | fixed overhead (tiny-table peak − its table + overhead_bytes) | budget share | limit: 1.1 × share + fixed "
             "| peak RSS while training (VmHWM) | (peak − fixed) / share "
             "| peak RSS, whole run (incl. the final checkpoint save; no --eval) "
             "| (whole − fixed) / share | table memory_bytes (Stats) | peak while training, fixed mmap threshold "
             "| (peak − fixed) / share, fixed mmap threshold |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i, p in v["per_ps"].items():
        mm = (f"{p['mmap_peak_training'] / mib:.1f} MiB | {p['mmap_growth_over_share']:.3f}" if "mmap_peak_training" in p else " | ")
        lines.append(f"| ps {i} | {p['fixed_overhead'] / mib:.1f} MiB | {res['share_bytes'] / mib:.1f} MiB | {p['limit'] / mib:.1f} MiB | "
                     f"{p['peak_training'] / mib:.1f} MiB ({'≤' if p['peak_training'] <= p['limit'] else '>'} limit) | "
                     f"{p['growth_over_share']:.3f} | {p['peak_whole_run'] / mib:.1f} MiB | {p['whole_run_growth_over_share']:.3f} | "
                     f"{p['table_memory_bytes'] / mib:.1f} MiB | {mm} |")
    return lines


def table_alone_text(res: dict[str, Any]) -> list[str]:
    alone = res.get("table_alone") or {}
    if not alone or any(a.get("failed") for a in alone.values()):
        return ["The table-alone probe failed; see the JSON."] if alone else []
    mib = 2 ** 20
    d, m, n = alone["default"], alone["mmap"], alone.get("numpy_index")
    j = d["largest_peak_jump"]
    numpy_text = "" if not n or n.get("failed") else (
        f" With the index's numpy loops (`PSFLOW_NATIVE=0`, as where the C extension is not built): resident growth "
        f"{n['rss_growth'] / mib:.1f} MiB ({n['rss_growth'] / n['memory_bytes']:.2f}×), peak growth {n['hwm_growth'] / mib:.1f} MiB "
        f"({n['hwm_growth'] / n['memory_bytes']:.2f}×); largest one-batch rise of the peak +{n['largest_peak_jump']['bytes'] / mib:.1f} "
        f"MiB at batch {n['largest_peak_jump']['step']}"
        + (" (an index doubling)." if n["largest_peak_jump"]["index_rebuild"] else "."))
    return [f"The budget share alone (`--probe-table`: ps task 0's share, {d['row_limit']:,}-row limit, in a fresh process, "
            f"{d['steps']} batches of 512 × 39 draws of the same kind of stream, the ids ps task 0 owns; no RPC, no threads; "
            "the baseline read after 3 batches through a 1,024-row table, so the batches' own temporaries are in it): "
            f"`memory_bytes` {d['memory_bytes'] / mib:.1f} MiB; resident growth after the batches {d['rss_growth'] / mib:.1f} MiB "
            f"({d['rss_growth'] / d['memory_bytes']:.2f}× memory_bytes) with glibc's default malloc, {m['rss_growth'] / mib:.1f} MiB "
            f"({m['rss_growth'] / m['memory_bytes']:.2f}×) with `MALLOC_MMAP_THRESHOLD_=131072`; peak growth (VmHWM) "
            f"{d['hwm_growth'] / mib:.1f} MiB ({d['hwm_growth'] / d['memory_bytes']:.2f}×) and {m['hwm_growth'] / mib:.1f} MiB "
            f"({m['hwm_growth'] / m['memory_bytes']:.2f}×). The largest one-batch rise of the peak, +{j['bytes'] / mib:.1f} MiB, "
            f"came at batch {j['step']}, " + ("the batch whose inserts doubled the id index" if j["index_rebuild"] else
                                               "a batch without an index rebuild")
            + f" (memory_bytes {j['memory_bytes_before'] / mib:.1f} → {j['memory_bytes_after'] / mib:.1f} MiB)." + numpy_text]


# --------------------------------------------------------------------------------------- 3. auc
def criteo_split(args: argparse.Namespace) -> tuple[str, str]:
    d = os.path.join(args.workdir, "criteo_8000_2000")
    os.makedirs(d, exist_ok=True)
    with open(args.criteo) as f:
        lines = f.readlines()
    if len(lines) != 10_000:
        raise RuntimeError(f"{args.criteo}: expected 10,000 rows, found {len(lines):,}")
    train, ev = os.path.join(d, "train.tsv"), os.path.join(d, "eval.tsv")
    for path, part in ((train, lines[:8000]), (ev, lines[8000:])):
        with open(path, "w") as f:
            f.writelines(part)
    return train, ev


def auc(args: argparse.Namespace) -> dict[str, Any]:
    train, ev = criteo_split(args)
    common = ["--train", train, "--eval", ev, "--format", "criteo", "--num-features", str(TABLE_ROWS), "--epochs", "3",
              "--ps", "2", "--workers", "1"]
    runs: dict[str, dict[str, list[Run]]] = {}
    commands: dict[str, dict[str, str]] = {}
    for model in args.auc_models:
        seeds = args.auc_seeds.get(model, 1)
        for seed in range(seeds):
            order = ["static", "dynamic"] if seed % 2 == 0 else ["dynamic", "static"]
            for table in order:
                argv = [*common, "--model", model, "--embedding-table", table, "--seed", str(seed)]
                commands.setdefault(model, {})[table] = shown(argv).replace(f"--seed {seed}", "--seed SEED")
                run_dir = tempfile.mkdtemp(prefix=f"auc-{model}-{table}-", dir=args.runs)
                r = psflow_train(argv, run_dir, timeout=args.run_timeout)
                r.pop("memory", None)
                if not r.get("failed"):
                    m = r.pop("metrics")
                    r.update(eval_auc=m["eval"]["auc"], eval_logloss=m["eval"].get("logloss"), global_step=m["global_step"],
                             dynamic_rows={k: t["rows"] for k, t in (m.get("dynamic_tables") or {}).items()})
                r.update(seed=seed)
                runs.setdefault(model, {}).setdefault(table, []).append(r)
                print(f"[auc {time.strftime('%H:%M:%S')}] {model} {table} seed {seed}: " + (
                    fail_line(r) if r.get("failed") else f"eval AUC {r['eval_auc']:.4f} ({r['wall_s']:.0f} s)"), flush=True)
    return {"train": train, "eval": ev, "commands": commands, "runs": runs}


def auc_table(res: dict[str, Any]) -> list[str]:
    lines = ["| model | seeds | static (2^20 hashed): eval AUC median [min–max] | dynamic (raw ids): eval AUC median [min–max] "
             "| dynamic − static: mean of per-seed differences ± its standard error [min–max] | target ≥ −0.002 | "
             "dynamic rows at the end | "
             "wall s per run, static / dynamic (median) |",
             "|---|---:|---|---|---|---|---|---|"]
    for model, sides in res["runs"].items():
        st = {r["seed"]: r for r in ok_runs(sides.get("static", []))}
        dy = {r["seed"]: r for r in ok_runs(sides.get("dynamic", []))}
        diffs = [dy[s]["eval_auc"] - st[s]["eval_auc"] for s in sorted(set(st) & set(dy))]
        fails = sum(len(rs) - len(ok_runs(rs)) for rs in sides.values())
        sem = f" ± {statistics.stdev(diffs) / math.sqrt(len(diffs)):.4f}" if len(diffs) > 1 else ""
        diff = f"{statistics.mean(diffs):+.4f}{sem} [{min(diffs):+.4f}, {max(diffs):+.4f}]" if diffs else "n/a"
        met = ("met" if statistics.mean(diffs) >= -AUC_TOLERANCE else "not met") if diffs else ""
        rows = ", ".join(f"{k} {v:,}" for k, v in next(iter(dy.values()))["dynamic_rows"].items()) if dy else ""
        if len(rows) > 80:
            total = sum(next(iter(dy.values()))["dynamic_rows"].values())
            rows = f"{len(next(iter(dy.values()))['dynamic_rows'])} tables, {total:,} rows in all"
        wall = (f"{statistics.median(r['wall_s'] for r in st.values()):.0f} / {statistics.median(r['wall_s'] for r in dy.values()):.0f}"
                if st and dy else "")
        when = res.get("measured", {}).get(model)
        lines.append(f"| {model}{f' ({fails} failed)' if fails else ''}{f' (measured {when})' if when else ''} | {len(diffs)} | "
                     f"{median_range([r['eval_auc'] for r in st.values()], '{:.4f}')} | "
                     f"{median_range([r['eval_auc'] for r in dy.values()], '{:.4f}')} | {diff} | {met} | {rows} | {wall} |")
    return lines


# ------------------------------------------------------------------------------------- report
def index_loops() -> str:
    """Which loops the dynamic tables' id index runs in this tree: the C kernels or the numpy fallback."""
    from psflow.ps.dynamic import id_index

    kernels = getattr(id_index, "_KERNELS", None)
    native = os.environ.get("PSFLOW_NATIVE", "1") != "0"
    return "C (psflow.ps._kernels)" if kernels is not None and native else "numpy"


def part_line(meta: dict[str, Any]) -> str:
    return (f"Command: `{meta['command']}` ({meta['date']}; {meta['machine']}; this part {meta['wall_s'] / 60:.1f} min wall; "
            f"1-minute load average {meta['load_before']:.1f} before it: the machine is shared; dynamic tables' id index "
            f"loops: {meta.get('index_loops', '?')}).")


def report(results: dict[str, Any]) -> str:
    out = ["## dynamic tables end to end", "",
           "`benchmarks/bench_dynamic_e2e.py` (its docstring has the details; raw runs in `benchmarks/results/dynamic_e2e.json`). "
           "psflow as in the working tree. Every run is a real `psflow train` (ps and worker processes on 127.0.0.1, psflow "
           "train's default `--transport tcp`); the configurations compared alternate in each repetition (order flipped every "
           "repetition); figures are medians."]
    if "throughput" in results:
        t = results["throughput"]
        out += ["", "### Throughput: static 2^20 rows vs dynamic `--capacity 1048576`", "", part_line(t["meta"]), "",
                f"The tf_peer sparse-LR workload from `benchmarks/workload.py`: {t['train_examples']:,} train "
                f"examples in 4 LIBSVM shards, 39 ids in 2^20 each, {t['eval_examples']:,} eval; logistic, FTRL lr 0.1, batch 512, "
                f"one epoch, async; {t['meta']['repeats']} repetitions. Timed as `bench_tf_peer.py` times psflow: from the chief's "
                "\"initialized the variables\" log line to the last worker `step=` line (`--log-every 1`): start-up "
                "excluded, reading and parsing included. Commands (SHAPE = `--ps 1 --workers 2` or `--ps 2 --workers 2`):", ""]
        cmds = next(iter(t["commands"].values()))
        for name, c in cmds.items():
            c = c.replace("--ps 1 --workers 2", "SHAPE").replace("--ps 2 --workers 2", "SHAPE")
            out.append(f"* {name}: `{c}`")
        out += ["", *throughput_table(t)]
    if "memory" in results:
        mres = results["memory"]
        d, v = mres["data"], mres["verdict"]
        out += ["", "### ps memory under `--capacity-bytes`, and which ids keep a row", "", part_line(mres["meta"]), "",
                f"{d['examples']:,} examples × {d['ids_per_example']} Zipf ids "
                f"(s = {d['exponent']}, 48-bit), {d['distinct_ids']:,} distinct ids: "
                f"{d['distinct_ids'] / mres['row_limit_total']:.1f}× the table's row limit of {mres['row_limit_total']:,} "
                f"({mres['bytes_per_row']} bytes per row: value + FTRL accum/linear + metadata + index); "
                f"budget `--capacity-bytes {mres['budget_bytes']}` ({mres['budget_bytes'] / 2**20:.0f} MiB) over "
                f"{mres['num_ps']} ps tasks, share {mres['share_bytes']:,} bytes each; {mres['workers']} workers, one epoch; "
                f"{len(mres['runs'].get('budget', []))} run(s) of each configuration, alternated. Commands:", ""]
        for name, c in mres["commands"].items():
            out.append(f"* {name}: `{c}`")
        out += ["", "Resident memory of each ps process from /proc, every 10 ms (VmHWM: the exact peak; psutil is not in the "
                "venv). Fixed overhead = the tiny-table run's peak while training − its table's `memory_bytes` + "
                f"`DynamicTable.overhead_bytes()` of the budget share ({mres['overhead_bytes']:,} bytes): Python + numpy + "
                "gRPC + the batches' temporaries, measured on the same data. \"Fixed mmap threshold\": the budget run again "
                "with `MALLOC_MMAP_THRESHOLD_=131072` in the task processes' environment (glibc then returns every freed "
                "array of 128 KiB or more to the OS at once).", "", *memory_table(mres)]
        if v:
            train_s = statistics.median(r["train_seconds"] for r in ok_runs(mres["runs"]["budget"]))
            tot = ok_runs(mres["runs"]["budget"])[-1]["totals"]
            out += ["", f"Peak RSS target (≤ 1.1 × share + fixed overhead, while training): "
                    f"**{'met' if v['rss_met'] else 'NOT met'}**. Recall of the top 1% most frequent ids "
                    f"({d['top1pct']:,} ids, each in ≥ {d['top1pct_min_examples']} examples) that kept a row in the final "
                    f"checkpoint: **{v['recall']:.4f}** (target ≥ {RECALL_TARGET}: {'met' if v['recall_met'] else 'NOT met'}; "
                    f"the tiny table: {statistics.median(r['recall_top1pct'] for r in ok_runs(mres['runs']['tiny'])):.4f}). "
                    f"Budget run: {tot['rows']:,} rows at the end, {tot['admitted']:,} admitted, {tot['evicted_capacity']:,} "
                    f"evicted by capacity, {tot['index_rebuilds']} index rebuilds; training {train_s:.1f} s "
                    f"({d['examples'] / train_s:,.0f} examples/s)."]
        out += ["", *table_alone_text(mres)]
    if "auc" in results:
        a = results["auc"]
        out += ["", "### Eval AUC: hashed static 2^20 vs dynamic raw ids (Criteo sample)", "", part_line(a["meta"]), "",
                "`shared/data/criteo/criteo_1tb_day0_10k.txt`: first 8,000 rows train, last "
                "2,000 eval (~50 positives in eval); 3 epochs; 2 ps + 1 worker, so a run is deterministic for its seed; psflow "
                "train's default optimizers and learning rates per model. Static: hashed 2^20 rows (`--num-features 1048576`; "
                "torch models: 2^20 buckets per feature); dynamic: raw 64-bit hashes. Each seed runs both with the same `--seed` "
                "(it sets the initial embedding values, which differ between the two: a static row's value comes from its "
                "folded index, a dynamic row's from its id). Commands:", ""]
        for model, cmds in a["commands"].items():
            for name, c in cmds.items():
                out.append(f"* {model} {name}: `{c}`")
        out += ["", *auc_table(a)]
        static_aucs = {m: [r["eval_auc"] for r in ok_runs(sides.get("static", []))] for m, sides in a["runs"].items()}
        spreads = {m: max(v) - min(v) for m, v in static_aucs.items() if len(v) > 1 and max(v) > min(v)}
        if spreads:
            out += ["", "Noise: with ~50 positives in the eval set, the same configuration's AUC moves between seeds by "
                    + ", ".join(f"{v:.4f} ({m} static, max − min)" for m, v in spreads.items())
                    + f", so a mean over a few seeds cannot resolve a {AUC_TOLERANCE} difference for the models with random "
                    "embeddings; logistic regression (zero-initialized, no shuffle: the seed changes nothing) isolates what "
                    "hashing into 2^20 rows vs raw ids does."]
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", choices=("throughput", "memory", "auc"), help="run only this part (repeatable)")
    p.add_argument("--quick", action="store_true", help="smoke run: smaller data and budget, 1 repetition, logistic + fm only")
    p.add_argument("--repeats", type=int, help="throughput repetitions (3; --quick 1)")
    p.add_argument("--memory-repeats", type=int, help="memory repetitions (2; --quick 1)")
    p.add_argument("--budget-bytes", type=int, help="memory: --capacity-bytes of the table (32 MiB; --quick 4 MiB)")
    p.add_argument("--auc-models", default=None, help="auc: models, comma-separated (logistic,fm,wide_deep,deepfm; --quick logistic,fm)")
    p.add_argument("--auc-seeds", default=None,
                   help="auc: seeds per model, MODEL=N,... (logistic=2,fm=5,wide_deep=2,deepfm=2; --quick 1 each)")
    p.add_argument("--criteo", default=CRITEO, help="the Criteo sample (10,000 rows)")
    p.add_argument("--workdir", default=os.environ.get("TF_PEER_WORKDIR", "/tmp/tf_peer"), help="data and run scratch")
    p.add_argument("--run-timeout", type=float, default=600.0, help="seconds one psflow train may take")
    p.add_argument("--probe-steps", type=int, default=None, help="memory: steps of the table-alone probe (150; --quick 60)")
    p.add_argument("--no-write", action="store_true", help="print only (no RESULTS.md / JSON)")
    p.add_argument("--report-only", action="store_true", help="rewrite the RESULTS.md section from benchmarks/results/dynamic_e2e.json")
    p.add_argument("--probe-table", help=argparse.SUPPRESS)  # the child of table_alone
    args = p.parse_args()
    if args.probe_table:
        probe_table(json.loads(args.probe_table))
        return
    if args.report_only:
        with open(os.path.join(HERE, "results", "dynamic_e2e.json")) as f:
            replace_section("dynamic_e2e", report(json.load(f)))
        return
    started = time.perf_counter()
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.memory_repeats = args.memory_repeats or (1 if args.quick else 2)
    args.budget_bytes = args.budget_bytes or ((4 if args.quick else 32) << 20)
    args.probe_steps = args.probe_steps or (60 if args.quick else 150)
    args.auc_models = (args.auc_models or ("logistic,fm" if args.quick else "logistic,fm,wide_deep,deepfm")).split(",")
    seeds = {m: 1 for m in args.auc_models} if args.quick else {"logistic": 2, "fm": 5, "wide_deep": 2, "deepfm": 2}
    for pair in (args.auc_seeds.split(",") if args.auc_seeds else []):
        model, n = pair.split("=")
        seeds[model] = int(n)
    args.auc_seeds = seeds
    args.workdir = os.path.abspath(args.workdir)
    args.runs = os.path.join(args.workdir, "dynamic_e2e_runs")
    os.makedirs(args.runs, exist_ok=True)
    parts = args.only or ["throughput", "memory", "auc"]
    json_path = os.path.join(HERE, "results", "dynamic_e2e-quick.json" if args.quick else "dynamic_e2e.json")
    results: dict[str, Any] = {}
    if args.only and os.path.exists(json_path):  # a part run alone replaces that part; the others stay as measured
        with open(json_path) as f:
            results = {k: v for k, v in json.load(f).items() if k in ("throughput", "memory", "auc")}
    command = ".venv/bin/python benchmarks/bench_dynamic_e2e.py" + "".join(f" {shlex.quote(a)}" for a in sys.argv[1:])
    for part in ("throughput", "memory", "auc"):
        if part in parts:
            t0, load = time.perf_counter(), os.getloadavg()[0]
            earlier = results.get(part)
            results[part] = {"throughput": throughput, "memory": memory, "auc": auc}[part](args)
            if part == "auc" and earlier:  # models not rerun keep their runs (and say when they were measured)
                for model, sides in earlier["runs"].items():
                    if model not in results["auc"]["runs"]:
                        results["auc"]["runs"][model] = sides
                        results["auc"]["commands"][model] = earlier["commands"][model]
                        results["auc"].setdefault("measured", {})[model] = earlier.get("measured", {}).get(
                            model, earlier["meta"]["date"])
            results[part]["meta"] = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                     "machine": machine(), "wall_s": time.perf_counter() - t0, "load_before": load,
                                     "repeats": args.repeats, "quick": args.quick, "index_loops": index_loops()}
    body = report(json.loads(json.dumps(results, default=float)))  # as the JSON reads back (int keys become strings)
    print(body)
    print(f"total {(time.perf_counter() - started) / 60:.1f} min")
    if not args.no_write:  # a --quick run keeps its own JSON and leaves RESULTS.md alone
        os.makedirs(os.path.dirname(json_path), exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1, default=float)
        if not args.quick:
            replace_section("dynamic_e2e", body)


if __name__ == "__main__":
    main()
