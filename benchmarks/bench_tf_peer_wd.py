"""psflow vs TensorFlow's own parameter-server runtime on a Wide & Deep CTR model, side by side.

    .venv/bin/python benchmarks/bench_tf_peer_wd.py --repeats 3                      # TF, PyTorch and psflow rows
    .venv/bin/python benchmarks/bench_tf_peer_wd.py --tf-only --repeats 1            # TF + PyTorch rows only
    .venv/bin/python benchmarks/bench_tf_peer_wd.py --formats tsv,tfrecord           # psflow reads both copies

TensorFlow and PyTorch are never imported here: the shared instrument
(``shared/bench/tf_peer_wd``, found next to this checkout or given by ``--harness``;
its README describes the workload, the model and how TF is run and timed) is run
from its own folder, ``tf1_wd.py`` with the TF venv's python (``--tf-venv``,
default ``<workdir>/venv``: tensorflow-cpu==2.21.0, numpy, scikit-learn) and
``torch_ref.py`` with ``--torch-python`` (default: ``<workdir>/venv-torch`` when it
exists, else this python, which must import torch).

Data: the instrument's ``gen_ctr_data.py`` (generated once, into
``<workdir>/data/ctr_wd``): 200,000 train examples in 4 shards + 50,000 eval,
Criteo schema (label, I1..I13, C1..C26), as TFRecord and as Criteo TSV with the
same contents. psflow reads the TSV (``--format criteo``, the default: I as
sign*log1p = TF's log1p(I), C hashed into ``--num-features`` ids per field, so 26 x
262,144 table rows against TF's 569,302 exact ones) and/or the TFRecord files
(``--format tfrecord`` with a schema written from the manifest: C the exact ids
with each field's vocabulary size and I with ``normalizer: log1p``, as TF reads
and transforms them: TF's model exactly; without ``--schema`` psflow infers one
that differs only in the id space, ``--num-features`` rows per field); ``--formats`` picks.

Configurations, alternated in each repetition (TF/psflow pairs, the pair order
flipped every other repetition; the psflow command of each: :func:`psflow_command`):
PyTorch reference (``torch_ref.py``, one process, one epoch, training loop only),
TF single process vs psflow ``--in-process``, TF 1 ps + 2 workers async vs psflow
``--ps 1 --workers 2``, TF 2 ps + 2 workers (14 large tables split in 2) vs psflow
``--ps 2 --workers 2 --partitions 2``, TF 1 ps + 2 workers SyncReplicasOptimizer(2)
vs psflow ``--mode sync --averaging <--sync-averaging>`` with 2 workers. Every
configuration does one epoch: 391 global steps of 512 async, 196 of 2 x 512 sync.

Sync averaging. TF's SyncReplicasOptimizer averages dense gradients over the
workers (ConditionalAccumulator) and is documented to divide each row of a sparse
gradient by the number of workers that sent it (SparseConditionalAccumulator):
psflow's ``per_row``. But that accumulator merges the incoming indices as if they
were sorted, and embedding_lookup's gradients carry the batch's ids unsorted and
repeated, so a row is halved only when the merge happens to pair its entries and
is otherwise summed. Replayed on this data (two workers' batches, per field): TF's
sparse gradient is 0.95-1.00 of the sum for 23 of the 26 tables (0.71, 0.88, 0.81
for the 4-, 6- and 23-row ones), where ``per_row`` would give 0.50-0.73 of it. No
psflow choice is exact; ``sparse_sum`` (sparse rows summed, dense averaged), the
default here as in bench_tf_peer.py, is the closest.

How each side is timed (fixed work, process start-up excluded, input included):
    TF      the instrument's ``--max-global-steps`` mode: from GO (every worker has
            its session; all released together) to the last worker step
            (``examples_per_sec_fixed_work``); also its rate after 40 warm-up
            global steps (``examples_per_sec_after_warmup_steps``).
    psflow  from the chief's "initialized the variables" log line to the last
            ``step=`` line any worker logs (``--log-every 1``: every push logs the
            step it produced, so the step accounting is read from them too); the
            rate after 40 warm-up global steps is taken from the same lines, as
            TF's is. ``--in-process`` has one worker (no step to share) and runs at
            the default ``--log-every 100``, as a user runs it and as TF's
            instrument keeps its per-step samples in memory instead of logging
            them: to its worker's "done after N local steps" line (a log line per
            step with the batch's AUC cost it ~5%, measured side by side).
    PyTorch the instrument's training loop only (its TFRecords are parsed in an
            untimed pre-pass): all 391 steps, and steps 41..391.
Eval AUC: TF and PyTorch from the instrument's summary (NumPy, exact, on the eval
TSV); psflow from its run's ``metrics.json`` (``eval.auc``, exact, on the same
50,000 eval examples in the format it read).

``--user-defaults`` (issue 29): psflow runs the command a user types, with psflow's defaults
(:data:`USER_MODEL_FLAGS`: 2^20 rows per field, the default wide optimizer, transport and
``--log-every``; 2 ps without ``--partitions``; sync with the default averaging): every psflow
shape is then timed to its workers' "done after" lines. Every run (both modes) also records the
end-to-end rate (psflow: examples over the command's wall time, start-up, eval and final checkpoint
included; TF: examples over its start-up to GO plus its fixed work), the CPU seconds of the whole
command (``RUSAGE_CHILDREN``), and the peak RSS (``VmHWM`` from /proc, sampled every 0.1 s while the
process lives) of every ps task (TF's ``tf1_wd.py task --job ps``, psflow's ``psflow.launch.task
--job ps``) and of the one process of the single-process rows. ``--shapes`` picks configurations.

Writes benchmarks/results/tf_peer_wd.json (every run) and the "tf_peer_wd" section
of benchmarks/RESULTS.md (``--json-out`` / ``--results-md`` / ``--section`` move them).
psflow is measured at a snapshot of ``--psflow-rev`` (default HEAD, extracted with
``git archive``, as bench_tf_peer.py does) so concurrent edits to the working tree
cannot change the code mid-run; ``--psflow-rev worktree`` measures the working tree.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import results_md  # noqa: E402
from bench_tf_peer import (  # noqa: E402
    bind,
    extract_psflow,
    harness_env,
    machine,
    median_range,
    ok_runs,
    ratio_of_medians,
    run_harness,
    snapshot_psflow,
)

# child_pids and parse_worker_logs: bench_replicas.py uses them from here
from psflow_timing import WARMUP_STEPS, child_pids, measured, parse_worker_logs, run_psflow_train  # noqa: E402,F401

BATCH = 512
EPOCH_STEPS = 391  # ceil(200,000 / 512): one epoch async
SYNC_STEPS = 196  # ceil(200,000 / (2 x 512)): one epoch with 2 workers aggregated per step
NUM_FEATURES = 262144
# The instrument's model and optimizers: FTRL lr 0.1 on the wide part (psflow's default is TF's estimator default,
# min(0.2, 1/sqrt(columns)) = 0.16 here), Adagrad lr 0.05 on the deep part (psflow's default); initial accumulators 0.1.
MODEL_FLAGS = "--model wide_deep --embedding-dim 8 --hidden 256,128 --wide-optimizer ftrl:learning_rate=0.1"
SECTION = "tf_peer_wd"
# Issue 29's command as a user types it: psflow's defaults for everything else (2^20 hash rows per field, FTRL 0.3
# on the wide part, --transport tcp, --log-every 100, no --partitions, sync's default averaging).
USER_MODEL_FLAGS = "--model wide_deep --embedding-dim 8 --hidden 256,128"
USER_CLUSTER = {"single": ["--in-process", "--ps", "1"], "p1w2-async": ["--ps", "1", "--workers", "2"],
                "p2w2-async": ["--ps", "2", "--workers", "2"], "p1w2-sync": ["--ps", "1", "--workers", "2", "--mode", "sync"]}
Run = dict[str, Any]

# Configurations: (key, what, TF launch arguments, psflow cluster flags ({averaging} filled in), workers aggregated per step).
SHAPES = [
    ("single", "1 process", ["--single"], ["--in-process", "--ps", "1"], 1),
    ("p1w2-async", "1 ps + 2 workers, async", ["--ps", "1", "--workers", "2"], ["--ps", "1", "--workers", "2"], 1),
    ("p2w2-async", "2 ps + 2 workers, async (large tables split in 2)", ["--ps", "2", "--workers", "2"],
     # the instrument splits the tables of >= 10,000 rows (common.PARTITION_MIN_VOCAB); so does psflow (TSV: all of them)
     ["--ps", "2", "--workers", "2", "--partitions", "2", "--model-param", "partition_min_rows=10000"], 1),
    ("p1w2-sync", "1 ps + 2 workers, sync (2 aggregated)", ["--ps", "1", "--workers", "2", "--sync"],
     ["--ps", "1", "--workers", "2", "--mode", "sync", "--averaging", "{averaging}"], 2),
]
WHAT = {key: what for key, what, *_ in SHAPES}


# ----------------------------------------------------------------------------- data
def data_paths(data: str, fmt: str) -> tuple[str, str]:
    """(train glob, eval file) of one format: tsv or tfrecord (the instrument's file names)."""
    return os.path.join(data, f"train-*.{fmt}"), os.path.join(data, f"eval-00000-of-00001.{fmt}")


def prepare_data(args: argparse.Namespace) -> str:
    """Generates the data once (the instrument's gen_ctr_data.py); writes psflow's TFRecord schema; returns the data dir."""
    data = os.path.join(args.workdir, "data", "ctr_wd")
    if not os.path.exists(os.path.join(data, "manifest.json")):
        print(f"generating the workload with the instrument's gen_ctr_data.py into {data} ...", flush=True)
        subprocess.run([args.tf_python, "gen_ctr_data.py", "--out", data], cwd=args.harness, check=True, env=harness_env(args))
    with open(os.path.join(data, "manifest.json")) as f:
        vocabs = [int(c["vocab"]) for c in json.load(f)["categorical_fields"]]
    # psflow's schema for the instrument's Examples: label, I1..I13 (counts, float, log1p as TF's model takes it),
    # C1..C26 (exact ids, int64, each field's vocabulary).
    features: dict[str, Any] = {"label": {"kind": "fixed", "dtype": "float32"}}
    features.update({f"I{i}": {"kind": "fixed", "dtype": "float32", "default": 0.0, "normalizer": "log1p"}
                     for i in range(1, 14)})
    features.update({f"C{f + 1}": {"kind": "varlen", "dtype": "int64", "vocabulary_size": v} for f, v in enumerate(vocabs)})
    with open(schema_path(args), "w") as f:
        json.dump({"label": "label", "features": features}, f, indent=1)
    return data


def schema_path(args: argparse.Namespace) -> str:
    return os.path.join(args.workdir, "ctr_wd_schema.json")


# ------------------------------------------------------------------------ the TF and PyTorch sides
#: Where the instrument's JSON summaries go, under --workdir.
FOLDER = "bench_tf_peer_wd"


def tf_run(args: argparse.Namespace, data: str, launch: list[str], sync: bool) -> Run:
    """One fixed-work run of tf1_wd.py (one epoch)."""
    steps = SYNC_STEPS if sync else EPOCH_STEPS
    tag = "tf-" + "-".join(a.strip("-") for a in launch)
    r = run_harness(args, ["tf1_wd.py", "launch", *launch, "--data-dir", data, "--max-global-steps", str(steps),
                           "--runs-dir", os.path.join(args.workdir, "runs_wd")], tag, folder=FOLDER)
    if r.get("failed"):
        return r
    return {"examples_per_sec": r["examples_per_sec_fixed_work"], "seconds": r["fixed_work_seconds_from_go"],
            "examples": r["fixed_work_examples"], "examples_per_sec_after_warmup": r.get("examples_per_sec_after_warmup_steps"),
            "eval_auc": r["eval_auc"], "eval_logloss": r.get("eval_logloss"), "final_global_step": r["final_global_step"],
            "step_values_returned_by_2plus_workers": r.get("global_step_values_returned_by_2plus_workers"),
            "startup_seconds": r.get("startup_seconds_to_go"), "other_processes_cores": r.get("other_processes_cores_in_window"),
            # start-up (launch to GO) + the fixed work: TF's side of the end-to-end comparison
            "examples_per_sec_end_to_end": r["fixed_work_examples"] / (r["startup_seconds_to_go"] + r["fixed_work_seconds_from_go"])
            if r.get("startup_seconds_to_go") is not None else None,
            "wall_s": r["wall_s"], "tf_version": r.get("tf_version"), "run_dir": r.get("run_dir")}


def torch_run(args: argparse.Namespace, data: str) -> Run:
    """One epoch of torch_ref.py (one process; the training loop is timed, parsing is not)."""
    r = run_harness(args, ["torch_ref.py", "--data-dir", data], "torch-ref", python=args.torch_python, folder=FOLDER)
    if r.get("failed"):
        return r
    return {"examples_per_sec": r["examples_per_sec_all_steps"], "examples_per_sec_after_warmup": r["examples_per_sec"],
            "seconds": r["train_loop_seconds"], "examples": r["examples"], "final_global_step": r["steps"], "eval_auc": r["eval_auc"],
            "eval_logloss": r.get("eval_logloss"), "torch_version": r.get("torch_version"), "torch_threads": r.get("torch_threads"),
            "other_processes_cores": r.get("other_processes_cores_in_window"), "wall_s": r["wall_s"]}


def torch_prepass(args: argparse.Namespace, data: str) -> None:
    """torch_ref.py parses the TFRecords with TF once (cached); done here, untimed, with our TF venv."""
    cache = os.path.join(args.workdir, "runs_wd", "cache", "train_arrays.npz")
    if not os.path.exists(cache):
        subprocess.run([args.tf_python, "torch_ref.py", "prepass", "--data-dir", data, "--cache", cache], cwd=args.harness,
                       env=harness_env(args), check=True, capture_output=True)


# ------------------------------------------------------------------------------ the psflow side
def psflow_command(args: argparse.Namespace, data: str, fmt: str, key: str, output: str) -> list[str]:
    """The ``psflow train`` command line of one configuration (``key`` of SHAPES) reading format ``fmt`` (tsv, tfrecord)."""
    train, ev = data_paths(data, fmt)
    read = ["--format", "criteo"] if fmt == "tsv" else ["--format", "tfrecord", "--schema", schema_path(args)]
    if args.user_defaults:
        return ["psflow", "train", *read, "--train", train, "--eval", ev, *shlex.split(USER_MODEL_FLAGS),
                "--batch-size", str(BATCH), *USER_CLUSTER[key], "--epochs", "1", "--quiet", "--output", output,
                *shlex.split(args.psflow_extra)]
    cluster = next(flags for k, _, _, flags, _ in SHAPES if k == key)
    cluster = [a.format(averaging=args.sync_averaging) for a in cluster]
    if key != "single":
        # Every push logs the step it produced: the step accounting (no step value logged by two workers) is read
        # from these lines. One process has one worker, so no step can be shared: it logs at the default interval.
        cluster += ["--transport", args.psflow_transport, "--log-every", "1"]
    return ["psflow", "train", *read, "--train", train, "--eval", ev, *shlex.split(args.psflow_model),
            "--batch-size", str(BATCH), "--epochs", "1", "--num-features", str(NUM_FEATURES), *cluster,
            "--quiet", "--output", output, *shlex.split(args.psflow_extra)]


def psflow_run(args: argparse.Namespace, data: str, fmt: str, key: str, per_step: int) -> Run:
    """One epoch with ``psflow train`` (a child process importing the measured snapshot); rate timed from its logs."""
    output = tempfile.mkdtemp(prefix=f"psflow-wd-{key}-{fmt}-", dir=os.path.join(args.workdir, "runs_wd"))
    return run_psflow_train(psflow_command(args, data, fmt, key, output), src=args.psflow_src, output=output,
                            timeout=args.run_timeout, per_step=BATCH * per_step,
                            until_done=key == "single" or args.user_defaults)

# ------------------------------------------------------------------------------ schedule and report
Item = tuple[str, str, Callable[[], Run]]  # (row, side, run)


def schedule(args: argparse.Namespace, data: str) -> list[list[Item]]:
    """Groups run in this order in every repetition; inside a group (TF and psflow on one shape) the order alternates."""
    plan: list[list[Item]] = [[("single", "torch", lambda: torch_run(args, data))]] if "single" in args.shapes else []
    for key, _, launch, _, per_step in SHAPES:
        if key not in args.shapes:
            continue
        group: list[Item] = [(key, "tf", bind(tf_run, args, data, launch, per_step > 1))]
        if not args.tf_only:
            group += [(key, f"psflow-{fmt}", bind(psflow_run, args, data, fmt, key, per_step)) for fmt in args.formats]
        plan.append(group)
    return plan


def measure(args: argparse.Namespace, data: str) -> dict[str, dict[str, list[Run]]]:
    runs: dict[str, dict[str, list[Run]]] = {}
    plan = schedule(args, data)
    for rep in range(args.repeats):
        for group in plan:
            for key, side, fn in (group if rep % 2 == 0 else group[::-1]):
                load = os.getloadavg()[0]
                r = dict(measured(fn), repetition=rep, started=time.strftime("%H:%M:%S"), loadavg_1min_before=load)
                runs.setdefault(key, {}).setdefault(side, []).append(r)
                shown = ("FAILED: " + " | ".join(r["tail"])) if r.get("failed") else (
                    f"{r['examples_per_sec']:,.0f} examples/s, end to end {r.get('examples_per_sec_end_to_end') or 0:,.0f}, "
                    f"eval AUC {r['eval_auc']:.4f}, ps peak RSS {r.get('ps_peak_rss_mib') or 0:,.0f} MiB, "
                    f"{r['cpu_seconds']:.1f} CPU s, {r.get('wall_s', 0):.1f} s wall")
                print(f"[{rep + 1}/{args.repeats} {time.strftime('%H:%M:%S')}] {key} {side}: {shown}", flush=True)
    return runs


def _name(side: str, key: str, meta: Run) -> str:
    if side == "torch":
        return f"PyTorch {meta.get('torch_version') or ''}, 1 process (reference: training loop only, input pre-parsed)"
    if side == "tf":
        return f"TF {meta.get('tf_version') or ''} " + ("single process" if key == "single" else "PS")
    fmt = side.split("-", 1)[1]
    return f"psflow {'--in-process' if key == 'single' else ''} ({fmt})".replace("  ", " ")


def _steps(r: Run) -> str:
    if r.get("step_values_returned_by_2plus_workers") is not None:
        return f"{r['final_global_step']} / {r['step_values_returned_by_2plus_workers']}"
    if "step_values_logged_by_2plus_workers" in r:
        missing = f" ({r['step_values_missing']} missing)" if r.get("step_values_missing") else ""
        return f"{r['final_global_step']} / {r['step_values_logged_by_2plus_workers']}{missing}"
    return str(r.get("final_global_step", "–"))


def table(runs: dict[str, dict[str, list[Run]]], meta: Run) -> list[str]:
    lines = ["| shape | system | examples/s, one epoch: median [min–max] | psflow / TF: ratio of medians [per-repetition min–max] "
             f"| examples/s after {WARMUP_STEPS} warm-up global steps (psflow --user-defaults: after its first logged step >= "
             f"{WARMUP_STEPS}, i.e. 100) | psflow / TF after warm-up | examples/s end to end (TF: start-up to GO + work) "
             "| psflow / TF end to end | eval AUC after 1 epoch | ps peak RSS, MiB (VmHWM; the largest ps task; 1 process: "
             "the process) | CPU s, whole command | wall s, whole command "
             "| final global_step / step values seen by 2+ workers, per run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in [s[0] for s in SHAPES]:
        tf_ok = ok_runs(runs.get(key, {}).get("tf", []))
        tf_rate = [r["examples_per_sec"] for r in tf_ok]
        tf_warm = [r["examples_per_sec_after_warmup"] for r in tf_ok if r.get("examples_per_sec_after_warmup")]
        tf_e2e = [r["examples_per_sec_end_to_end"] for r in tf_ok if r.get("examples_per_sec_end_to_end")]
        for side, rs in runs.get(key, {}).items():
            ok = ok_runs(rs)
            rate = [r["examples_per_sec"] for r in ok]
            warm = [r["examples_per_sec_after_warmup"] for r in ok if r.get("examples_per_sec_after_warmup")]
            e2e = [r["examples_per_sec_end_to_end"] for r in ok if r.get("examples_per_sec_end_to_end")]
            auc = [r["eval_auc"] for r in ok if r.get("eval_auc") is not None]
            rss = [r["ps_peak_rss_mib"] for r in ok if r.get("ps_peak_rss_mib")]
            cpu = [r["cpu_seconds"] for r in ok if r.get("cpu_seconds") is not None]
            wall = [r["wall_s"] for r in ok if r.get("wall_s") is not None]
            fails = f" ({len(rs) - len(ok)} failed: {rs[0]['tail'][-1] if rs and rs[0].get('failed') and rs[0]['tail'] else ''})" \
                if len(rs) > len(ok) else ""
            psflow = side.startswith("psflow")
            lines.append(f"| {WHAT[key]} | {_name(side, key, meta)}{fails} | {median_range(rate)} | "
                         f"{ratio_of_medians(rate, tf_rate) if psflow else ''} | {median_range(warm)} | "
                         f"{ratio_of_medians(warm, tf_warm) if psflow else ''} | {median_range(e2e)} | "
                         f"{ratio_of_medians(e2e, tf_e2e) if psflow else ''} | {median_range(auc, '{:.4f}')} | "
                         f"{median_range(rss)} | {median_range(cpu, '{:.1f}')} | {median_range(wall, '{:.1f}')} | "
                         f"{', '.join(_steps(r) for r in ok)} |")
    return lines


def notes(meta: Run, runs: dict[str, dict[str, list[Run]]]) -> list[str]:
    load = [r["loadavg_1min_before"] for k in runs for rs in runs[k].values() for r in rs if "loadavg_1min_before" in r]
    other = [r["other_processes_cores"] for k in runs for rs in runs[k].values() for r in ok_runs(rs)
             if r.get("other_processes_cores") is not None]
    skew = [r["worker_start_skew_s"] for k in runs for side, rs in runs[k].items() if side.startswith("psflow") for r in ok_runs(rs)
            if "worker_start_skew_s" in r]
    commands = [f"- {WHAT[k.split()[0]]}, {k.split()[1]}: `{c}`" for k, c in meta.get("psflow_commands", {}).items()]
    return [
        f"Command: `{meta['command']}` ({meta['date']}; {meta['machine']}). "
        + (f"psflow measured at {meta['psflow']}; " if meta.get("psflow") else "psflow not run (`--tf-only`); ")
        + f"TensorFlow {meta.get('tf_version') or 'not run'} and PyTorch {meta.get('torch_version') or 'not run'} from the shared "
        f"instrument `shared/bench/tf_peer_wd`. {meta['repeats']} repetition(s); in each, PyTorch, then TF and psflow on each shape "
        "back to back (pair order flipped every other repetition).",
        "",
        f"Work: one epoch of {meta['data']} (200,000 examples, Criteo schema: 13 counts, 26 categorical ids, vocabularies 4 to "
        "200,000; Wide & Deep: 26 embeddings of 8 + 13 log1p counts -> 256 -> 128 -> 1, plus a wide linear part; FTRL on the wide "
        "part, Adagrad on the deep part; batch 512): 391 global steps async, 196 of 2 × 512 sync. "
        + (f"psflow reads {', '.join(meta['formats'])}; eval AUC" if meta["formats"] else "Eval AUC")
        + " on the 50,000 eval examples after that epoch.",
        "",
        "Timing (process start-up excluded, reading and parsing included): TF = the instrument's fixed-work figure, from GO (all "
        "workers have a session and are released together) to the last worker step; psflow = from the chief's \"initialized the "
        "variables\" log line to "
        + ("the last worker's \"done after\" line (`--user-defaults`: the default `--log-every 100`)" if meta.get("user_defaults")
           else "the last `step=` line any worker logs (`--log-every 1`; `--in-process`, one worker, so no step to share: the "
           "default `--log-every 100` and its \"done after\" line, as TF's instrument keeps its per-step samples in memory)")
        + (f", worker start skew {median_range(skew, '{:.3f}')} s" if skew and not meta.get("user_defaults") else "")
        + f"; PyTorch = the training loop of torch_ref.py (TFRecords parsed beforehand, untimed). \"After {WARMUP_STEPS} warm-up "
        "global steps\" = from the first moment any worker saw that global step to the last step, as the instrument reports TF "
        "(its headline figure). Sync: TF SyncReplicasOptimizer(2, 2) around FTRL+Adagrad; psflow `--mode sync --averaging "
        f"{meta['sync_averaging']}` (TF sums most sparse rows of the two workers and averages dense gradients: sparse_sum is "
        "the closest of psflow's choices, none is exact; see the script's docstring). "
        + (f"psflow's ps data path: `--transport {meta['psflow_transport']}`." if not meta.get("user_defaults") else
           "**`--user-defaults`**: psflow runs the command a user types (psflow's defaults: 2^20 hash rows per field, its "
           "default wide optimizer, `--transport tcp`, `--log-every 100`, no `--partitions` at 2 ps, sync with the default "
           "averaging), so every psflow row is timed to its workers' \"done after\" lines, and its after-warm-up rate starts "
           "at the first logged step >= 40 (step 100). TF runs its instrument unchanged."),
        "",
        "End to end: psflow = examples over the wall time of the whole `psflow train` command (start-up, training, eval "
        "and the final checkpoint); TF = examples over its launcher's start-up to GO (every worker has its session) plus "
        "its fixed work (TF's weight read-back and eval not counted). ps peak RSS: VmHWM (the kernel's own peak of the "
        "resident set) of each ps task process (TF: `tf1_wd.py task --job ps`; psflow: `psflow.launch.task --job ps`), read "
        "every 0.1 s while it lives; the row shows the largest ps task of the run (per-task figures in the JSON); the "
        "1-process rows show that process (TF `--single`; psflow `--in-process`, its forked reader not counted). CPU s: "
        "user + system seconds of every process the command waited for (RUSAGE_CHILDREN).",
        "",
        *(["psflow commands (`RUN_DIR` = a fresh run directory):", *commands, ""] if commands else []),
        (f"1-minute load average before each run (other jobs share the machine): {median_range(load, '{:.1f}')}; " if load else "")
        + (f"cores used by other processes during TF/PyTorch runs: {median_range(other, '{:.2f}')}. " if other else "")
        + f"Raw runs: `{meta['json_out']}`.",
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default=os.environ.get("TF_PEER_WORKDIR", "/tmp/tf_peer"), help="data, venvs and run scratch")
    p.add_argument("--tf-venv", help="venv with tensorflow-cpu==2.21.0, numpy, scikit-learn (default: <workdir>/venv)")
    p.add_argument("--torch-python", help="python that imports torch 2.13 CPU (default: <workdir>/venv-torch, else this python)")
    p.add_argument("--harness", default=None, help="the shared instrument folder (shared/bench/tf_peer_wd)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--formats", default="tsv", help="what psflow reads, comma-separated: tsv, tfrecord")
    p.add_argument("--tf-only", action="store_true", help="TF and PyTorch rows only (no psflow runs, no git snapshot)")
    p.add_argument("--sync-averaging", default="sparse_sum", choices=["replicas", "per_row", "sparse_sum"],
                   help="psflow's --averaging in the sync configuration (sparse_sum: closest to what TF does here; see above)")
    p.add_argument("--psflow-transport", default="tcp", choices=["grpc", "tcp"], help="psflow's ps data-path carrier")
    p.add_argument("--psflow-model", default=MODEL_FLAGS, help="the model part of the psflow command")
    p.add_argument("--psflow-extra", default="", help="more psflow train flags, appended to every psflow command")
    p.add_argument("--psflow-rev", default="HEAD", help="git revision of psflow to measure, or 'worktree'")
    p.add_argument("--run-timeout", type=float, default=600.0, help="seconds one run may take")
    p.add_argument("--user-defaults", action="store_true",
                   help="psflow runs issue 29's command as a user types it (psflow's defaults; see above)")
    p.add_argument("--shapes", default=",".join(s[0] for s in SHAPES), help="configurations, comma-separated")
    p.add_argument("--section", default=None,
                   help="RESULTS.md section (default tf_peer_wd; tf_peer_wd_user with --user-defaults)")
    p.add_argument("--json-out", default=None,
                   help="raw runs (default results/tf_peer_wd.json; results/tf_peer_wd_user.json with --user-defaults)")
    p.add_argument("--results-md", default=results_md.PATH, help="the markdown file whose tf_peer_wd section is rewritten")
    p.add_argument("--no-write", action="store_true", help="print the table only (no RESULTS.md / JSON)")
    p.add_argument("--report-only", action="store_true", help="rewrite the RESULTS.md section from --json-out")
    args = p.parse_args()
    results_md.PATH = os.path.abspath(args.results_md)
    args.section = args.section or (SECTION + "_user" if args.user_defaults else SECTION)
    args.json_out = os.path.abspath(args.json_out or os.path.join(HERE, "results", args.section + ".json"))
    args.shapes = [k.strip() for k in args.shapes.split(",") if k.strip()]
    if not args.shapes or set(args.shapes) - set(WHAT):
        p.error(f"--shapes: want some of {', '.join(WHAT)}, got {args.shapes}")
    if args.report_only:
        with open(args.json_out) as f:
            saved = json.load(f)
        body = notes(saved["meta"], saved["runs"]) + [""] + table(saved["runs"], saved["meta"])
        results_md.replace_section(args.section, "\n".join(body))
        return
    args.formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if not args.formats or set(args.formats) - {"tsv", "tfrecord"}:
        p.error(f"--formats: want tsv and/or tfrecord, got {args.formats}")
    args.harness = args.harness or next((h for h in [os.path.join(os.path.dirname(REPO), "shared", "bench", "tf_peer_wd"),
                                                      os.path.join(REPO, "shared", "bench", "tf_peer_wd")] if os.path.isdir(h)), None)
    if args.harness is None:
        p.error("the shared instrument (shared/bench/tf_peer_wd) was not found; pass --harness")
    args.workdir, args.harness = os.path.abspath(args.workdir), os.path.abspath(args.harness)
    args.tf_python = os.path.join(os.path.abspath(args.tf_venv or os.path.join(args.workdir, "venv")), "bin", "python")
    if not os.path.exists(args.tf_python):
        p.error(f"no TF venv python at {args.tf_python}; pass --tf-venv")
    torch_venv = os.path.join(args.workdir, "venv-torch", "bin", "python")
    args.torch_python = args.torch_python or (torch_venv if os.path.exists(torch_venv) else sys.executable)
    os.makedirs(os.path.join(args.workdir, "runs_wd"), exist_ok=True)
    label = commit = None
    if not args.tf_only:
        if args.psflow_rev == "worktree":
            commit, label = snapshot_psflow("worktree", args.workdir)
            args.psflow_src = REPO
        else:
            commit, args.psflow_src = extract_psflow(args.psflow_rev, args.workdir)
            label = f"{commit[:10]} (git archive snapshot)"
    data = prepare_data(args)
    torch_prepass(args, data)
    runs = measure(args, data)
    everything = [r for k in runs for rs in runs[k].values() for r in ok_runs(rs)]
    meta = {"command": "benchmarks/bench_tf_peer_wd.py " + " ".join(sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(), "psflow": label,
            "psflow_commit": commit, "repeats": args.repeats, "data": data, "formats": [] if args.tf_only else args.formats,
            "sync_averaging": "replicas (psflow's default)" if args.user_defaults else args.sync_averaging,
            "psflow_transport": args.psflow_transport, "user_defaults": args.user_defaults, "shapes": args.shapes,
            "json_out": os.path.relpath(args.json_out, REPO) if args.json_out.startswith(REPO + os.sep) else args.json_out,
            "tf_version": next((r["tf_version"] for r in everything if r.get("tf_version")), None),
            "torch_version": next((r["torch_version"] for r in everything if r.get("torch_version")), None),
            "psflow_commands": {} if args.tf_only else {
                f"{key} {fmt}": shlex.join(psflow_command(args, data, fmt, key, "RUN_DIR"))
                for key, *_ in SHAPES if key in args.shapes for fmt in args.formats}}
    body = notes(meta, runs) + [""] + table(runs, meta)
    print("\n".join(table(runs, meta)))
    if not args.no_write:
        os.makedirs(os.path.dirname(args.json_out), exist_ok=True)
        with open(args.json_out, "w") as f:
            json.dump({"meta": meta, "runs": runs}, f, indent=1, default=float)
        results_md.replace_section(args.section, "\n".join(body))


if __name__ == "__main__":
    main()
