"""The built-in models' default settings against logistic regression, on small data and on large (issue 25, item 11).

    .venv/bin/python benchmarks/bench_model_defaults.py                       # both parts, 5 seeds on the sample
    .venv/bin/python benchmarks/bench_model_defaults.py --parts sample --seeds 5 --models logistic,fm

A built-in model's defaults should not lose to logistic regression on the data its docs use. Every run is
``psflow train --format criteo --ps 2 --workers 2`` with every other setting at its default (batch 512,
``--num-features`` 2^20, ``--embedding-dim`` 8, ``--hidden 256,128``, the model's own optimizers), so the two
workers push asynchronously, as a user's first run does; the seed (``--seed``) and the push order vary.

Parts (``--parts``):
    sample  the Criteo sample (``shared/data/criteo/criteo_1tb_day0_10k.txt``): the first 8,000 rows train, the
            last 2,000 evaluate (55 positives: one seed is noisy, hence ``--seeds``, default 5), 3 epochs (47
            global steps). Target: fm's and wide_deep's mean eval AUC >= logistic's mean - 0.02.
    large   the Wide & Deep peer benchmark's workload (``shared/bench/tf_peer_wd``: 200,000 train rows in 4 files
            and 50,000 eval rows of Criteo schema whose labels hold interactions and non-linear dense terms;
            generated here, TSV only, by the instrument's own ``generate`` and ``write_tsv``), 1 epoch (391 steps),
            ``--large-seeds`` seeds (default 2): do the defaults tuned for small data lose anything at scale?

Each model that changed runs with today's defaults and with the previous ones given as flags (the rows
"previous defaults"), so one tree measures both: fm's dense factors at Adagrad 0.05
(``--model-param dense_embedding_optimizer=...``), the wide (linear) part of wide_deep and deepfm at TensorFlow's
FTRL learning rate ``min(0.2, 1/sqrt(39 columns))`` = 0.16 (``--wide-optimizer ftrl:learning_rate=0.16``); and
wide_deep and deepfm also with the wide part at logistic's FTRL rate, 0.5 (the default sits between the two).

Writes benchmarks/results/model_defaults.json (every run) and model_defaults.md (the tables), and the
"model_defaults" section of benchmarks/RESULTS.md. psflow is measured at a ``git archive`` snapshot of
``--psflow-rev`` (default HEAD; ``worktree``: the working tree), as bench_tf_peer.py does.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_tf_peer import machine, snapshot_psflow  # noqa: E402
from results_md import replace_section  # noqa: E402

SHARED = os.path.join(os.path.dirname(REPO), "shared")
CRITEO = os.path.join(SHARED, "data", "criteo", "criteo_1tb_day0_10k.txt")
HARNESS_WD = os.path.join(SHARED, "bench", "tf_peer_wd")
TOLERANCE = 0.02  # the target: mean eval AUC >= logistic's mean - TOLERANCE
MODELS = ("logistic", "fm", "wide_deep", "deepfm", "dnn")
#: TensorFlow's DNNLinearCombinedClassifier wide learning rate for Criteo's 39 columns: min(0.2, 1/sqrt(39)).
TF_WIDE_LR = round(min(0.2, 1 / math.sqrt(39)), 4)
#: The previous defaults, as flags: what each model's "previous defaults" row adds to the command.
PREVIOUS = {
    "fm": ["--model-param", 'dense_embedding_optimizer={"name": "adagrad", "hyperparameters": '
                            '{"learning_rate": 0.05, "initial_accumulator_value": 0.1}}'],
    "wide_deep": ["--wide-optimizer", f"ftrl:learning_rate={TF_WIDE_LR}"],
    "deepfm": ["--wide-optimizer", f"ftrl:learning_rate={TF_WIDE_LR}"],
}
#: Other settings measured beside the defaults, to show the trade-off the defaults take: (label, flags).
ALTERNATIVES = {
    "wide_deep": [("wide FTRL 0.5, logistic's rate", ["--wide-optimizer", "ftrl:learning_rate=0.5"])],
    "deepfm": [("wide FTRL 0.5, logistic's rate", ["--wide-optimizer", "ftrl:learning_rate=0.5"])],
}
Run = dict[str, Any]


# ------------------------------------------------------------------------------------ data
def sample_split(workdir: str) -> tuple[list[str], str]:
    """The Criteo sample's first 8,000 rows (train) and last 2,000 (eval), as the tests split it."""
    with open(CRITEO) as f:
        lines = f.readlines()
    if len(lines) != 10_000:
        raise SystemExit(f"{CRITEO}: expected 10,000 rows, found {len(lines):,}")
    d = os.path.join(workdir, "criteo_8000_2000")
    os.makedirs(d, exist_ok=True)
    train, ev = os.path.join(d, "train.tsv"), os.path.join(d, "eval.tsv")
    for path, part in ((train, lines[:8000]), (ev, lines[8000:])):
        with open(path, "w") as f:
            f.writelines(part)
    return [train], ev


