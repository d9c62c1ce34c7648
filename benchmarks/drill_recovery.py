"""Recovery drill (issue 6): kill -9 each role at 5 random points of a 3-epoch a9a run.

For each role (non-chief worker ``worker:1``, ps task ``ps:1``, ps task ``ps:0``
(which holds global_step and the embedded leases), chief) and each of ``--points``
random global steps, runs ``psflow train`` with checkpoints every 250 steps,
``--restart-policy on-failure`` and ``--chaos kill:<role>@step=N``, then checks what
tests/integration/test_recovery.py checks (exit 0, eval AUC within 0.005 of an
undisturbed run of the same mode, every checkpoint readable, no step logged twice,
every record trained exactly once relative to the checkpoints) and writes one
markdown table::

    .venv/bin/python benchmarks/drill_recovery.py                 # -> benchmarks/results/recovery_drill.md
    .venv/bin/python benchmarks/drill_recovery.py --mode sync     # -> benchmarks/results/recovery_drill_sync.md

About 20 x 10 s on 2 cores per mode. The default test suite runs one point per role.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))

from test_recovery import ROLES, check_run, train  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=5, help="random kill points per role (5)")
    parser.add_argument("--seed", type=int, default=6)
    parser.add_argument("--mode", default="async", choices=["async", "sync", "ssp"], help="update mode (async)")
    parser.add_argument("--out", help="markdown file (benchmarks/results/recovery_drill[_MODE].md)")
    parser.add_argument("--keep-failed", help="copy the run directory of every failed run here")
    args = parser.parse_args()
    args.out = args.out or f"benchmarks/results/recovery_drill{'' if args.mode == 'async' else '_' + args.mode}.md"
    mode = ["--mode", args.mode]
    rng = random.Random(args.seed)
    rows, failures = [], 0
    with tempfile.TemporaryDirectory(prefix="psflow-drill-") as tmp:
        base = Path(tmp) / "baseline"
        r = train(base, *mode)
        if r.returncode != 0:
            print(r.stderr[-3000:], file=sys.stderr)
            return 1
        baseline = float(json.loads((base / "metrics.json").read_text())["eval"]["auc"])
        for role, target in ROLES.items():
            for n in range(args.points):
                # A run has ~3,050 global steps; ~1,530 in sync mode (one step aggregates both workers' batches).
                step = rng.randrange(300, 2700) // (2 if args.mode == "sync" else 1)
                out = Path(tmp) / f"{role}-{n}"
                verdict, auc, recovery, wall, code = "ok", "", "", "", "-"
                try:
                    r = train(out, *mode, "--restart-policy", "on-failure", "--chaos", f"kill:{target}@step={step}")
                    code = str(r.returncode)
                    if r.returncode != 0:
                        raise AssertionError(f"exit {r.returncode}: {r.stderr.strip().splitlines()[-1]}")
                    metrics = check_run(out, baseline)
                    auc = f"{metrics['eval']['auc']:.4f}"
                    fault = metrics["faults"][0]
                    recovery = f"{fault['recovery_seconds']:.2f}" if fault.get("recovery_seconds") is not None else "-"
                    wall = f"{metrics['wall_seconds']:.1f}"
                except (AssertionError, OSError, KeyError, IndexError, subprocess.TimeoutExpired) as e:
                    verdict, failures = f"FAIL: {e}"[:120], failures + 1
                    if args.keep_failed:
                        shutil.copytree(out, Path(args.keep_failed) / out.name, dirs_exist_ok=True)
                rows.append(f"| {role} | {target} | {step} | {code} | {auc} | {recovery} | {wall} | {verdict} |")
                print(rows[-1], flush=True)
    text = "\n".join([
        "# Recovery drill (issue 6)",
        "",
        f"`benchmarks/drill_recovery.py --points {args.points} --seed {args.seed} --mode {args.mode}` "
        f"({time.strftime('%Y-%m-%d')}): a9a, {args.mode} mode, 2 ps + 2 workers, batch 32, "
        f"3 epochs, checkpoints every 250 steps, lease TTL 2 s, kill -9 at step N. Undisturbed eval AUC {baseline:.4f}.",
        "Checks per run: exit 0, AUC within 0.005, every checkpoint readable, no duplicate `step=`, "
        "examples applied == 3 x 32,561. Recovery: fault -> global_step advancing after the task came back.",
        "",
        "| role | chaos target | step | exit | eval AUC | recovery s | wall s | verdict |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"{len(rows) - failures} of {len(rows)} runs passed.",
        "",
    ])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
