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

Launcher drills (issue 17): ``--launcher-drills N`` (2) runs of each of SIGTERM and SIGKILL to
``psflow train`` itself, at a random moment of a run with checkpoints; after each, no psflow process
of the run is left (checked by pid: the launcher's tasks, and any process naming the run directory),
SIGTERM exits 143 with ``interrupted`` in metrics.json, SIGKILL leaves the tasks to their lifeline,
and every checkpoint the pointer names is readable. ``--points 0`` runs only these::

    .venv/bin/python benchmarks/drill_recovery.py --points 0 --launcher-drills 5

Storage drills (issue 17): ``--storage-drills N`` (1) runs of each of: a disk that fills up under
the checkpoints (a nearly full 200 KiB tmpfs as root, else the directory made read-only mid-run),
which must fail the run (exit 1, ``--max-failed-saves 3``) with a console line per failed save and no
partial checkpoint left; and two runs of other seeds sharing one ``--checkpoint-dir``, the second
started a random 0-0.5 s after the first, of which exactly one trains and the other is refused naming
it. After each: no psflow process of the runs left (checked by pid), every checkpoint the pointer
names readable and of the run that trained, the lock released::

    .venv/bin/python benchmarks/drill_recovery.py --points 0 --launcher-drills 0 --storage-drills 3

Pointer and run-directory drills (issue 25): ``--pointer-drills N`` (1) runs of each of: a checkpoint
pointer deleted, damaged (300 random bytes) or naming a complete checkpoint outside the directory between
two runs on one ``--checkpoint-dir`` (the second must restore the newest checkpoint inside, print a line
naming the pointer, and leave exactly the newest ``--max-to-keep`` complete checkpoints of both runs), and
two runs on one ``--output`` (exactly one trains, the other is refused naming it)::

    .venv/bin/python benchmarks/drill_recovery.py --points 0 --launcher-drills 0 --storage-drills 0 --pointer-drills 1 \
        --state-drills 0                                          # -> benchmarks/results/pointer_drill.md

ps-state drills (issue 25, item 2): ``--state-drills N`` (1) runs of each of: ps task 1 killed at a random step
of a run without ``--checkpoint-dir`` under ``--restart-policy on-failure`` (restored from ``<output>/checkpoints``,
each record trained once per epoch), under ``--restart-policy never`` (the run fails saying the variables are
lost), and at step 1-5 under ``on-failure`` (restored, or failed with the line naming what was lost). Never an
exit 0 with a restarted ps task initialized fresh beside trained ones::

    .venv/bin/python benchmarks/drill_recovery.py --points 0 --launcher-drills 0 --storage-drills 0 --pointer-drills 0 --state-drills 1

Replica drills (issue 28): ``--replica-drills K`` (0) kills of shard primaries and K of backups, in async and
sync mode, on a9a with ``--ps-replicas 1`` and no checkpoint directory: exit 0, ``updates_lost`` 0,
``pushes_applied == pushes_acknowledged``, every record once per epoch, and the pause from the kill to the
next applied push (the logs' timestamps; :mod:`replica_drill`), its median in the summary::

    .venv/bin/python benchmarks/drill_recovery.py --points 0 --launcher-drills 0 --storage-drills 0 --pointer-drills 0 \
        --state-drills 0 --replica-drills 2                       # -> benchmarks/results/replica_drill.md
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))

from replica_drill import replica_drills, replica_section  # noqa: E402
from support import A9A, run_cli  # noqa: E402
from test_checkpoint_safety import (  # noqa: E402
    COMMON,
    all_listed_readable,
    background_run,
    no_partial_directories,
    read_only,
    small_tmpfs,
    task_pids,
    wait_for,
)
from test_launcher_signals import Launcher, alive, cmdline, wait_until  # noqa: E402
from test_recovery import ROLES, check_run, train  # noqa: E402

