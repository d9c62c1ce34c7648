"""Start-up of the W&D command against its tables' size (issue 29's goal: 26 x 2^20 rows / 26 x 2^14 <= 1.2).

One command::

    python benchmarks/bench_startup.py [--pairs 3] [--data /tmp/tf_peer/data/ctr_wd] [--out FILE.json]
    python benchmarks/bench_startup.py --rev 178668d --baseline-rev 47e10cf [--pairs 3] [--checkpoint-dir]

runs issue 29's W&D command (``psflow train --format criteo --model wide_deep --embedding-dim 8
--hidden 256,128 --batch-size 512 --ps 1 --workers 2 --epochs 1``) with ``--num-features 2^20`` (26
hashed fields: 26 tables of 2^20 x 8 and 26 wide ones of 2^20 x 1, ~936 MiB before optimizer slots)
and with ``--num-features 2^14``, alternated in pairs (large first in even pairs, small first in odd
ones), and times each from the launch of the command to the first ``step=`` line any worker logs
(``--log-every 1``; the log's millisecond stamp): process start, the chief's initialization of every
ps partition, the first pull, step and push. Also shown: launch to the chief's "initialized the
variables" line. A run is stopped once its first step is logged (SIGTERM to the launcher, which stops
its tasks; SIGKILL to the command's process group after 30 s). The 1-minute load average is recorded
before each run (the machine is shared: a pair's ratio is the figure to read, its runs being seconds
apart). Prints a markdown table; ``--out`` also writes every run as JSON.

``--rev`` runs psflow at a revision (a ``git archive`` snapshot built with its own ``setup.py build_ext``,
bench_tf_peer.extract_psflow; default: this working tree); with ``--baseline-rev`` too, each pair runs both
revisions (large and small tables each, the revisions' order flipped every other pair) and the table shows
each revision's ratio.

``--checkpoint-dir``: each run has a ``--checkpoint-dir`` (in its temp run directory), so the chief writes the
initial checkpoint before the other workers may train (its save is then part of the start-up); each run also
records that checkpoint's bytes (``ckpt-000000000``'s files) and seconds (the chief's "initialized the
variables" line to its "saved checkpoint" line).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
from bench_tf_peer import extract_psflow  # noqa: E402
from psflow_timing import STEP_LINE, stamped_lines  # noqa: E402

_INIT = "initialized the variables"
_SAVED = "saved checkpoint"

Run = dict[str, Any]


def command(data: str, rows: int, run_dir: str, checkpoint: bool = False) -> list[str]:
    """Issue 29's W&D command with ``rows`` hash buckets a field, logging every step into ``run_dir`` (``checkpoint``:
    with ``--checkpoint-dir run_dir/ckpt``)."""
    extra = ["--checkpoint-dir", os.path.join(run_dir, "ckpt")] if checkpoint else []
    return [sys.executable, "-m", "psflow", "train", "--format", "criteo",
            "--train", os.path.join(data, "train-*.tsv"), "--eval", os.path.join(data, "eval-00000-of-00001.tsv"),
            "--model", "wide_deep", "--embedding-dim", "8", "--hidden", "256,128", "--batch-size", "512",
            "--ps", "1", "--workers", "2", "--epochs", "1", "--num-features", str(rows), "--log-every", "1",
            "--output", run_dir, "--quiet", "--no-status", *extra]


def _first(run_dir: str) -> tuple[float | None, float | None, float | None]:
    """(stamp of the first worker ``step=`` line, of the "initialized the variables" line, of the first "saved
    checkpoint" line), None where not yet."""
    step = init = saved = None
    for path in glob.glob(os.path.join(run_dir, "logs", "*.log")):
        for t, line in stamped_lines([path]):
            if init is None and _INIT in line:
                init = t
            if saved is None and _SAVED in line:
                saved = t
            if STEP_LINE.search(line):
                step = t if step is None else min(step, t)
                break
    return step, init, saved


def _initial_bytes(run_dir: str) -> int | None:
    """Bytes of the initial checkpoint's files (``ckpt/ckpt-000000000*``), or None (none written)."""
    found = glob.glob(os.path.join(run_dir, "ckpt", "ckpt-000000000*", "*"))
    return sum(os.path.getsize(f) for f in found) if found else None


def _stop(p: subprocess.Popen[bytes]) -> None:
    """Stops the command this benchmark started (and the tasks it started)."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)  # its own session: only the processes this command started
            p.wait()


def one_run(data: str, rows: int, timeout: float, src: str = REPO, checkpoint: bool = False) -> Run:
    """Launches the command with psflow from ``src`` and returns its start-up (or a failure)."""
    load = os.getloadavg()[0]
    env = dict(os.environ) if src == REPO else dict(os.environ, PYTHONPATH=src)
    with tempfile.TemporaryDirectory(prefix="psflow-startup-") as run_dir, \
            tempfile.TemporaryFile("w+") as out:
        t0 = time.time()
        p = subprocess.Popen(command(data, rows, run_dir, checkpoint), cwd=src, env=env, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        step = init = saved = None
        try:
            while time.time() - t0 < timeout and p.poll() is None:
                step, init, saved = _first(run_dir)
                if step is not None:
                    break
                time.sleep(0.05)
            step, init, saved = _first(run_dir)
        finally:
            _stop(p)
        ckpt_bytes = _initial_bytes(run_dir)
        if step is None:
            out.seek(0)
            return {"rows": rows, "failed": True, "returncode": p.returncode, "loadavg_1min_before": load,
                    "tail": out.read().strip().splitlines()[-12:]}
        run = {"rows": rows, "startup_s": step - t0, "init_s": None if init is None else init - t0,
               "loadavg_1min_before": load}
        if checkpoint:
            run.update(initial_ckpt_bytes=ckpt_bytes,
                       initial_save_s=None if saved is None or init is None else saved - init)
        return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--data", default="/tmp/tf_peer/data/ctr_wd")
    parser.add_argument("--large", type=int, default=20, help="log2 of the large tables' rows (20)")
    parser.add_argument("--small", type=int, default=14, help="log2 of the small tables' rows (14)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a run may take to its first step")
    parser.add_argument("--out", help="write every run as JSON")
    parser.add_argument("--checkpoint-dir", action="store_true",
                        help="run with --checkpoint-dir (the initial checkpoint is saved before training starts)")
    parser.add_argument("--rev", help="psflow at this revision (a git archive snapshot); default: the working tree")
    parser.add_argument("--baseline-rev", help="also run psflow at this revision in every pair (needs --rev)")
    args = parser.parse_args()
    large, small = 1 << args.large, 1 << args.small
    revs: list[tuple[str, str]] = [("working tree", REPO)] if args.rev is None else []
    for rev in (args.rev, args.baseline_rev):
        if rev is not None:
            commit, src = extract_psflow(rev, tempfile.gettempdir())
            revs.append((commit[:10], src))
    pairs: dict[str, list[dict[str, Run]]] = {label: [] for label, _ in revs}
    for i in range(args.pairs):
        for label, src in (revs if i % 2 == 0 else revs[::-1]):
            order = (large, small) if i % 2 == 0 else (small, large)
            runs = {str(rows): one_run(args.data, rows, args.timeout, src, args.checkpoint_dir) for rows in order}
            pairs[label].append(runs)
            print(f"pair {i} {label}: " + json.dumps(runs), file=sys.stderr, flush=True)
    for label, _ in revs:
        print(f"\npsflow {label}:\n" + report(pairs[label], large, small))
        if args.checkpoint_dir:
            print(checkpoint_report(pairs[label], large, small))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"pairs": pairs, "command": " ".join(command(args.data, large, "RUN_DIR", args.checkpoint_dir)[1:])},
                      f, indent=1)


def report(pairs: list[dict[str, Run]], large: int, small: int) -> str:
    """The markdown table: each pair's start-ups, their ratio and the load average; the median ratio."""
    lines = [f"| pair | 26 x {large} start-up (init) s | 26 x {small} start-up (init) s | ratio | first step after init "
             "s, large / small | load avg (1 min) |", "|---|---|---|---|---|---|"]
    ratios, after_init = [], []
    for i, runs in enumerate(pairs):
        big, little = runs[str(large)], runs[str(small)]
        if big.get("failed") or little.get("failed"):
            lines.append(f"| {i} | failed: {big.get('tail') or little.get('tail')} | | | | |")
            continue
        ratio = big["startup_s"] / little["startup_s"]
        ratios.append(ratio)
        first = [r["startup_s"] - (r["init_s"] or 0) for r in (big, little)]
        after_init.append(first[0])
        lines.append(f"| {i} | {big['startup_s']:.2f} ({big['init_s'] or 0:.2f}) | {little['startup_s']:.2f} "
                     f"({little['init_s'] or 0:.2f}) | {ratio:.2f} | {first[0]:.2f} / {first[1]:.2f} | "
                     f"{big['loadavg_1min_before']:.2f} / {little['loadavg_1min_before']:.2f} |")
    if ratios:
        lines.append(f"\nmedian ratio {statistics.median(ratios):.2f} over {len(ratios)} pairs "
                     f"(range {min(ratios):.2f}-{max(ratios):.2f}); the large tables' first step after "
                     f"\"initialized\": median {statistics.median(after_init):.2f} s")
    return "\n".join(lines)


def checkpoint_report(pairs: list[dict[str, Run]], large: int, small: int) -> str:
    """The initial checkpoint of each run: its bytes and its save's seconds (large / small tables)."""
    lines = ["| pair | initial checkpoint MB, large / small | its save s, large / small |", "|---|---|---|"]
    for i, runs in enumerate(pairs):
        cells = []
        for key in ("initial_ckpt_bytes", "initial_save_s"):
            got = [runs[str(rows)].get(key) for rows in (large, small)]
            scale = 1e6 if key == "initial_ckpt_bytes" else 1.0
            cells.append(" / ".join("-" if v is None else f"{v / scale:.2f}" for v in got))
        lines.append(f"| {i} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
