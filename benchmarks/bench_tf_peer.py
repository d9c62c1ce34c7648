"""psflow vs TensorFlow's own parameter-server runtime, side by side (issue #7).

    .venv/bin/python benchmarks/bench_tf_peer.py --tf-venv /tmp/tf_peer/venv --repeats 3   # ~25 min on 2 cores
    .venv/bin/python benchmarks/bench_tf_peer.py --quick                                   # psflow + NumPy only, 1 repeat
    .venv/bin/python benchmarks/bench_tf_peer.py --tf-venv /tmp/tf_peer/venv --repeats 5 --user-defaults --shapes p1w2-async,p1w2-sync

TensorFlow is never imported here: the shared harness (``shared/bench/tf_peer``,
found next to this checkout or given by ``--harness``) is run from its own folder
with the TF venv's python. Set the TF venv up once with
``python3 -m venv /tmp/tf_peer/venv && /tmp/tf_peer/venv/bin/pip install tensorflow-cpu==2.21.0 numpy``.

Data. With ``--tf-venv``: the harness's ``gen_data.py`` (400,000 train examples in 4
shards + 50,000 eval, TFRecord and LIBSVM with identical contents) into
``<workdir>/data/sparse_lr``; psflow reads the same TFRecord files TF's tf.data
reads (``--formats tfrecord,libsvm`` adds psflow rows reading the LIBSVM copy).
Without it: the same generator semantics from ``benchmarks/workload.py``, LIBSVM only.

Configurations, alternated in each repetition (TF/psflow pairs, the pair order
flipped every other repetition): NumPy reference (the harness's ``numpy_ref.py``,
one epoch), TF single process vs psflow in-process fast path, TF vs psflow with
1 ps + 2 workers async, 2 ps + 2 workers async (weights split in 2), 1 ps + 2
workers sync (TF: SyncReplicasOptimizer(2); psflow: mode sync with
``--sync-averaging``, default sparse_sum: sparse rows summed, which is what TF's
SyncReplicas measured like here — a replay of the same 391 two-batch steps in
NumPy gives TF's AUC when the two gradients are summed, not averaged). Every configuration does the
same work: one epoch (782 global steps of 512 async, 391 of 2 x 512 sync).
``--shapes single,p1w2-async,p2w2-async,p1w2-sync`` (default all) picks the
pairs run (NumPy's reference always runs). Goals in the table: issue 29's
4x TF async and 3x sync at 1 ps + 2 workers, 2x at 2 ps (issue 7's).

How each side is timed (fixed work, process start-up excluded, input included):
    TF      the harness's ``--max-global-steps`` mode: from GO (every worker has its
            session; all released together) to the last worker step; includes
            tf.data reading/parsing and each graph's slow first step.
    psflow  from the chief's "initialized the variables" log line (its first batch
            is read right after it; other workers start when they see the
            variables ready) to the last ``step=`` line any worker logs
            (``log_every=1``: every push logs the step it produced); includes
            reading/parsing the files and any stagger between the workers' starts.
    NumPy   the harness's training loop only (parsing shown separately).
Optionally (``--tf-window W,M``, on by default outside ``--quick``) each TF
configuration is also run in the harness's steady-state mode (W s warm-up, M s
window, global_step delta), which excludes TF's slow start; the table gives
psflow's ratio to both.

``--user-defaults`` (issue 29; as bench_tf_peer_wd.py's): psflow runs the command a user types,
``psflow train --format tfrecord --train ... --eval ... --num-features 1048576 --optimizer ftrl
--learning-rate 0.1 --batch-size 512 --epochs 1 --ps 1 --workers 2 [--mode sync]`` (:func:`lr_command`; the
workload's own settings, everything else psflow's defaults: carrier, sync averaging, ``--log-every 100``), as a
``python -m psflow train`` child process, timed from the chief's "initialized the variables" line to the
workers' last "done after" line. Beside that rate: the rate after 40 warm-up global steps (TF: from its
workers' per-step samples; psflow: from its first logged step >= 40, i.e. 100), the end-to-end rate (psflow:
the whole command's wall time, start-up, eval and final checkpoint included; TF: its start-up to GO plus
its fixed work) and the CPU seconds of the whole command on both sides (RUSAGE_CHILDREN, every run). TF's
steady-state window run is skipped unless ``--tf-window`` asks for it. Timing and CPU helpers are shared
with bench_tf_peer_wd.py (``benchmarks/psflow_timing.py``).

Writes benchmarks/results/tf_peer.json (every run) and the "tf_peer" section of
benchmarks/RESULTS.md (``tf_peer_user`` with ``--user-defaults``; ``--section`` names another).
psflow is measured at a snapshot of ``--psflow-rev`` (default HEAD, extracted with ``git archive``) so concurrent edits to the
working tree cannot change the code mid-run; ``--psflow-rev worktree`` measures
the working tree as it is.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
# parse_worker_logs: bench_dynamic_e2e.py uses it from here
from psflow_timing import (  # noqa: E402,F401
    WARMUP_STEPS,
    measured,
    parse_worker_logs,
    rate_after_warmup,
    run_psflow_train,
)
from results_md import replace_section  # noqa: E402

EPOCH_STEPS = 782  # ceil(400,000 / 512)
NUM_IDS = 1 << 20
BATCH = 512
#: The sparse-LR workload's own settings, as a user types them (issue 29's sparse-LR command; everything else
#: psflow's defaults: carrier, sync averaging, --log-every 100).
LR_FLAGS = ["--num-features", str(NUM_IDS), "--optimizer", "ftrl", "--learning-rate", "0.1", "--batch-size", str(BATCH),
            "--epochs", "1"]
#: --user-defaults: each shape's cluster flags (``--in-process`` has one worker: no --workers).
USER_CLUSTER = {"single": ["--in-process", "--ps", "1"], "p1w2-async": ["--ps", "1", "--workers", "2"],
                "p2w2-async": ["--ps", "2", "--workers", "2"], "p1w2-sync": ["--ps", "1", "--workers", "2", "--mode", "sync"]}
Run = dict[str, Any]


# ----------------------------------------------------------------------------- set-up
def extract_psflow(rev: str, workdir: str) -> tuple[str, str]:
    """psflow at ``rev`` extracted (``git archive``), built and compiled under ``workdir``; returns (commit, its folder).

    Compiled to bytecode (``compileall``) as ``pip install`` compiles a package, and as TensorFlow's venv is:
    run from source with ``PYTHONDONTWRITEBYTECODE=1`` (this machine's environment), every process of every
    run would compile each psflow module again (~0.1 CPU-s per task process), a start-up cost no installed
    psflow pays. The folder's name says so (``<commit>-compiled``); snapshots extracted before 2026-11-27 lack
    the bytecode and stay where they are.
    """
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", rev], capture_output=True, text=True, check=True).stdout.strip()
    dest = os.path.join(workdir, "psflow-src", commit[:12] + "-compiled")
    if not os.path.isdir(os.path.join(dest, "psflow")):
        os.makedirs(dest, exist_ok=True)
        # setup.py (with the files it reads) builds the C input kernels, at commits that have them.
        extra = [p for p in ("setup.py", "pyproject.toml", "README.md")
                 if subprocess.run(["git", "-C", REPO, "cat-file", "-e", f"{commit}:{p}"], capture_output=True).returncode == 0]
        archive = subprocess.run(["git", "-C", REPO, "archive", commit, "psflow", *extra], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
        if "setup.py" in extra:
            subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=dest, check=True,
                           capture_output=True)
        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(dest, "psflow")], check=True,
                       capture_output=True)
    return commit, dest


def snapshot_psflow(rev: str, workdir: str) -> tuple[str, str]:
    """Puts psflow at ``rev`` first on sys.path (and PYTHONPATH, for task processes); returns (commit, label)."""
    head = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    if rev == "worktree":
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--", "psflow"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return head, f"{head[:10]} working tree" + (" (uncommitted changes in psflow/)" if dirty else "")
    commit, dest = extract_psflow(rev, workdir)
    sys.path.insert(0, dest)
    os.environ["PYTHONPATH"] = dest + os.pathsep + os.environ.get("PYTHONPATH", "")
    # Task processes run ``python -m psflow...``, which puts their working directory first on
    # sys.path: from the repository root they would import the working tree, not the snapshot.
    os.chdir(dest)
    return commit, f"{commit[:10]} (git archive snapshot)"


def prepare_data(args: argparse.Namespace) -> tuple[str, list[str]]:
    """Returns (data dir, formats psflow reads). Generates the data once."""
    if args.tf_python:
        data = os.path.join(args.workdir, "data", "sparse_lr")
        if not os.path.exists(os.path.join(data, "manifest.json")):
            print(f"generating the workload with the harness's gen_data.py into {data} ...", flush=True)
            subprocess.run([args.tf_python, "gen_data.py", "--out", data], cwd=args.harness, check=True, env=harness_env(args))
        return data, args.formats
    from workload import ensure_workload

    wl = ensure_workload(args.workdir, n_train=400_000, n_eval=50_000, shards=4)
    if "tfrecord" in args.formats:
        print("no --tf-venv: TFRecord files come from the harness's gen_data.py, which needs TF; psflow reads LIBSVM", flush=True)
    return os.path.dirname(wl.eval), ["libsvm"]


def harness_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ, TF_PEER_WORKDIR=args.workdir)
    env.pop("PYTHONPATH", None)  # the TF (and PyTorch) venvs must not see the psflow snapshot
    return env


def data_files(data: str, fmt: str) -> tuple[list[str], str]:
    return sorted(glob.glob(os.path.join(data, f"train-*-of-00004.{fmt}"))), os.path.join(data, f"eval-00000-of-00001.{fmt}")


# ------------------------------------------------------------------------ the NumPy and TF sides
def run_harness(args: argparse.Namespace, argv: list[str], tag: str, *, python: str | None = None,
                folder: str = "bench_tf_peer") -> Run:
    """Runs one harness script (``argv[0]``, from the harness folder) with ``--json-out`` under
    ``<workdir>/<folder>``, by ``python`` (default: the TF venv's); returns its JSON (or a failure record)."""
    out = os.path.join(args.workdir, folder, f"{tag}-{time.strftime('%H%M%S')}-{os.getpid()}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    cmd = [python or args.tf_python or sys.executable, *argv, "--json-out", out]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=args.harness, env=harness_env(args), capture_output=True, text=True, timeout=args.run_timeout)
        tail = (p.stdout + p.stderr).strip().splitlines()[-3:]
        ok = p.returncode == 0 and os.path.exists(out)
    except subprocess.TimeoutExpired:
        ok, tail = False, [f"timed out after {args.run_timeout} s"]
    if not ok:
        return {"failed": True, "tail": tail, "wall_s": time.perf_counter() - t0}
    with open(out) as f:
        return dict(json.load(f), wall_s=time.perf_counter() - t0, summary_json=out)


def numpy_run(args: argparse.Namespace, data: str) -> Run:
    r = run_harness(args, ["numpy_ref.py", "--epochs", "1", "--data-dir", data], "numpy-ref")
    if r.get("failed"):
        return r
    n = r["examples"]
    return {"examples_per_sec": r["examples_per_sec"], "examples_per_sec_with_parse": n / (r["train_seconds"] + r["parse_train_seconds"]),
            "eval_auc": r["eval_auc"], "train_seconds": r["train_seconds"], "parse_train_seconds": r["parse_train_seconds"]}


def tf_run(args: argparse.Namespace, data: str, launch: list[str], sync: bool, window: tuple[float, float] | None) -> Run:
    """One fixed-work run (one epoch), plus one steady-state window run when ``window`` is given."""
    steps = (EPOCH_STEPS + 1) // 2 if sync else EPOCH_STEPS
    tag = "tf-" + "-".join(a.strip("-") for a in launch)
    r = run_harness(args, ["tf1_ps.py", "launch", *launch, "--data-dir", data, "--runs-dir", os.path.join(args.workdir, "runs"),
                                        "--max-global-steps", str(steps)], tag)
    if r.get("failed"):
        return r
    out = {"examples_per_sec": r["examples_per_sec_fixed_work"], "seconds": r["fixed_work_seconds_from_go"],
           "examples": r["fixed_work_examples"], "eval_auc": r["eval_auc"], "final_global_step": r["final_global_step"],
           "step_values_returned": r["global_step_values_returned"],
           "step_values_returned_by_2plus_workers": r["global_step_values_returned_by_2plus_workers"],
           "startup_seconds": r["startup_seconds_to_go"], "wall_s": r["wall_s"], "tf_version": r.get("tf_version"),
           # start-up (launch to GO) + the fixed work: TF's side of the end-to-end comparison
           "examples_per_sec_end_to_end": r["fixed_work_examples"] / (r["startup_seconds_to_go"] + r["fixed_work_seconds_from_go"]),
           "examples_per_sec_after_warmup": tf_after_warmup(r.get("run_dir"), BATCH * (2 if sync else 1))}
    if window:
        w = run_harness(args, ["tf1_ps.py", "launch", *launch, "--data-dir", data, "--runs-dir", os.path.join(args.workdir, "runs"),
                                            "--warmup", str(window[0]), "--measure", str(window[1])], tag + "-window")
        out["window"] = w if w.get("failed") else {
            "examples_per_sec": w["examples_per_sec_from_global_step"], "eval_auc": w["eval_auc"],
            "cpu_cores_used": w.get("cpu_cores_used_in_window_total"), "machine_cpu_share": w.get("machine_cpu_share_in_window")}
    return out


def tf_after_warmup(run_dir: str | None, per_step: int) -> float | None:
    """TF's rate after WARMUP_STEPS global steps, from its workers' own samples (``worker-*.json`` in the harness's
    run folder: wall time and global_step after every step): from the first sample any worker took at a global step
    >= WARMUP_STEPS to the last one, as bench_tf_peer_wd's instrument reports it and psflow's logs are read."""
    samples = []
    for path in glob.glob(os.path.join(run_dir or "", "worker-*.json")):
        with open(path) as f:
            samples += [(float(t), int(gs)) for t, gs, *_ in json.load(f).get("samples", [])]
    return rate_after_warmup(samples, per_step)


# ------------------------------------------------------------------------------ the psflow side
def lr_command(data: str, fmt: str, flags: list[str], output: str) -> list[str]:
    """``psflow train`` on the sparse-LR workload in ``data`` (format ``fmt``: tfrecord, libsvm) with its own settings
    (:data:`LR_FLAGS`), ``flags`` after them, writing into ``output``; nothing else set (psflow's defaults)."""
    train = os.path.join(data, f"train-*-of-00004.{fmt}")  # the 4 shards of data_files, as a glob
    return ["psflow", "train", "--format", fmt, "--train", train, "--eval", data_files(data, fmt)[1], *LR_FLAGS, *flags,
            "--quiet", "--output", output]


def user_run(args: argparse.Namespace, src: str, data: str, fmt: str, key: str) -> Run:
    """``--user-defaults``: one epoch by the command a user types (:func:`lr_command`, the shape's
    :data:`USER_CLUSTER` flags) with the psflow at ``src``; timed to its workers' "done after" lines."""
    output = tempfile.mkdtemp(prefix=f"psflow-user-{key}-", dir=os.path.join(args.workdir, "runs"))
    per_step = BATCH * (2 if key.endswith("sync") else 1)
    return run_psflow_train(lr_command(data, fmt, USER_CLUSTER[key], output), src=src, output=output,
                            timeout=args.run_timeout, per_step=per_step, until_done=True)


def psflow_run(args: argparse.Namespace, data: str, fmt: str, num_ps: int, mode: str) -> Run:
    """One epoch on a local cluster (real processes, gRPC); rate timed from the logs."""
    from psflow.launch.local import run_local
    from psflow.train.config import TrainConfig

    train, ev = data_files(data, fmt)
    config = TrainConfig.flat(train=tuple(train), eval=(ev,), format=fmt, num_features=NUM_IDS, optimizer="ftrl", learning_rate=0.1,
                              batch_size=512, epochs=1, num_ps=num_ps, num_workers=2, log_every=1, mode=mode,
                              averaging=args.sync_averaging if mode == "sync" else "replicas", transport=args.psflow_transport)
    run_dir = tempfile.mkdtemp(prefix=f"psflow-p{num_ps}w2-{mode}-", dir=os.path.join(args.workdir, "runs"))
    t0 = time.perf_counter()
    try:
        m = run_local(config, run_dir, progress=None)
    except Exception as e:  # noqa: BLE001 - a failed run is recorded, the benchmark goes on
        return {"failed": True, "tail": [f"{type(e).__name__}: {e}"[-600:]], "run_dir": run_dir}
    wall = time.perf_counter() - t0
    timing = parse_worker_logs(run_dir)
    return {"examples_per_sec": m["examples"] / timing["seconds"], "examples": m["examples"], "eval_auc": m["eval"]["auc"],
            "final_global_step": m["global_step"], "examples_per_sec_end_to_end": m["examples"] / wall,
            "wall_s": wall, "run_dir": run_dir, **timing}


def fast_path_run(args: argparse.Namespace, data: str, fmt: str) -> Run:
    """psflow's in-process fast path (``psflow train --in-process``: one worker, the ps services in the same process, no RPC).

    Timed by the worker's own wall_seconds (session with variable initialization, opening the input, every step);
    no per-step logging, which would cost more here than on a cluster.
    """
    try:
        from psflow.launch.in_process import run_in_process
    except ImportError:
        try:  # a commit from before the launch/train split had it in psflow.train
            from psflow.train.in_process import run_in_process  # type: ignore[no-redef]
        except ImportError as e:
            return {"not_available": True, "reason": f"psflow's in_process not importable at the measured commit: {e}"}
    from psflow.train.config import TrainConfig

    train, ev = data_files(data, fmt)
    config = TrainConfig.flat(train=tuple(train), eval=(ev,), format=fmt, num_features=NUM_IDS, optimizer="ftrl", learning_rate=0.1,
                              batch_size=512, epochs=1, num_ps=1, num_workers=1, log_every=10**9)
    run_dir = tempfile.mkdtemp(prefix="psflow-in-process-", dir=os.path.join(args.workdir, "runs"))
    t0 = time.perf_counter()
    try:
        m = run_in_process(config, run_dir)
    except Exception as e:  # noqa: BLE001 - a failed run is recorded, the benchmark goes on
        return {"failed": True, "tail": [f"{type(e).__name__}: {e}"[-600:]], "run_dir": run_dir}
    wall = time.perf_counter() - t0
    seconds = float(m["workers"][0]["wall_seconds"])
    return {"examples_per_sec": m["examples"] / seconds, "seconds": seconds, "examples": m["examples"], "eval_auc": m["eval"]["auc"],
            "final_global_step": m["global_step"], "examples_per_sec_end_to_end": m["examples"] / wall, "wall_s": wall,
            "run_dir": run_dir}


def child_run(args: argparse.Namespace, src: str, kind: str, *spec: Any) -> Run:
    """One psflow run (``psflow_run`` or ``fast_path_run``) in a child process importing psflow from ``src``.

    With ``--baseline-rev`` every psflow run goes through here, both revisions alike, so neither
    runs warm in this process: the two are measured the same way, alternately, in one benchmark run.
    """
    request = {"kind": kind, "spec": list(spec), "workdir": args.workdir, "sync_averaging": args.sync_averaging,
               "psflow_transport": args.psflow_transport}
    env = dict(os.environ, PYTHONPATH=src)
    cmd = [sys.executable, os.path.join(HERE, "bench_tf_peer.py"), "--child", json.dumps(request)]
    try:
        p = subprocess.run(cmd, cwd=src, env=env, capture_output=True, text=True, timeout=args.run_timeout)
    except subprocess.TimeoutExpired:
        return {"failed": True, "tail": [f"timed out after {args.run_timeout} s"]}
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        return {"failed": True, "tail": (p.stdout + p.stderr).strip().splitlines()[-3:]}
    return dict(json.loads(lines[-1]))


def run_child(request: dict[str, Any]) -> None:
    """The child side of :func:`child_run`: one run with the psflow this process imports; its JSON on the last line."""
    args = argparse.Namespace(workdir=request["workdir"], sync_averaging=request["sync_averaging"],
                              psflow_transport=request["psflow_transport"])
    run = psflow_run(args, *request["spec"]) if request["kind"] == "cluster" else fast_path_run(args, *request["spec"])
    print(json.dumps(run, default=float))


# ------------------------------------------------------------------------------ schedule and report
# Cluster shapes: (key, TF launch arguments, psflow ps count, mode, what, goal for psflow / TF: issue 29's
# 4x async and 3x sync at 1 ps + 2 workers; 2x for 2 ps, issue 7's, which issue 29 does not raise).
SHAPES = [
    ("p1w2-async", ["--ps", "1", "--workers", "2"], 1, "async", "1 ps + 2 workers, async", 4.0),
    ("p2w2-async", ["--ps", "2", "--workers", "2"], 2, "async", "2 ps + 2 workers, async (weights split in 2)", 2.0),
    ("p1w2-sync", ["--ps", "1", "--workers", "2", "--sync"], 1, "sync", "1 ps + 2 workers, sync (2 aggregated)", 3.0),
]
#: Every shape ``--shapes`` may name: the single-process pair, then the cluster shapes.
SHAPE_KEYS = ("single", *(s[0] for s in SHAPES))


Item = tuple[str, str, Callable[[], Run]]  # (row, side, run)


def schedule(args: argparse.Namespace, data: str, formats: list[str]) -> list[list[Item]]:
    """Groups run in this order in every repetition; inside a group (TF and psflow on one shape) the order alternates.

    With ``--baseline-rev``, each group also holds the baseline's psflow runs (``psflow-<format>@<rev>``).
    """
    window = None if args.tf_window == "0" else (float(args.tf_window.split(",")[0]), float(args.tf_window.split(",")[1]))
    fast_fmt = formats[0]
    revs: list[tuple[str, str | None]] = [("", args.measured_src)]
    if args.baseline_src:
        revs.append((f"@{args.baseline_rev}", args.baseline_src))

    def run(src: str | None, key: str, kind: str, *spec: Any) -> Callable[[], Run]:
        if args.user_defaults:  # spec: data, format[, ps count, mode]
            return bind(user_run, args, src or REPO, spec[0], spec[1], key)
        if src is None:
            return bind(psflow_run if kind == "cluster" else fast_path_run, args, *spec)
        return bind(child_run, args, src, kind, *spec)

    plan: list[list[Item]] = [[("numpy-ref", "numpy", lambda: numpy_run(args, data))]]
    chosen = set(getattr(args, "shapes", SHAPE_KEYS))
    single: list[Item] = []
    if args.tf_python:
        single.append(("single", "tf", lambda: tf_run(args, data, ["--single"], False, window)))
    single += [("single", f"psflow-{fast_fmt}{suffix}", run(src, "single", "fast", data, fast_fmt)) for suffix, src in revs]
    if "single" in chosen:
        plan.append(single)
    for key, launch, num_ps, mode, _, _ in SHAPES:
        if key not in chosen:
            continue
        pair: list[Item] = []
        if args.tf_python:
            pair.append((key, "tf", bind(tf_run, args, data, launch, mode == "sync", window)))
        for suffix, src in revs:
            for fmt in formats:
                pair.append((key, f"psflow-{fmt}{suffix}", run(src, key, "cluster", data, fmt, num_ps, mode)))
        plan.append(pair)
    return plan


def bind(fn: Callable[..., Run], *a: Any) -> Callable[[], Run]:
    return lambda: fn(*a)


def ok_runs(runs: list[Run]) -> list[Run]:
    return [r for r in runs if not r.get("failed") and not r.get("not_available")]


def median_range(xs: list[float], fmt: str = "{:,.0f}") -> str:
    return (fmt.format(statistics.median(xs)) + f" [{fmt.format(min(xs))}–{fmt.format(max(xs))}]") if xs else "n/a"


def ratio_of_medians(num: list[float], den: list[float]) -> str:
    if not num or not den:
        return "n/a"
    paired = [a / b for a, b in zip(num, den, strict=False)]
    return f"{statistics.median(num) / statistics.median(den):.2f}× [{min(paired):.2f}–{max(paired):.2f}]"


def _steps(r: Run) -> str:
    if "step_values_returned_by_2plus_workers" in r:
        return str(r["step_values_returned_by_2plus_workers"])
    if "step_values_logged_by_2plus_workers" in r:
        missing = r["step_values_missing"]
        return str(r["step_values_logged_by_2plus_workers"]) + (f" ({missing} missing)" if missing else "")
    return "1 worker"


def table(runs: dict[str, dict[str, list[Run]]]) -> list[str]:
    np_runs = ok_runs(runs["numpy-ref"]["numpy"])
    np_auc = statistics.median(r["eval_auc"] for r in np_runs) if np_runs else None
    np_math = statistics.median(r["examples_per_sec"] for r in np_runs) if np_runs else None
    lines = ["| shape | system | examples/s: median [min–max] | psflow / TF, fixed work: ratio of medians [per-repetition min–max] "
             "| psflow / TF steady-state window | goal: result "
             f"| examples/s after {WARMUP_STEPS} warm-up global steps (psflow at --log-every 100: after step 100) "
             "| psflow / TF after warm-up | examples/s end to end (psflow: whole command; TF: start-up to GO + work) "
             "| psflow / TF end to end | CPU s, whole command | wall s, whole command "
             "| eval AUC after 1 epoch | AUC − NumPy (goal: within 0.002) | global_step values returned to 2+ workers, per run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    np_auc_text = median_range([r["eval_auc"] for r in np_runs], "{:.4f}")
    for r_key, r_name in [("examples_per_sec", "NumPy, training loop only (math)"), ("examples_per_sec_with_parse", "NumPy incl. parsing")]:
        lines.append(f"| 1 process | {r_name} | {median_range([r[r_key] for r in np_runs])} | | | | | | | | | | {np_auc_text} | | |")
    what = {"single": "1 process", **{k: w for k, _, _, _, w, _ in SHAPES}}
    for key in [k for k in SHAPE_KEYS if k in runs]:  # the shapes measured (--shapes)
        tf = ok_runs(runs[key].get("tf", []))
        tf_rate = [r["examples_per_sec"] for r in tf]
        tf_window = [r["window"]["examples_per_sec"] for r in tf if not r.get("window", {"failed": True}).get("failed")]
        tf_warm, tf_e2e = _rates(tf, "examples_per_sec_after_warmup"), _rates(tf, "examples_per_sec_end_to_end")
        for side, rs in runs[key].items():
            ok = ok_runs(rs)
            rate, auc = [r["examples_per_sec"] for r in ok], [r["eval_auc"] for r in ok]
            fmt = side.split("-", 1)[-1]
            name = f"psflow in-process fast path ({fmt})" if key == "single" else f"psflow ({fmt})"
            ratio = window = goal = ""
            if side == "tf":
                name = "TF 2.21 " + ("single process" if key == "single" else "PS")
                name += f"; steady-state window: {median_range(tf_window)}" if tf_window else ""
            elif rs and rs[0].get("not_available"):
                lines.append(f"| {what[key]} | {name} | TODO: not available ({rs[0]['reason']}) | | | ≥ 0.8× NumPy math "
                             "| | | | | | | | | |")
                continue
            else:
                ratio = ratio_of_medians(rate, tf_rate)
                window = f"{statistics.median(rate) / statistics.median(tf_window):.2f}×" if rate and tf_window else ""
                goal = _goal(key, rate, tf_rate, np_math)
            fails = len(rs) - len(ok)
            dauc = ""
            if auc and np_auc is not None:
                d = statistics.median(auc) - np_auc
                dauc = f"{d:+.4f} ({'yes' if abs(d) <= 0.002 else 'no'})"
            failed = f" ({fails} failed)" if fails else ""
            warm, e2e = _rates(ok, "examples_per_sec_after_warmup"), _rates(ok, "examples_per_sec_end_to_end")
            psflow = side != "tf"
            lines.append(f"| {what[key]} | {name}{failed} | {median_range(rate)} | {ratio} | {window} | {goal} | "
                         f"{median_range(warm)} | {ratio_of_medians(warm, tf_warm) if psflow else ''} | "
                         f"{median_range(e2e)} | {ratio_of_medians(e2e, tf_e2e) if psflow else ''} | "
                         f"{median_range(_rates(ok, 'cpu_seconds'), '{:.1f}')} | {median_range(_rates(ok, 'wall_s'), '{:.1f}')} | "
                         f"{median_range(auc, '{:.4f}')} | {dauc} | {', '.join(_steps(r) for r in ok)} |")
    return lines


def _rates(runs: list[Run], name: str) -> list[float]:
    """``name`` of every run that has it (runs saved before it was recorded lack it)."""
    return [float(r[name]) for r in runs if r.get(name) is not None]


def _goal(key: str, rate: list[float], tf_rate: list[float], np_math: float | None) -> str:
    if not rate:
        return ""
    if key == "single":
        if np_math is None:
            return "≥ 0.8× NumPy math"
        x = statistics.median(rate) / np_math
        return f"≥ 0.8× NumPy math: {x:.2f}×, {'met' if x >= 0.8 else 'not met'}"
    want = next(s[5] for s in SHAPES if s[0] == key)
    if not tf_rate:
        return f"≥ {want:g}× TF"
    x = statistics.median(rate) / statistics.median(tf_rate)
    return f"≥ {want:g}× TF: {'met' if x >= want else 'not met'}"


def notes(meta: Run, runs: dict[str, dict[str, list[Run]]]) -> list[str]:
    skew = [r["worker_start_skew_s"] for k in runs for side, rs in runs[k].items() if side.startswith("psflow") for r in ok_runs(rs)
            if "worker_start_skew_s" in r]
    tf_start = [r["startup_seconds"] for k in runs for r in ok_runs(runs[k].get("tf", []))]
    load = [r["loadavg_1min_before"] for k in runs for rs in runs[k].values() for r in rs if "loadavg_1min_before" in r]
    return [
        f"Command: `{meta['command']}` ({meta['date']}; {meta['machine']}). psflow measured at {meta['psflow']}; "
        f"TensorFlow {meta['tf_version'] or 'not run'} from the shared harness. {meta['repeats']} repetitions; in each, NumPy, then "
        "TF and psflow on each shape back to back (pair order flipped every other repetition).",
        "",
        f"Work: one epoch of {meta['data']} (400,000 examples, 39 ids each in 2^20; FTRL lr 0.1, power −0.5, "
        "initial accumulator 0.1; batch 512): 782 global steps async, 391 of 2 × 512 sync. psflow reads the files TF reads "
        f"({', '.join(meta['formats'])}); eval AUC on the 50,000 eval examples after that epoch.",
        "",
        "Timing (process start-up excluded, reading and parsing included on both sides): TF = the harness's fixed-work "
        "`--max-global-steps` figure, from GO (all workers have a session and are released together) to the last worker step; "
        "psflow = from the chief's \"initialized the variables\" log line (its first batch is read right after) to the last "
        + ("worker's \"done after\" line (`--user-defaults`: the command a user types, psflow's defaults, `--log-every 100`; "
           "the single-process row likewise, `--in-process`)" if meta.get("user_defaults") else
           "`step=` line any worker logs, so any stagger between the workers' starts counts against psflow "
           f"(worker start skew: {median_range(skew, '{:.3f}')} s)")
        + "; NumPy = the training loop of the harness's numpy_ref.py. "
        "TF's steady-state window (harness default mode, "
        f"{meta['tf_window']} s warm-up,measure; global_step delta) is shown for reference: it excludes TF's slow first steps "
        f"and start-up (TF start-up to GO: {median_range(tf_start, '{:.1f}')} s). Sync: TF SyncReplicasOptimizer(2, 2); psflow "
        + (f"`--mode sync` (its default averaging). psflow's ps data path: its default. After {WARMUP_STEPS} warm-up global "
           "steps: TF from its workers' per-step samples (the first at a global step >= 40 to the last); psflow from its "
           "first logged step >= 40 (step 100) to the last \"done after\" line. End to end: psflow = examples over the "
           "wall time of the whole `psflow train` command (start-up, training, eval, final checkpoint); TF = examples over "
           "its start-up to GO plus its fixed work (its weight read-back and eval not counted). CPU s: user + system "
           "seconds of every process the run waited for (RUSAGE_CHILDREN; TF: the harness's launcher and tasks)."
           if meta.get("user_defaults") else
           f"`--mode sync --averaging {meta.get('sync_averaging', 'per_row')}`. psflow's ps data path: "
           f"`--transport {meta.get('psflow_transport', 'grpc')}`."),
        "",
        *(["psflow commands (`RUN_DIR` = a fresh run directory):",
           *(f"- {k}: `{c}`" for k, c in meta.get("psflow_commands", {}).items()), ""] if meta.get("psflow_commands") else []),
        "Duplicate global_step values: TF = values `sess.run([train_op, global_step])` returned to 2+ workers; psflow = step "
        + ("values logged by 2+ workers (every 100th step and the workers' last)" if meta.get("user_defaults") else
           "values logged by 2+ workers with `--log-every 1` (every push logs the step it produced; \"missing\" = steps no "
           "worker logged)") + ".",
        "",
        (f"Baseline: psflow at {meta['baseline']} (rows `@...`), measured in the same run, alternately with the measured "
         "revision; with a baseline every psflow run is a fresh child process for both revisions alike.\n\n"
         if meta.get("baseline") else "")
        + (f"1-minute load average before each run (2 cores; other jobs share the machine): {median_range(load, '{:.1f}')}. "
           if load else "")
        + f"Raw runs: `benchmarks/results/{meta.get('section') or 'tf_peer'}.json`.",
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tf-venv", help="venv with tensorflow-cpu==2.21.0 (runs the shared harness); without it, psflow + NumPy only")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--psflow-transport", default="grpc", choices=["grpc", "tcp"], help="psflow's ps data-path carrier")
    p.add_argument("--sync-averaging", default="sparse_sum", choices=["replicas", "per_row", "sparse_sum"],
                   help="psflow's sync averaging (sparse_sum: what TF's SyncReplicas measured like)")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 repetition, no TF steady-state window")
    p.add_argument("--formats", default="tfrecord", help="what psflow reads, comma-separated: tfrecord, libsvm")
    p.add_argument("--tf-window", default=None,
                   help="TF steady-state run: warm-up,measure seconds; 0 = skip (default 10,40; 0 with --user-defaults, "
                        "whose steady comparison is the rate after warm-up steps)")
    p.add_argument("--user-defaults", action="store_true",
                   help="psflow runs the sparse-LR command a user types (psflow's defaults, --log-every 100), timed to "
                        "its workers' \"done after\" lines, with end-to-end and after-warm-up rates (see above)")
    p.add_argument("--psflow-rev", default="HEAD", help="git revision of psflow to measure, or 'worktree'")
    p.add_argument("--baseline-rev", help="also measure psflow at this git revision, alternately in the same run "
                   "(rows psflow-<format>@<rev>): before/after figures side by side")
    p.add_argument("--child", help=argparse.SUPPRESS)  # one psflow run in a child process (see child_run)
    p.add_argument("--harness", default=None, help="the shared tf_peer harness folder")
    p.add_argument("--workdir", default=os.environ.get("TF_PEER_WORKDIR", "/tmp/tf_peer"), help="data and run scratch")
    p.add_argument("--run-timeout", type=float, default=600.0, help="seconds one harness run may take")
    p.add_argument("--no-write", action="store_true", help="print the table only (no RESULTS.md / JSON)")
    p.add_argument("--section", default=None,
                   help="the RESULTS.md section written, and results/<section>.json (default tf_peer, tf_peer_user with "
                        "--user-defaults; a new name keeps earlier ones)")
    p.add_argument("--shapes", default=",".join(SHAPE_KEYS),
                   help=f"comma-separated, of {', '.join(SHAPE_KEYS)} (default: all; NumPy's reference always runs)")
    p.add_argument("--report-only", action="store_true", help="rewrite the RESULTS.md section from benchmarks/results/tf_peer.json")
    args = p.parse_args()
    if args.child:
        run_child(json.loads(args.child))
        return
    args.section = args.section or ("tf_peer_user" if args.user_defaults else "tf_peer")
    if args.report_only:
        with open(os.path.join(HERE, "results", f"{args.section}.json")) as f:
            saved = json.load(f)
        replace_section(args.section, "\n".join(notes(saved["meta"], saved["runs"]) + [""] + table(saved["runs"])))
        return
    args.shapes = [k.strip() for k in args.shapes.split(",") if k.strip()]
    if not args.shapes or set(args.shapes) - set(SHAPE_KEYS):
        p.error(f"--shapes: want some of {', '.join(SHAPE_KEYS)}, got {','.join(args.shapes)}")
    if args.tf_window is None:
        args.tf_window = "0" if args.user_defaults else "10,40"
    if args.quick:
        args.repeats, args.tf_window = 1, "0"
    args.formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    args.harness = args.harness or next((h for h in [os.path.join(os.path.dirname(REPO), "shared", "bench", "tf_peer"),
                                                      os.path.join(REPO, "shared", "bench", "tf_peer")] if os.path.isdir(h)), None)
    if args.harness is None:
        p.error("the shared harness (shared/bench/tf_peer) was not found; pass --harness")
    args.workdir, args.harness = os.path.abspath(args.workdir), os.path.abspath(args.harness)
    args.tf_venv = os.path.abspath(args.tf_venv) if args.tf_venv else None
    args.tf_python = os.path.join(args.tf_venv, "bin", "python") if args.tf_venv else None
    if args.tf_python and not os.path.exists(args.tf_python):
        p.error(f"--tf-venv {args.tf_venv}: no bin/python there")
    os.makedirs(os.path.join(args.workdir, "runs"), exist_ok=True)
    args.measured_src = args.baseline_src = None
    if args.baseline_rev:
        if args.psflow_rev == "worktree":
            p.error("--baseline-rev compares two git revisions; commit the working tree first")
        _, args.measured_src = extract_psflow(args.psflow_rev, args.workdir)
        baseline_commit, args.baseline_src = extract_psflow(args.baseline_rev, args.workdir)
    commit, label = snapshot_psflow(args.psflow_rev, args.workdir)
    if args.user_defaults and args.measured_src is None:  # every run a `python -m psflow train` of this tree
        args.measured_src = REPO if args.psflow_rev == "worktree" else extract_psflow(args.psflow_rev, args.workdir)[1]
    try:
        from psflow.data.native import implementation  # the measured snapshot's, imported after snapshot_psflow
        label += f"; input loops: {implementation()}"
    except ImportError:
        label += "; input loops: numpy"
    data, formats = prepare_data(args)
    runs = measure(args, data, formats)
    meta = {"command": "benchmarks/bench_tf_peer.py " + " ".join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": machine(), "psflow": label, "psflow_commit": commit, "repeats": args.repeats, "data": data,
            "formats": formats, "tf_window": args.tf_window, "sync_averaging": args.sync_averaging,
            "psflow_transport": args.psflow_transport, "section": args.section, "user_defaults": args.user_defaults,
            "psflow_commands": {key: shlex.join(lr_command(data, formats[0], USER_CLUSTER[key], "RUN_DIR"))
                                for key in args.shapes} if args.user_defaults else {},
            "baseline": f"{args.baseline_rev} = {baseline_commit[:10]}" if args.baseline_rev else None,
            "tf_version": next((r.get("tf_version") for k in runs for r in ok_runs(runs[k].get("tf", []))), None)}
    body = notes(meta, runs) + [""] + table(runs)
    print("\n".join(table(runs)))
    if not args.no_write:
        os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
        with open(os.path.join(HERE, "results", f"{args.section}.json"), "w") as f:
            json.dump({"meta": meta, "runs": runs}, f, indent=1, default=float)
        replace_section(args.section, "\n".join(body))


def measure(args: argparse.Namespace, data: str, formats: list[str]) -> dict[str, dict[str, list[Run]]]:
    runs: dict[str, dict[str, list[Run]]] = {}
    plan = schedule(args, data, formats)
    for rep in range(args.repeats):
        for group in plan:
            for key, side, fn in (group if rep % 2 == 0 else group[::-1]):
                load = os.getloadavg()[0]
                r = dict(measured(fn), repetition=rep, started=time.strftime("%H:%M:%S"), loadavg_1min_before=load)
                runs.setdefault(key, {}).setdefault(side, []).append(r)
                shown = ("FAILED: " + " | ".join(r["tail"])) if r.get("failed") else ("not available" if r.get("not_available") else
                         f"{r['examples_per_sec']:,.0f} examples/s, eval AUC {r['eval_auc']:.4f}")
                print(f"[{rep + 1}/{args.repeats} {time.strftime('%H:%M:%S')}] {key} {side}: {shown}", flush=True)
    return runs


def machine() -> str:
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}"


if __name__ == "__main__":
    main()