from psflow.checkpoint.variables import read_variables  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=5, help="random kill points per role (5)")
    parser.add_argument("--seed", type=int, default=6)
    parser.add_argument("--mode", default="async", choices=["async", "sync", "ssp"], help="update mode (async)")
    parser.add_argument("--out", help="markdown file (benchmarks/results/recovery_drill[_MODE].md)")
    parser.add_argument("--keep-failed", help="copy the run directory of every failed run here")
    parser.add_argument("--launcher-drills", type=int, default=2,
                        help="runs of each of SIGTERM and SIGKILL to psflow train itself (2)")
    parser.add_argument("--storage-drills", type=int, default=1,
                        help="runs of each of a full checkpoint disk and two runs sharing a checkpoint directory (1)")
    parser.add_argument("--pointer-drills", type=int, default=1,
                        help="runs of each of a deleted, damaged and outside checkpoint pointer, and two runs sharing "
                             "one --output (1)")
    parser.add_argument("--state-drills", type=int, default=1,
                        help="runs of each ps-task kill without --checkpoint-dir: on-failure, never, at once (1)")
    parser.add_argument("--replica-drills", type=int, default=0, metavar="K",
                        help="with --ps-replicas 1: K kills of shard primaries and K of backups, async and sync; "
                             "results to --replica-out (0)")
    parser.add_argument("--replica-out", default="benchmarks/results/replica_drill.md",
                        help="markdown file of the replica drills (%(default)s)")
    args = parser.parse_args()
    suffix = "" if args.mode == "async" else "_" + args.mode
    kind = ("recovery" if args.points else "launcher" if args.launcher_drills else "storage" if args.storage_drills
            else "pointer" if args.pointer_drills else "state")
    args.out = args.out or f"benchmarks/results/{kind}_drill{suffix}.md"
    mode = ["--mode", args.mode]
    rng = random.Random(args.seed)
    rows, failures = [], 0
    with tempfile.TemporaryDirectory(prefix="psflow-drill-") as tmp:
        baseline = float("nan")
        if args.points > 0:
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
        launcher_rows, launcher_failures = launcher_drills(Path(tmp), args.launcher_drills, mode, rng,
                                                           args.keep_failed)
        storage_rows, storage_failures = storage_drills(Path(tmp), args.storage_drills, rng, args.keep_failed)
        pointer_rows, pointer_failures = pointer_drills(Path(tmp), args.pointer_drills, rng, args.keep_failed)
        state_rows, state_failures = state_drills(Path(tmp), args.state_drills, rng, args.keep_failed)
        replica_rows, replica_failures, pauses = replica_drills(Path(tmp), args.replica_drills, rng, args.keep_failed)
    if replica_rows:  # a file of their own (issue 28)
        Path(args.replica_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.replica_out).write_text(replica_section(args.replica_drills, args.seed, replica_rows,
                                                          replica_failures, pauses))
        print(f"wrote {args.replica_out}")
    sections = [role_section(args, baseline, rows, failures)] if args.points else []
    if launcher_rows:
        sections.append(launcher_section(args, launcher_rows, launcher_failures))
    if storage_rows:
        sections.append(storage_section(args, storage_rows, storage_failures))
    if pointer_rows:
        sections.append(pointer_section(args, pointer_rows, pointer_failures))
    if state_rows:
        sections.append(state_section(args, state_rows, state_failures))
    if sections:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("\n".join(sections))
        print(f"wrote {args.out}")
    return 1 if (failures or launcher_failures or storage_failures or pointer_failures or state_failures
                 or replica_failures) else 0