def large_workload(workdir: str) -> tuple[list[str], str]:
    """The tf_peer_wd workload as TSV (generated once under ``workdir``): 4 train files of 50,000 rows, 50,000 eval."""
    d = os.path.join(workdir, "ctr_wd_tsv")
    sys.path.insert(0, HARNESS_WD)
    import common  # the instrument's constants and file names
    import gen_ctr_data

    train, ev = common.train_files(d, "tsv"), common.eval_files(d, "tsv")[0]
    if all(os.path.exists(p) for p in [*train, ev]):
        return train, ev
    os.makedirs(d, exist_ok=True)
    print(f"[{time.strftime('%H:%M:%S')}] generating the tf_peer_wd workload (TSV) in {d}", flush=True)
    n_train = common.N_TRAIN
    label, dense, cat, *_ = gen_ctr_data.generate(n_train + common.N_EVAL, 20240612, 0.25)  # the instrument's defaults
    per = n_train // len(train)
    for i, path in enumerate(train):
        gen_ctr_data.write_tsv(path + ".tmp", label[i * per:(i + 1) * per], dense[i * per:(i + 1) * per],
                               cat[i * per:(i + 1) * per])
    gen_ctr_data.write_tsv(ev + ".tmp", label[n_train:], dense[n_train:], cat[n_train:])
    for path in [*train, ev]:
        os.replace(path + ".tmp", path)
    return train, ev


# ------------------------------------------------------------------------------------ runs
def configs(models: list[str]) -> list[tuple[str, str, list[str]]]:
    """(model, "defaults" | "previous defaults" | an alternative's label, extra flags) for every model."""
    out = []
    for model in models:
        out.append((model, "defaults", []))
        if model in PREVIOUS:
            out.append((model, "previous defaults", PREVIOUS[model]))
        out += [(model, label, flags) for label, flags in ALTERNATIVES.get(model, [])]
    return out


def command(train: list[str], ev: str, epochs: int, model: str, extra: list[str], seed: int) -> list[str]:
    return [*(a for path in train for a in ("--train", path)), "--eval", ev, "--format", "criteo", "--ps", "2", "--workers", "2",
            "--epochs", str(epochs), "--model", model, *extra, "--seed", str(seed)]


def shown(argv: list[str]) -> str:
    return "psflow train " + shlex.join(argv) + " --output RUN_DIR --quiet --no-status"


def psflow_train(argv: list[str], runs_dir: str, timeout: float) -> Run:
    """One ``python -m psflow train`` (the snapshot's); its eval metrics and wall time, or the failure's tail."""
    out = tempfile.mkdtemp(prefix="run-", dir=runs_dir)
    cmd = [sys.executable, "-m", "psflow", "train", *argv, "--output", out, "--quiet", "--no-status"]
    t0, load = time.perf_counter(), os.getloadavg()[0]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"failed": True, "tail": [f"timed out after {timeout:.0f} s"], "load_before": load}
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        return {"failed": True, "returncode": p.returncode, "tail": p.stderr.strip().splitlines()[-5:], "load_before": load}
    with open(os.path.join(out, "metrics.json")) as f:
        m = json.load(f)
    return {"auc": m["eval"]["auc"], "logloss": m["eval"]["logloss"], "global_step": m["global_step"],
            "wall_s": wall, "load_before": load}


