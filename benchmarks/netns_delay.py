"""Latency: sparse LR through the delaying relay, against the same relay at 0 ms and against loopback.

    sudo .venv/bin/python benchmarks/bench_netns.py --delay 1 --pairs 3 --epochs 1 [--steps-in-flight 1,2]

Part of ``bench_netns.py`` (``--delay MS``; needs root). Each task is
``psflow server`` with the ``TF_CONFIG`` a TFJob gives it (2 ps + 4 workers by
default, worker 0 the chief: 6 hosts), asynchronous mode, gRPC, on the
400,000-example sparse-LR TFRecord files of the TF peer workload
(``--data``; each worker reads one of the four shards), FTRL, batch 512,
``--log-every 1``. Three sides, alternated in each repetition (the order
rotates, so machine drift hits every side about equally):

* ``loopback``: every task on 127.0.0.1, no namespace, no relay;
* ``relay0``: each task in its own namespace, every call through the relay
  (tests/netns.py) at 0 ms: the relay's own CPU on these cores, no delay;
* ``relayD``: the same at ``--delay`` ms each way (a round trip costs
  ``2 x delay`` ms more).

With ``--steps-in-flight 1,2`` each side runs once per value (the workers'
``--steps-in-flight``); ``default`` leaves the flag out (the revision's default).

Per run: ``steady`` examples/s (from the step lines: the steps after the first
10% of the final global step, over their time, times the batch size),
``train`` (all examples over the time from the chief's "initialized the variables" to the
last step line), ``end to end`` (all examples over the wall time from starting the
tasks to the last worker's exit), and the CPU seconds of every process the run
started (tasks and relay). Ratios are per repetition, then the median. The
1-minute load average at each run's start is recorded (other processes on the
machine).

With ``--auc``, after the timed repetitions, one more run per
``--steps-in-flight`` value on the ``relayD`` side (the largest staleness),
untimed, with ``--eval`` (the folder's eval file, evaluated once by the chief at
the end): the model's AUC per K, the staleness cost of steps in flight.

Results: benchmarks/results/netns_delay_<D>ms.json and RESULTS.md's
netns_delay_<D>ms section for the 4-host layout those names first held
(``--ps 2 --workers 2``); any other layout adds its host count
(netns_delay_<D>ms_<N>hosts, e.g. the default 2 ps + 4 workers: ``_6hosts``),
so one layout's run never replaces another's.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_tf_peer import snapshot_psflow
from netns import NetnsLab
from psflow_timing import STEP_LINE, stamped_lines
from results_md import replace_section

from psflow.launch.ports import free_ports

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = "/tmp/tf_peer/data/sparse_lr"
PORT = 2222
#: The tracked results (with RESULTS.md's section of the same name, :func:`section_name`) when no --output is given.
TRACKED_JSON = os.path.join(HERE, "results", "{name}.json")
_DONE = re.compile(r"worker (\d+): done after (\d+) local steps \((\d+) examples\)")
_EVAL = re.compile(r"eval step=(\d+) .*\bauc=([0-9.]+)")
#: The layout whose sections are named without a host count (they were written before the count was in the name).
_UNSUFFIXED_HOSTS = 4


def section_name(delay: float, ps: int, workers: int) -> str:
    """RESULTS.md's section (and the tracked JSON's stem) for one delay and layout: ``netns_delay_<D>ms`` for
    2 ps + 2 workers' 4 hosts, ``netns_delay_<D>ms_<N>hosts`` for any other count (see the module docstring)."""
    hosts = ps + workers
    return f"netns_delay_{delay:g}ms" + ("" if hosts == _UNSUFFIXED_HOSTS else f"_{hosts}hosts")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--delay", type=float, metavar="MS", help="latency benchmark: one-way relay delay in ms (a round "
                   "trip costs 2 x MS more); compared with the same relay at 0 ms and with loopback")
    p.add_argument("--ps", type=int, default=2, help="(--delay) ps tasks (2)")
    p.add_argument("--workers", type=int, default=4, help="(--delay) worker tasks, worker 0 the chief (4)")
    p.add_argument("--data", default=DATA, help=f"(--delay) the sparse-LR TFRecord folder ({DATA})")
    p.add_argument("--steps-in-flight", default="default", metavar="K,K",
                   help="(--delay) the workers' --steps-in-flight values to run ('default': the flag left out)")
    p.add_argument("--sides", default="loopback,relay0,relayD", help="(--delay) which sides to run")
    p.add_argument("--run-timeout", type=float, default=900.0)
    p.add_argument("--rev", default="worktree", help="(--delay) the psflow measured: a revision, extracted, built and "
                   "run from a snapshot under /tmp/tf_peer/psflow-src (others' uncommitted edits in the checkout do "
                   "not reach it), or 'worktree' (the checkout as it is; the default)")
    p.add_argument("--auc", action="store_true", help="(--delay) after the timed runs, one untimed run per "
                   "--steps-in-flight value through the relay at the delay with --eval: AUC per K")