def role_section(args: argparse.Namespace, baseline: float, rows: list[str], failures: int) -> str:
    return "\n".join([
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


#: Signals sent to ``psflow train`` itself by the launcher drills, and the exit status each must give.
LAUNCHER_SIGNALS = {"SIGTERM": (signal.SIGTERM, 128 + signal.SIGTERM), "SIGKILL": (signal.SIGKILL, -signal.SIGKILL)}


def launcher_drills(tmp: Path, runs: int, mode: list[str], rng: random.Random,
                    keep_failed: str | None) -> tuple[list[str], int]:
    """``runs`` runs of each of :data:`LAUNCHER_SIGNALS`; returns the table rows and the failures."""
    rows, failures = [], 0
    for name in LAUNCHER_SIGNALS:
        for n in range(runs):
            out = tmp / f"launcher-{name}-{n}"
            delay = round(rng.uniform(0.0, 3.0), 2)
            result, verdict = _attempt(out, functools.partial(launcher_drill, out, name, mode, delay), keep_failed, 120)
            code, tasks, gone, checkpoints = result or ("-", "-", "-", "-")
            failures += verdict != "ok"
            rows.append(f"| {name} | {delay:.2f} | {code} | {tasks} | {gone} | {checkpoints} | {verdict} |")
            print(rows[-1], flush=True)
    return rows, failures


def launcher_drill(out: Path, name: str, mode: list[str], delay: float) -> tuple[str, str, str, str]:
    """Signals ``psflow train`` ``delay`` s into training and checks what it left.

    Returns:
        (exit status, task count, seconds from the signal until the last task was gone, checkpoints read).

    Raises:
        AssertionError: a check failed (names it).
    """
    sig, expected = LAUNCHER_SIGNALS[name]
    run = Launcher(out, *mode, "--checkpoint-dir", str(out / "ckpt"), "--save-checkpoints-steps", "250",
                   "--lease-ttl", "2")
    try:
        run.wait_training()
        pointer = out / "ckpt" / "checkpoint"
        wait_until(pointer.exists, 120.0, f"{pointer} written (the chief saves the initial state)")
        time.sleep(delay)
        run.tasks()  # every task pid seen so far is checked below
        signalled = time.monotonic()
        os.kill(run.pid, sig)
        code = run.wait()
        assert code == expected, f"{name}: exit {code}, want {expected}: {run.stderr()[-500:]}"
        wait_until(lambda: not [p for p, s in run.seen.items() if alive(p, s)], 60.0, "every task gone")
        gone = time.monotonic() - signalled
        leftovers = [int(p) for p in os.listdir("/proc") if p.isdigit() and str(out) in cmdline(int(p))]
        assert not leftovers, f"processes of the run left: {[(p, cmdline(p)) for p in leftovers]}"
        if sig == signal.SIGTERM:
            metrics = run.metrics()
            assert metrics["interrupted"] == name, metrics
        names = json.loads(pointer.read_text())["all"]
        assert names, f"{pointer} names no checkpoint"
        for checkpoint in names:  # none a later run would restore from is gone or damaged
            read_variables(str(out / "ckpt" / checkpoint), slots=True)
        return str(code), str(len(run.seen)), f"{gone:.1f}", str(len(names))
    finally:
        run.close()


def launcher_section(args: argparse.Namespace, rows: list[str], failures: int) -> str:
    return "\n".join([
        "# Launcher drill (issue 17)",
        "",
        f"`benchmarks/drill_recovery.py --launcher-drills {args.launcher_drills} --seed {args.seed} --mode {args.mode}` "
        f"({time.strftime('%Y-%m-%d')}): a9a, {args.mode} mode, 2 ps + 2 workers, batch 32, checkpoints every 250 "
        "steps; `psflow train` itself gets the signal a random 0-3 s after its first logged step.",
        "Checks per run: exit 143 (SIGTERM: every task stopped, `interrupted` in metrics.json) or -9 (SIGKILL: "
        "the tasks stop on their lifeline); every task pid gone; no process naming the run directory left; "
        "every checkpoint the pointer names readable. Gone s: from the signal until the last task was gone.",
        "",
        "| signal | after s | exit | tasks | gone s | checkpoints | verdict |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"{len(rows) - failures} of {len(rows)} runs passed.",
        "",
    ])


def storage_drills(tmp: Path, runs: int, rng: random.Random, keep_failed: str | None) -> tuple[list[str], int]:
    """``runs`` runs of each of :func:`disk_full_drill` and :func:`collision_drill`; returns the rows and the failures."""
    rows, failures = [], 0
    for n in range(runs):
        for name, drill in (("disk full", disk_full_drill), ("two runs, one directory", collision_drill)):
            out = tmp / f"storage-{name.split()[0]}-{n}"
            out.mkdir(parents=True)
            detail, verdict = _attempt(out, functools.partial(drill, out, rng), keep_failed, 160)
            failures += verdict != "ok"
            rows.append(f"| {name} | {detail or '-'} | {verdict} |")
            print(rows[-1], flush=True)
    return rows, failures


T = TypeVar("T")


def _attempt(out: Path, drill: Callable[[], T], keep_failed: str | None, width: int) -> tuple[T | None, str]:
    """Runs one drill: (its result, "ok"), or (None, "FAIL: ...") with its run directory kept under ``keep_failed``."""
    try:
        return drill(), "ok"
    except (AssertionError, OSError, KeyError, ValueError, subprocess.TimeoutExpired) as e:
        if keep_failed:
            shutil.copytree(out, Path(keep_failed) / out.name, dirs_exist_ok=True)
        return None, f"FAIL: {e}"[:width]


def _no_process_left(*outs: Path) -> None:
    """Every task pid the runs' logs name is gone, and no process names a run directory."""
    live = [p for out in outs for p in task_pids(out) if cmdline(p) and "psflow.launch.task" in cmdline(p)]
    assert not live, f"task processes left: {live}"
    leftovers = [int(p) for p in os.listdir("/proc") if p.isdigit() and any(str(o) in cmdline(int(p)) for o in outs)]
    assert not leftovers, f"processes of the runs left: {[(p, cmdline(p)) for p in leftovers]}"


def disk_full_drill(out: Path, rng: random.Random) -> str:
    """A run whose checkpoint disk fills up (tmpfs as root, else made read-only mid-run) must fail loudly.

    Returns:
        The row's detail: variant, exit, failed saves reported, checkpoints left readable.
    """
    ckpt = out / "ckpt"
    args = ("--epochs", "2", "--checkpoint-dir", str(ckpt), "--save-checkpoints-steps", "20",
            "--seed", str(rng.randrange(100)))
    if os.geteuid() == 0:
        variant = "200 KiB tmpfs, 150 KiB used"
        storage = small_tmpfs(ckpt, 200, 150)
    else:
        variant = "read-only mid-run"
        ckpt.mkdir()
        storage = contextlib.nullcontext()
    with storage, background_run(out / "run", *args) as run:
        if variant.startswith("read-only"):
            wait_for("the initial checkpoint", lambda: (ckpt / "checkpoint").exists(), run)
            with read_only(ckpt):
                _, stderr = run.communicate(timeout=250)
        else:
            _, stderr = run.communicate(timeout=250)
        assert run.returncode == 1, f"exit {run.returncode}, want 1: {stderr[-500:]}"
        failed = stderr.count(" FAILED (/job:")
        assert failed >= 3, f"{failed} failed saves reported on the console: {stderr[-500:]}"
        assert "(--max-failed-saves 3): stopping" in stderr, stderr[-500:]
        no_partial_directories(ckpt)
        names = all_listed_readable(ckpt)
    _no_process_left(out / "run")
    return f"{variant}: exit {run.returncode}, {failed} failed saves reported, {len(names)} checkpoints readable"


def collision_drill(out: Path, rng: random.Random) -> str:
    """Two runs of other seeds on one --checkpoint-dir, the second 0-0.5 s after the first: one trains.

    Returns:
        The row's detail: the delay, which run trained, the checkpoints left.
    """
    ckpt = out / "ckpt"
    delay = round(rng.uniform(0.0, 0.5), 2)
    outs = [out / "first", out / "second"]
    args = ("--epochs", "3", "--checkpoint-dir", str(ckpt), "--save-checkpoints-steps", "20")
    with background_run(outs[0], *args, "--seed", "1") as first:
        time.sleep(delay)
        with background_run(outs[1], *args, "--seed", "2") as second:
            results = [p.communicate(timeout=250) for p in (first, second)]
    codes = [first.returncode, second.returncode]
    assert sorted(codes) == [0, 1], f"exits {codes}: {[r[1][-300:] for r in results]}"
    loser = codes.index(1)
    assert "is in use by run" in results[loser][1] and "Traceback" not in results[loser][1], results[loser][1][-500:]
    assert not (outs[loser] / "logs").exists(), "the refused run started tasks"
    names = all_listed_readable(ckpt)
    seeds = {json.loads((ckpt / n / "manifest.json").read_text())["model"]["config"]["seed"] for n in names}
    assert seeds == {2 - loser}, f"checkpoints of seeds {seeds}; only run {2 - loser} trained"
    assert not (ckpt / "checkpoint.lock").exists(), "the lock was not released"
    no_partial_directories(ckpt)
    _no_process_left(*outs)
    return f"second after {delay:.2f} s: {'first' if loser else 'second'} trained, the other refused; {len(names)} checkpoints readable"


def storage_section(args: argparse.Namespace, rows: list[str], failures: int) -> str:
    return "\n".join([
        "# Storage drill (issue 17)",
        "",
        f"`benchmarks/drill_recovery.py --storage-drills {args.storage_drills} --seed {args.seed}` "
        f"({time.strftime('%Y-%m-%d')}): a9a, 2 ps + 2 workers, batch 512, checkpoints every 20 steps.",
        "Disk full: exit 1 after 3 failed saves in a row, a console line per failed save, no partial checkpoint. "
        "Two runs: exactly one trains, the other is refused before it starts a task. After each: no psflow "
        "process left (by pid), every checkpoint the pointer names readable and of the run that trained.",
        "",
        "| drill | detail | verdict |",
        "|---|---|---|",
        *rows,
        "",
        f"{len(rows) - failures} of {len(rows)} runs passed.",
        "",
    ])


# ---- the pointer and the run directory (issue 25) ---------------------------------------------------------------
POINTER_DAMAGES = ("deleted", "damaged", "outside")
MAX_TO_KEEP = 5


def pointer_drills(tmp: Path, runs: int, rng: random.Random, keep_failed: str | None) -> tuple[list[str], int]:
    """``runs`` runs of :func:`pointer_drill` for each of :data:`POINTER_DAMAGES`, and of :func:`output_drill`;
    returns the rows and the failures."""
    rows, failures = [], 0
    for n in range(runs):
        drills = [(f"pointer {d}", functools.partial(pointer_drill, rng=rng, damage=d)) for d in POINTER_DAMAGES]
        for name, drill in [*drills, ("two runs, one --output", functools.partial(output_drill, rng=rng))]:
            out = tmp / f"pointer-{name.split()[-1].strip('-')}-{n}"
            out.mkdir(parents=True)
            detail, verdict = _attempt(out, functools.partial(drill, out), keep_failed, 200)
            failures += verdict != "ok"
            rows.append(f"| {name} | {detail or '-'} | {verdict} |")
            print(rows[-1], flush=True)
    return rows, failures


def _complete_steps(ckpt: Path) -> dict[int, str]:
    """global_step -> name of every complete checkpoint directly inside ``ckpt``."""
    return {json.loads((p / "manifest.json").read_text())["global_step"]: p.name
            for p in ckpt.glob("ckpt-*") if (p / "manifest.json").exists()}


def pointer_drill(out: Path, *, rng: random.Random, damage: str) -> str:
    """A run with checkpoints, its pointer deleted, damaged (300 random bytes) or naming a complete checkpoint
    outside the directory (absolute path), then a run resuming there: it must restore the newest checkpoint inside,
    say what was wrong with the pointer, and leave every complete checkpoint within ``--max-to-keep``.

    Returns:
        The row's detail: the step restored, the checkpoints kept.
    """
    ckpt = out / "ckpt"
    every = rng.choice((15, 20, 25))
    args = (*COMMON, "--checkpoint-dir", str(ckpt), "--save-checkpoints-steps", str(every),
            "--max-to-keep", str(MAX_TO_KEEP), "--seed", str(rng.randrange(100)))
    r = run_cli("train", *args, "--epochs", "1", "--output", str(out / "first"))
    assert r.returncode == 0, f"first run: exit {r.returncode}: {r.stderr[-300:]}"
    before = _complete_steps(ckpt)
    newest = max(before)
    outside = out / "elsewhere" / before[min(before)]
    if damage == "deleted":
        (ckpt / "checkpoint").unlink()
    elif damage == "damaged":
        (ckpt / "checkpoint").write_bytes(os.urandom(300))
    else:
        shutil.copytree(ckpt / before[min(before)], outside)
        pointer = json.loads((ckpt / "checkpoint").read_text())
        (ckpt / "checkpoint").write_text(json.dumps(dict(pointer, latest=str(outside), all=[str(outside)])))
    more = rng.randrange(5, 2 * every)
    second = out / "second"
    r = run_cli("train", *args, "--epochs", "2", "--max-steps", str(newest + more), "--output", str(second))
    assert r.returncode == 0, f"second run: exit {r.returncode}: {r.stderr[-300:]}"
    assert f"checkpoint pointer {ckpt / 'checkpoint'} " in r.stderr and "; ignored: using the newest complete " \
        f"checkpoint inside it, {before[newest]}" in r.stderr, f"no warning naming the pointer: {r.stderr[-500:]}"
    logs = "".join(p.read_text(errors="replace") for p in (second / "logs").glob("worker-*.log"))
    assert f"restored checkpoint {ckpt / before[newest]} at step {newest}" in logs, "not restored from the newest inside"
    saved = {int(step): Path(path).name for path, step in re.findall(r"saved checkpoint (\S+) at step (\d+)", logs)}
    everything = {**before, **saved}
    kept = sorted(everything)[-MAX_TO_KEEP:]
    after = _complete_steps(ckpt)
    assert sorted(after) == kept, f"complete checkpoints at steps {sorted(after)}; want the newest {MAX_TO_KEEP} of " \
        f"{sorted(everything)}: {kept}"
    assert all(after[s] == everything[s] for s in kept), f"{after} is not {everything}"
    if damage == "outside":
        assert (outside / "manifest.json").exists(), "the checkpoint outside was touched"
    no_partial_directories(ckpt)
    all_listed_readable(ckpt)
    _no_process_left(out / "first", second)
    return (f"restored step {newest} (newest inside); kept steps {', '.join(map(str, kept))} "
            f"({len(before)} before + {len(saved)} saved, --max-to-keep {MAX_TO_KEEP})")


def output_drill(out: Path, *, rng: random.Random) -> str:
    """Two runs of other seeds on one ``--output``, the second 0-0.5 s after the first: exactly one trains (exit 0,
    every record of both epochs counted once); the other is refused in one line naming it, before it writes there.

    Returns:
        The row's detail: the delay, which run trained.
    """
    run_dir = out / "run"
    delay = round(rng.uniform(0.0, 0.5), 2)
    with background_run(run_dir, "--epochs", "2", "--seed", "1") as first:
        time.sleep(delay)
        with background_run(run_dir, "--epochs", "2", "--seed", "2") as second:
            results = [p.communicate(timeout=250) for p in (first, second)]
    codes = [first.returncode, second.returncode]
    assert sorted(codes) == [0, 1], f"exits {codes}: {[r[1][-300:] for r in results]}"
    winner, loser = codes.index(0), codes.index(1)
    refusal = [line for line in results[loser][1].splitlines() if "error:" in line]
    assert len(refusal) == 1 and f"run directory {run_dir} is in use by run " in refusal[0] \
        and "Traceback" not in results[loser][1], results[loser][1][-500:]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["seed"] == winner + 1 and f"is in use by run {config['run_id']} " in refusal[0], refusal[0]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    records = sum(1 for _ in open(A9A))
    assert metrics["examples"] == 2 * records, f"examples {metrics['examples']}, want {2 * records}"
    assert not (run_dir / "run.lock").exists(), "the run directory's lock was not released"
    _no_process_left(run_dir)
    holder = refusal[0][refusal[0].index("is in use by run "):refusal[0].index(")") + 1]
    return (f"second after {delay:.2f} s: {('first', 'second')[winner]} trained ({metrics['global_step']} steps, "
            f"{metrics['examples']} examples), the other refused: run directory {holder}")


def pointer_section(args: argparse.Namespace, rows: list[str], failures: int) -> str:
    return "\n".join([
        "# Pointer and run-directory drill (issue 25)",
        "",
        f"`benchmarks/drill_recovery.py --pointer-drills {args.pointer_drills} --seed {args.seed}` "
        f"({time.strftime('%Y-%m-%d')}): a9a, 2 ps + 2 workers, batch 512.",
        f"Pointer: one epoch with a checkpoint every 15-25 steps and --max-to-keep {MAX_TO_KEEP}; then the pointer is "
        "deleted, overwritten with 300 random bytes, or made to name a complete checkpoint outside the directory "
        "(absolute path); then a second run (2 epochs, --max-steps a few steps on). Checks: it restores the newest "
        "checkpoint inside, prints a line naming the pointer file and what was wrong, and afterwards the complete "
        f"checkpoints are exactly the newest {MAX_TO_KEEP} of all saved by both runs, every one readable. "
        "Two runs on one --output, the second 0-0.5 s after the first: exactly one trains (every record of both "
        "epochs counted once), the other is refused in one line naming it; no process left.",
        "",
        "| drill | detail | verdict |",
        "|---|---|---|",
        *rows,
        "",
        f"{len(rows) - failures} of {len(rows)} runs passed.",
        "",
    ])


# ---- a ps task killed where no checkpoint may exist (issue 25, item 2) ----------------------------------------------
A9A_RECORDS = 32561
#: The ps-state drills: name -> (flags besides the kill, the kill's step range).
STATE_DRILLS = {
    "no --checkpoint-dir, on-failure": (("--restart-policy", "on-failure"), (300, 2700)),
    "no --checkpoint-dir, never": ((), (300, 2700)),
    "kill at once, on-failure": (("--restart-policy", "on-failure"), (1, 5)),
}


def state_drills(tmp: Path, runs: int, rng: random.Random, keep_failed: str | None) -> tuple[list[str], int]:
    """``runs`` runs of :func:`state_drill` for each of :data:`STATE_DRILLS`; returns the rows and the failures."""
    rows, failures = [], 0
    for _ in range(runs):
        for name, (flags, (low, high)) in STATE_DRILLS.items():
            step = rng.randrange(low, high)
            out = tmp / f"state-{len(rows)}"
            detail, verdict = _attempt(out, functools.partial(state_drill, out, flags, step), keep_failed, 200)
            failures += verdict != "ok"
            rows.append(f"| {name} | {step} | {detail or '-'} | {verdict} |")
            print(rows[-1], flush=True)
    return rows, failures


def _half_fresh(out: Path) -> list[str]:
    """The restarted ps processes that were made ready otherwise than by a restore (a generation > 0): fresh
    variables beside trained ones."""
    bad = []
    for log in sorted((out / "logs").glob("ps-*.log")):
        for life in log.read_text(errors="replace").split("serving at")[2:]:  # the processes after the first
            if "initialized" in life and not re.search(r"ready \(initialized by \S+, generation [1-9]\d*\)", life):
                bad.append(log.stem)
    return bad


def state_drill(out: Path, flags: tuple[str, ...], step: int) -> str:
    """``psflow train`` (a9a, 3 epochs, 2 ps, 2 workers, no ``--checkpoint-dir``) with ps task 1 killed at ``step``.

    Passes when the run exits 0 having restored every ps task from a checkpoint (no restarted ps task made
    ready otherwise, each record trained once per epoch), or exits non-zero saying why ps task 1 cannot be
    recovered; it fails on an exit 0 with a restarted ps task that was initialized fresh.

    Returns:
        The row's detail: the exit status and what the run said or restored.
    """
    r = run_cli("train", "--train", str(A9A), "--num-features", "124", "--ps", "2", "--workers", "2", "--batch-size",
                "32", "--epochs", "3", "--log-every", "10", "--quiet", "--output", str(out), "--lease-ttl", "2",
                *flags, "--chaos", f"kill:ps:1@step={step}", timeout=200)
    fresh = _half_fresh(out)
    assert not fresh, f"exit {r.returncode} with {', '.join(fresh)} initialized fresh beside trained variables"
    _no_process_left(out)
    if r.returncode != 0:
        lines = [line for line in r.stderr.splitlines()
                 if "no checkpoint to restore from" in line or "the variables it held are lost" in line]
        assert lines, f"exit {r.returncode} without saying what was lost: {r.stderr.strip().splitlines()[-1][:150]}"
        return f"exit {r.returncode}: {lines[0].strip()[:150]}"
    metrics = json.loads((out / "metrics.json").read_text())
    logs = "".join(p.read_text(errors="replace") for p in (out / "logs").glob("worker-*.log"))
    restored = re.search(r"restored checkpoint (\S+) \(step (\d+)\) onto every ps task", logs)
    assert restored, "exit 0 without a restore"
    assert metrics["examples"] == 3 * A9A_RECORDS, f"examples {metrics['examples']}, not 3 x {A9A_RECORDS}"
    return (f"exit 0: restored {Path(restored.group(1)).parent.name}/{Path(restored.group(1)).name} (step "
            f"{restored.group(2)}), examples 3 x {A9A_RECORDS}")


def state_section(args: argparse.Namespace, rows: list[str], failures: int) -> str:
    return "\n".join([
        "# ps task killed without a checkpoint directory (issue 25, item 2)",
        "",
        f"`benchmarks/drill_recovery.py --state-drills {args.state_drills} --seed {args.seed}` "
        f"({time.strftime('%Y-%m-%d')}): a9a, 2 ps + 2 workers, batch 32, 3 epochs, no --checkpoint-dir, "
        "--chaos kill:ps:1@step=N. Passes: exit 0 with every ps task restored from a checkpoint (with a restart "
        "policy, <output>/checkpoints) and each record trained once per epoch, or a non-zero exit with a line "
        "saying what was lost. Fails: exit 0 with a restarted ps task initialized fresh beside trained ones.",
        "",
        "| drill | kill step | detail | verdict |",
        "|---|---|---|---|",
        *rows,
        "",
        f"{len(rows) - failures} of {len(rows)} runs passed.",
        "",
    ])


if __name__ == "__main__":
    sys.exit(main())