def run_part(name: str, train: list[str], ev: str, epochs: int, seeds: int, models: list[str],
             args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Every config x seed of one part, seed by seed (each seed's configs back to back, so load drifts hit all)."""
    part = results["parts"].setdefault(name, {"commands": {}, "runs": {}})
    part.update(train=train, eval=ev, epochs=epochs)
    measured = False
    for seed in range(seeds):
        for model, label, extra in configs(models):
            key = f"{model} ({label})"
            argv = command(train, ev, epochs, model, extra, seed)
            part["commands"][key] = shown(argv).replace(f"--seed {seed}", "--seed SEED")
            done = {r["seed"] for r in part["runs"].get(key, [])}
            if seed in done:
                continue
            if not measured:  # the invocation and snapshot that measured this part (--resume may add to it)
                part["meta"], measured = dict(results["meta"]), True
            r = psflow_train(argv, args.runs, args.run_timeout)
            r["seed"] = seed
            part["runs"].setdefault(key, []).append(r)
            print(f"[{time.strftime('%H:%M:%S')}] {name} {key} seed {seed}: "
                  + ("FAILED " + " | ".join(r["tail"]) if r.get("failed") else f"eval AUC {r['auc']:.4f} ({r['wall_s']:.0f} s)"),
                  flush=True)
            save(results, args)


# ------------------------------------------------------------------------------------ report
def table(part: dict[str, Any], target: bool) -> list[str]:
    runs = part["runs"]
    base = [r["auc"] for r in runs.get("logistic (defaults)", []) if not r.get("failed")]
    base_mean = statistics.mean(base) if base else None
    lines = ["| model (settings) | seeds | eval AUC: mean ± sd | min–max | mean − logistic's mean |"
             + (f" ≥ logistic − {TOLERANCE}? |" if target else "") + " eval log-loss (mean) | per seed | wall s (median) |",
             "|---|---:|---|---|---:|" + ("---|" if target else "") + "---:|---|---:|"]
    for key, rs in runs.items():
        ok = sorted((r for r in rs if not r.get("failed")), key=lambda r: r["seed"])
        fails = len(rs) - len(ok)
        aucs = [r["auc"] for r in ok]
        if not aucs:
            lines.append(f"| {key} | 0 ({fails} failed) |" + " |" * (7 if target else 6))
            continue
        sd = f" ± {statistics.stdev(aucs):.4f}" if len(aucs) > 1 else ""
        diff = statistics.mean(aucs) - base_mean if base_mean is not None else None
        met = ""
        if target and diff is not None:
            met = " n/a |" if key.startswith("logistic") else (" **met** |" if diff >= -TOLERANCE else " not met |")
        elif target:
            met = " |"
        lines.append(f"| {key} | {len(aucs)}{f' ({fails} failed)' if fails else ''} | {statistics.mean(aucs):.4f}{sd} | "
                     f"{min(aucs):.4f}–{max(aucs):.4f} | {'' if diff is None else f'{diff:+.4f}'} |{met} "
                     f"{statistics.mean(r['logloss'] for r in ok):.4f} | {' '.join(f'{a:.4f}' for a in aucs)} | "
                     f"{statistics.median(r['wall_s'] for r in ok):.0f} |")
    return lines


def report(results: dict[str, Any]) -> str:
    out = ["## Built-in models' defaults against logistic regression (issue 25, item 11)", "",
           "Every run: 2 ps tasks, 2 asynchronous workers, every other "
           "setting at its default (batch 512, `--num-features` 2^20, `--embedding-dim` 8, `--hidden 256,128`); "
           "\"previous defaults\" adds the flags that restore the defaults before issue 25 (fm's dense factors at "
           f"Adagrad 0.05; the wide part of wide_deep and deepfm at TensorFlow's FTRL rate min(0.2, 1/sqrt(39)) = {TF_WIDE_LR}); "
           "\"wide FTRL 0.5\" sets the wide part at `--model logistic`'s rate instead (the default, 0.3, sits between)."]
    titles = {"sample": "Criteo sample: first 8,000 rows train, last 2,000 eval (55 positives), 3 epochs = 47 steps",
              "large": "tf_peer_wd workload: 200,000 train rows (4 files), 50,000 eval, 1 epoch = 391 steps"}
    for name, part in results["parts"].items():
        meta = part.get("meta", results["meta"])
        out += ["", f"### {titles.get(name, name)}", "",
                f"Command: `{meta['command']}` ({meta['date']}; {meta['machine']}; psflow {meta['psflow']}; the machine "
                "is shared: wall times are noisy, AUCs are not).", ""]
        out += table(part, target=name == "sample")
        out += ["", "Commands (SEED = 0, 1, ...):", ""]
        out += [f"* {key}: `{cmd}`" for key, cmd in part["commands"].items()]
    return "\n".join(out) + "\n"


def save(results: dict[str, Any], args: argparse.Namespace) -> None:
    os.makedirs(os.path.dirname(args.json_out), exist_ok=True)
    with open(args.json_out + ".tmp", "w") as f:
        json.dump(results, f, indent=1)
    os.replace(args.json_out + ".tmp", args.json_out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="sample,large", help="sample, large (comma-separated)")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated (logistic is always run: the bar)")
    p.add_argument("--seeds", type=int, default=5, help="seeds per config on the Criteo sample (5)")
    p.add_argument("--large-seeds", type=int, default=2, help="seeds per config on the large workload (2)")
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "psflow_model_defaults"),
                   help="data, snapshot and run directories")
    p.add_argument("--psflow-rev", default="HEAD", help="git revision of psflow to measure, or 'worktree'")
    p.add_argument("--run-timeout", type=float, default=1800.0, help="seconds per run")
    p.add_argument("--resume", action="store_true", help="keep the runs already in --json-out (same settings)")
    p.add_argument("--json-out", default=os.path.join(HERE, "results", "model_defaults.json"))
    p.add_argument("--md-out", default=os.path.join(HERE, "results", "model_defaults.md"))
    p.add_argument("--no-results-md", action="store_true", help="leave benchmarks/RESULTS.md alone")
    args = p.parse_args()
    models = ["logistic", *[m for m in args.models.split(",") if m and m != "logistic"]]
    parts = [x for x in args.parts.split(",") if x]
    if unknown := set(parts) - {"sample", "large"}:
        p.error(f"unknown parts {sorted(unknown)}")
    os.makedirs(args.workdir, exist_ok=True)
    args.runs = os.path.join(args.workdir, "runs")
    os.makedirs(args.runs, exist_ok=True)
    data = {"sample": sample_split(args.workdir) if "sample" in parts else None,
            "large": large_workload(args.workdir) if "large" in parts else None}
    commit, label = snapshot_psflow(args.psflow_rev, args.workdir)  # chdir()s into the snapshot
    results: dict[str, Any] = {"parts": {}}
    if args.resume and os.path.exists(args.json_out):
        with open(args.json_out) as f:
            results = json.load(f)
    results["meta"] = {"command": "python benchmarks/bench_model_defaults.py " + shlex.join(sys.argv[1:]),
                       "date": dt.date.today().isoformat(), "machine": machine(), "psflow": label, "commit": commit}
    for name in parts:
        train, ev = data[name]  # type: ignore[misc]
        run_part(name, train, ev, 3 if name == "sample" else 1, args.seeds if name == "sample" else args.large_seeds,
                 models, args, results)
    text = report(results)
    with open(args.md_out, "w") as f:
        f.write(text)
    if not args.no_results_md:
        replace_section("model_defaults", text)
    print(text)


if __name__ == "__main__":
    main()