def _tf_config(cluster: dict[str, list[str]], job: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})


def _eval_file(args: argparse.Namespace) -> str:
    path = os.path.join(args.data, "eval-00000-of-00001.tfrecord")
    if not os.path.exists(path):
        raise SystemExit(f"bench_netns --delay --auc: no eval file {path}")
    return path


def _train_flags(args: argparse.Namespace, k: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(args.data, "train-*-of-00004.tfrecord")))
    if len(files) != 4:
        raise SystemExit(f"bench_netns --delay: expected 4 train-*-of-00004.tfrecord files in {args.data}")
    flags = ["--train", os.path.join(args.data, "train-*-of-00004.tfrecord"), "--format", "tfrecord",
             "--num-features", str(1 << 20), "--optimizer", "ftrl", "--learning-rate", "0.1", "--batch-size", "512",
             "--epochs", str(args.epochs), "--mode", "async", "--log-every", "1", "--no-status",
             "--connect-timeout", "120"]
    return flags + ([] if k == "default" else ["--steps-in-flight", k])


def _parse(workdir: str, batch: int) -> dict[str, Any]:
    start: float | None = None
    steps: list[tuple[float, int]] = []
    examples = 0
    for t, line in stamped_lines(sorted(glob.glob(os.path.join(workdir, "worker-*.log")))):
        if "initialized the variables" in line:
            start = t
        m = STEP_LINE.search(line)
        if m:
            steps.append((t, int(m.group(2))))
        d = _DONE.search(line)
        if d:
            examples += int(d.group(3))
    if start is None or not steps:
        raise RuntimeError(f"{workdir}: no 'initialized the variables' or step= lines in the worker logs")
    steps.sort()
    last_t, final = max(t for t, _ in steps), max(s for _, s in steps)
    values = [s for _, s in steps]
    if len(values) != len(set(values)):
        raise RuntimeError(f"{workdir}: a step value was logged twice")
    t10, s10 = next((t, s) for t, s in steps if s >= final // 10)
    return {"steady_eps": (final - s10) * batch / (last_t - t10), "train_eps": examples / (last_t - start),
            "examples": examples, "final_step": final, "train_seconds": last_t - start}


def _wait(procs: dict[str, subprocess.Popen[bytes]], workdir: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for name, p in procs.items():
        code = p.wait(timeout=max(1.0, deadline - time.monotonic()))
        if code != 0:
            tail = Path(workdir, f"{name}.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{name} exited {code}:\n{tail}")


def _auc(workdir: str) -> float:
    """The AUC of the last ``eval step=`` line in the worker logs (the chief's evaluation at the end)."""
    found: list[tuple[int, float]] = []
    for path in sorted(glob.glob(os.path.join(workdir, "worker-*.log"))):
        with open(path, errors="replace") as f:
            found += [(int(m.group(1)), float(m.group(2))) for m in map(_EVAL.search, f) if m]
    if not found:
        raise RuntimeError(f"{workdir}: no 'eval step=... auc=' line in the worker logs")
    return max(found)[1]


def run_once(args: argparse.Namespace, side: str, k: str, *, evaluate: bool = False) -> dict[str, Any]:
    """One run of one side (see the module docstring); returns its figures. With ``evaluate``, the workers also
    get ``--eval`` (evaluated at the end only) and the figures include its ``auc``."""
    tasks = [("ps", i) for i in range(args.ps)] + [("worker", i) for i in range(args.workers)]
    names = [f"{job}{i}" for job, i in tasks]
    token = secrets.token_hex(16)
    flags = _train_flags(args, k)
    if evaluate:
        flags += ["--eval", _eval_file(args), "--eval-every-steps", str(1 << 30)]
    load = os.getloadavg()[0]
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory(prefix=f"bench-delay-{side}-") as workdir:
        procs: dict[str, subprocess.Popen[bytes]] = {}
        if side == "loopback":
            ports = free_ports(len(tasks))
            addr = {n: f"127.0.0.1:{p}" for n, p in zip(names, ports, strict=True)}
            lab = None
        else:
            lab = NetnsLab(names).__enter__()
            addr = {n: f"{lab.hosts[n].front}:{PORT}" for n in names}
            lab.start_relay({n: PORT for n in names}, delay=(args.delay if side == "relayD" else 0.0) / 1000.0)
        cluster = {"ps": [addr[f"ps{i}"] for i in range(args.ps)],
                   "worker": [addr[f"worker{i}"] for i in range(args.workers)]}
        try:
            t0 = time.perf_counter()
            for (job, i), name in zip(tasks, names, strict=True):
                env = dict(os.environ, PSFLOW_TOKEN=token, PYTHONUNBUFFERED="1", TF_CONFIG=_tf_config(cluster, job, i))
                cmd = [sys.executable, "-m", "psflow", "server", *(flags if job == "worker" else [])]
                log = os.path.join(workdir, f"{job}-{i}.log")
                if lab is None:
                    with open(log, "ab") as out:
                        procs[f"{job}-{i}"] = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                                               stdin=subprocess.DEVNULL, process_group=0)
                else:
                    procs[f"{job}-{i}"] = lab.spawn(name, [*cmd, "--bind-host", lab.hosts[name].address], env=env,
                                                    log=Path(log))
            _wait({n: p for n, p in procs.items() if n.startswith("worker")}, workdir, args.run_timeout)
            wall = time.perf_counter() - t0
            _wait({n: p for n, p in procs.items() if n.startswith("ps")}, workdir, 60.0)
            figures = _parse(workdir, 512)
            if evaluate:
                figures["auc"] = _auc(workdir)
        finally:
            for p in procs.values():  # only what this run started, by pid
                if p.poll() is None:
                    os.killpg(p.pid, 9)
                    p.wait()
            if lab is not None:
                lab.close()
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    return {"side": side, "steps_in_flight": k, "wall_seconds": wall, "end_to_end_eps": figures["examples"] / wall,
            "cpu_seconds": cpu, "load_average_1min": load, **figures}


def main(args: argparse.Namespace) -> int:
    if args.auc:
        _eval_file(args)  # before the timed runs: a missing file fails at once
    name = section_name(args.delay, args.ps, args.workers)
    output = os.path.abspath(args.output or TRACKED_JSON.format(name=name))
    _, psflow_label = snapshot_psflow(args.rev, "/tmp/tf_peer")
    # ``python -m psflow`` puts its working directory first on sys.path: from a checkout it would import that
    # checkout, not the psflow PYTHONPATH names (a snapshot being measured).
    os.chdir(tempfile.gettempdir())
    sides = [s for s in args.sides.split(",") if s]
    ks = [k for k in args.steps_in_flight.split(",") if k]
    runs: list[dict[str, Any]] = []
    for rep in range(args.pairs):
        combos = [(s, k) for k in ks for s in sides]
        shift = rep % len(combos)
        for side, k in combos[shift:] + combos[:shift]:
            r = run_once(args, side, k)
            r["rep"] = rep
            runs.append(r)
            print(f"rep {rep + 1} {side:8s} K={k:7s} steady {r['steady_eps']:>9,.0f}  train {r['train_eps']:>9,.0f}  "
                  f"e2e {r['end_to_end_eps']:>9,.0f} ex/s  wall {r['wall_seconds']:.1f} s  cpu {r['cpu_seconds']:.1f} s  "
                  f"examples {r['examples']}  load {r['load_average_1min']:.1f}", flush=True)
    auc_runs: list[dict[str, Any]] = []
    if args.auc:
        for k in ks:
            r = run_once(args, "relayD", k, evaluate=True)
            auc_runs.append(r)
            print(f"auc      relayD   K={k:7s} auc {r['auc']:.4f}  examples {r['examples']}  "
                  f"final step {r['final_step']}  load {r['load_average_1min']:.1f}", flush=True)
    result = {"workload": f"sparse LR (400,000 examples, TFRecord, FTRL, batch 512), {args.ps} ps + {args.workers} "
                          f"workers, async, gRPC, {args.epochs} epoch(s), --log-every 1",
              "psflow": psflow_label, "delay_ms_one_way": args.delay, "round_trip_added_ms": 2 * args.delay, "pairs": args.pairs,
              "summary": _summary(runs, sides, ks), "runs": runs, "auc_runs": auc_runs, "cpus": os.cpu_count(),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as f:
        json.dump(result, f, indent=1)
    if args.output is None:
        replace_section(name, _markdown(result, args))
    for row in result["summary"]:
        print(row)
    print(f"results: {output}")
    return 0


def _ratio(runs: list[dict[str, Any]], key: str, a: tuple[str, str], b: tuple[str, str]) -> float | None:
    ratios = []
    for rep in sorted({r["rep"] for r in runs}):
        x = [r[key] for r in runs if r["rep"] == rep and (r["side"], r["steps_in_flight"]) == a]
        y = [r[key] for r in runs if r["rep"] == rep and (r["side"], r["steps_in_flight"]) == b]
        if x and y:
            ratios.append(x[0] / y[0])
    return statistics.median(ratios) if ratios else None


def _summary(runs: list[dict[str, Any]], sides: list[str], ks: list[str]) -> list[dict[str, Any]]:
    rows = []
    for k in ks:
        for side in sides:
            mine = [r for r in runs if r["side"] == side and r["steps_in_flight"] == k]
            row: dict[str, Any] = {"side": side, "steps_in_flight": k}
            for key in ("steady_eps", "train_eps", "end_to_end_eps", "cpu_seconds", "wall_seconds"):
                row[key] = statistics.median(r[key] for r in mine)
            for key in ("steady_eps", "end_to_end_eps"):
                row[f"{key}_over_relay0"] = _ratio(runs, key, (side, k), ("relay0", k))
                row[f"{key}_over_loopback"] = _ratio(runs, key, (side, k), ("loopback", k))
                row[f"{key}_over_K{ks[0]}"] = _ratio(runs, key, (side, k), (side, ks[0]))
            rows.append(row)
    return rows


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def _markdown(result: dict[str, Any], args: argparse.Namespace) -> str:
    """The netns_delay_<D>ms[_<N>hosts] section of RESULTS.md."""
    ks = args.steps_in_flight.split(",")
    loads = [r["load_average_1min"] for r in result["runs"] + result["auc_runs"]]
    lines = [
        f"Command: `benchmarks/bench_netns.py --delay {args.delay:g} --pairs {args.pairs} --epochs {args.epochs} "
        f"--ps {args.ps} --workers {args.workers} "
        f"--steps-in-flight {args.steps_in_flight}{' --auc' if result['auc_runs'] else ''}"
        f"{'' if args.rev == 'worktree' else ' --rev ' + args.rev}` ({result['date']}, {result['cpus']} cores, psflow "
        f"{result.get('psflow', 'working tree')}): {result['workload']}; "
        f"each task in its own network namespace, every call through tests/netns.py's relay at {args.delay:g} ms each way "
        f"({2 * args.delay:g} ms more per round trip) or 0 ms, and all on 127.0.0.1 (loopback), alternated in each "
        "repetition. Ratios: median of the per-repetition ratios. CPU: every process of the run (tasks and relay). "
        f"1-minute load average at the runs' starts: {min(loads):.1f}-{max(loads):.1f}.", "",
        f"| side | steps in flight | steady ex/s | end-to-end ex/s | steady / relay 0 ms | steady / loopback | "
        f"end-to-end / relay 0 ms | end-to-end / loopback | steady / K={ks[0]} | wall s | CPU s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in result["summary"]:
        side = {"relayD": f"relay {args.delay:g} ms", "relay0": "relay 0 ms"}.get(row["side"], row["side"])
        lines.append(
            f"| {side} | {row['steps_in_flight']} | {row['steady_eps']:,.0f} | {row['end_to_end_eps']:,.0f} | "
            f"{_fmt(row['steady_eps_over_relay0'])} | {_fmt(row['steady_eps_over_loopback'])} | "
            f"{_fmt(row['end_to_end_eps_over_relay0'])} | {_fmt(row['end_to_end_eps_over_loopback'])} | "
            f"{_fmt(row['steady_eps_over_K' + ks[0]])} | {row['wall_seconds']:.1f} | {row['cpu_seconds']:.1f} |")
    lines += ["", f"Relay {args.delay:g} ms / relay 0 ms, same K, per repetition (steady; end to end):", ""]
    for k in ks:
        per_rep = [(_rep_ratio(result["runs"], rep, k, "steady_eps"), _rep_ratio(result["runs"], rep, k, "end_to_end_eps"))
                   for rep in range(args.pairs)]
        lines.append(f"- K={k}: " + " / ".join(_fmt(a) for a, _ in per_rep) + "; "
                     + " / ".join(_fmt(b) for _, b in per_rep))
    if result["auc_runs"]:
        base = result["auc_runs"][0]["auc"]
        lines += ["", f"AUC on the eval file (one untimed run per K through the relay at {args.delay:g} ms, `--auc`; "
                  "evaluated by the chief at the end):", "",
                  f"| steps in flight | AUC | AUC - K={ks[0]}'s | examples | final global step |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {r['steps_in_flight']} | {r['auc']:.4f} | {r['auc'] - base:+.4f} | {r['examples']:,} | "
                  f"{r['final_step']:,} |" for r in result["auc_runs"]]
    return "\n".join(lines)


def _rep_ratio(runs: list[dict[str, Any]], rep: int, k: str, key: str) -> float | None:
    """relayD over relay0 in one repetition at one K (None if either side is missing)."""
    x = [r[key] for r in runs if r["rep"] == rep and r["steps_in_flight"] == k and r["side"] == "relayD"]
    y = [r[key] for r in runs if r["rep"] == rep and r["steps_in_flight"] == k and r["side"] == "relay0"]
    return x[0] / y[0] if x and y else None
