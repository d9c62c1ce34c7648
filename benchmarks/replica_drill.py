"""Replica drills (issue 28) for ``benchmarks/drill_recovery.py --replica-drills K``.

K kill points for shard primaries and K for backups, in async and in sync mode (4K runs): each a
``psflow train`` of a9a (2 ps + 2 workers, ``--ps-replicas 1``, ``--restart-policy on-failure``, no
``--checkpoint-dir``, 3 epochs, batch 128, every step logged) with ``--chaos kill:ps:N@step=S`` (shard N's
current primary) or ``kill:ps-backup:N@step=S`` (one of its backups), N and S drawn at random. A drill
passes when the run exits 0 with ``updates_lost`` 0, ``pushes_applied == pushes_acknowledged`` and every
record trained exactly once per epoch (``examples`` 3 x 32,561).

The pause, from the kill to the next applied push, is read from the logs' timestamps: the fault's wall time
(metrics.json ``faults[0].time``, when the launcher sent SIGKILL) to the first worker log line ``step=S``
(each push's owner logs it once the push returned, i.e. applied on every shard it went to, acknowledged by
every backup in the view) whose S is past the step seen at the kill by more than a push in flight could
explain (the workers: 2 in async, 1 in sync, where one step aggregates both). The log's timestamps have
millisecond resolution; so does the pause.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import A9A, run_cli  # noqa: E402

__all__ = ["replica_drills", "replica_section", "kill_pause", "check_replica_run"]

A9A_RECORDS = 32_561
EPOCHS = 3
BATCH = 128
WORKERS = 2
_STEP_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*\bworker \d+: step=(\d+)\b")


def drill_run(out: Path, mode: str, spec: str) -> Any:
    """One ``psflow train`` of the drill with ``--chaos spec``."""
    return run_cli("train", "--train", str(A9A), "--eval", str(A9A) + ".t", "--num-features", "124",
                   "--ps", "2", "--workers", str(WORKERS), "--ps-replicas", "1", "--batch-size", str(BATCH),
                   "--epochs", str(EPOCHS), "--log-every", "1", "--mode", mode, "--quiet", "--output", str(out),
                   "--restart-policy", "on-failure", "--chaos", spec, timeout=300)


def check_replica_run(out: Path) -> dict[str, Any]:
    """The drill's checks on a finished run's metrics.json; returns it. Raises AssertionError naming the figure."""
    metrics: dict[str, Any] = json.loads((out / "metrics.json").read_text())
    assert metrics.get("updates_lost") == 0, f"updates_lost {metrics.get('updates_lost')}"
    applied, acknowledged = metrics.get("pushes_applied"), metrics.get("pushes_acknowledged")
    assert applied == acknowledged, f"pushes_applied {applied} != pushes_acknowledged {acknowledged}"
    assert metrics["examples"] == EPOCHS * A9A_RECORDS, f"examples {metrics['examples']}, not {EPOCHS} x {A9A_RECORDS}"
    assert metrics.get("faults"), "the fault did not fire"
    return metrics


def kill_pause(out: Path, fault: dict[str, Any], *, in_flight: int) -> float | None:
    """Seconds from the kill (``fault['time']``) to the first worker log line ``step=S`` with
    ``S > fault['at_step'] + in_flight`` logged after it (see the module docstring); None if there is none."""
    killed_at, at_step = float(fault["time"]), int(fault["at_step"])
    first: float | None = None
    for log in sorted((out / "logs").glob("worker-*.log")):
        for line in log.read_text(errors="replace").splitlines():
            m = _STEP_LINE.match(line)
            if m is None or int(m.group(2)) <= at_step + in_flight:
                continue
            stamp = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if stamp >= killed_at - 0.001 and (first is None or stamp < first):
                first = stamp
    return None if first is None else max(0.0, first - killed_at)


def replica_drills(tmp: Path, points: int, rng: random.Random,
                   keep_failed: str | None) -> tuple[list[str], int, list[float]]:
    """``points`` drills of each of primary and backup kills, async then sync; returns the table's rows, the
    failures and the pauses measured."""
    rows: list[str] = []
    failures = 0
    pauses: list[float] = []
    for mode in ("async", "sync"):
        steps = EPOCHS * A9A_RECORDS // BATCH // (WORKERS if mode == "sync" else 1)
        for target in ("ps", "ps-backup"):
            for _ in range(points):
                shard, step = rng.randrange(2), rng.randrange(steps // 10, steps * 8 // 10)
                spec = f"kill:{target}:{shard}@step={step}"
                out = tmp / f"replica-{len(rows)}"
                code, lost, pause, killed, verdict = "-", "-", "-", "-", "ok"
                try:
                    r = drill_run(out, mode, spec)
                    code = str(r.returncode)
                    if r.returncode != 0:
                        raise AssertionError(f"exit {r.returncode}: {(r.stderr.strip().splitlines() or [''])[-1]}")
                    metrics = json.loads((out / "metrics.json").read_text())
                    lost = str(metrics.get("updates_lost"))
                    if metrics.get("faults"):  # the pause is measured whatever the checks below say
                        fault = metrics["faults"][0]
                        killed = fault["task"]
                        seconds = kill_pause(out, fault, in_flight=WORKERS if mode == "async" else 1)
                        if seconds is not None:
                            pauses.append(seconds)
                            pause = f"{seconds:.3f}"
                    check_replica_run(out)
                except (AssertionError, OSError, KeyError, IndexError, ValueError) as e:
                    verdict, failures = f"FAIL: {e}"[:140], failures + 1
                    if keep_failed:
                        shutil.copytree(out, Path(keep_failed) / out.name, dirs_exist_ok=True)
                rows.append(f"| {mode} | {spec} | {killed} | {code} | {lost} | {pause} | {verdict} |")
                print(rows[-1], flush=True)
    return rows, failures, pauses


def replica_section(points: int, seed: int, rows: list[str], failures: int, pauses: list[float]) -> str:
    median = f"{statistics.median(pauses):.3f} s" if pauses else "not measured"
    return "\n".join([
        "# Replicated ps shards: primaries and backups killed (issue 28)",
        "",
        f"`benchmarks/drill_recovery.py --points 0 --launcher-drills 0 --storage-drills 0 --pointer-drills 0 "
        f"--state-drills 0 --replica-drills {points} --seed {seed}` ({time.strftime('%Y-%m-%d')}): a9a, 2 ps + "
        f"{WORKERS} workers, --ps-replicas 1, --restart-policy on-failure, no --checkpoint-dir, batch {BATCH}, "
        f"{EPOCHS} epochs, --chaos kill:ps:N@step=S (shard N's current primary) or kill:ps-backup:N@step=S. "
        "Passes: exit 0, updates_lost 0, pushes_applied == pushes_acknowledged, examples exactly "
        f"{EPOCHS} x {A9A_RECORDS}. Pause: from the SIGKILL (metrics.json faults[0].time) to the first worker log "
        "line step=S past the steps a push in flight at the kill could account for (the logs' timestamps, ms).",
        "",
        "| mode | fault | task killed | exit | updates_lost | pause (s) | verdict |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"{len(rows) - failures} of {len(rows)} runs passed; median pause from the kill to the next applied push: "
        f"{median} (over {len(pauses)} runs).",
        "",
    ])
