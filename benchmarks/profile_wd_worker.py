"""Where a W&D worker's CPU goes in issue 29's command: per thread and per stage of its step.

    .venv/bin/python benchmarks/profile_wd_worker.py [--data /tmp/tf_peer/data/ctr_wd] [--revision-dir DIR]

Runs the command a user types (1 ps + 2 workers, psflow's defaults; ``psflow train --format criteo --train
'<data>/train-*.tsv' --model wide_deep --embedding-dim 8 --hidden 256,128 --batch-size 512 --ps 1 --workers 2
--epochs 1``, no eval) with benchmarks/wd_stage_timers on the tasks' ``PYTHONPATH``: each worker times the stages
of its step by thread CPU and wall time, from its 20th step to its last tenth (start-up and the first steps'
page faults left out), and its threads' CPU from /proc. Prints, per worker, ms per local step: its process CPU,
each thread's CPU, and each stage's CPU, wall and calls per step. Stages nest (``compute`` holds
``compute.forward``; ``send`` holds ``send.encode``, ``send.sendmsg``). ``--revision-dir``: run the psflow of
that folder (e.g. a ``git archive`` snapshot) instead of this checkout's.

The machine's other load inflates every CPU figure (two busy cores share caches and memory bandwidth): compare
stages within one run, or runs side by side.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = os.path.join(tempfile.gettempdir(), "tf_peer", "data", "ctr_wd")


def report(path: str) -> list[str]:
    """The lines of one worker's timers file."""
    with open(path) as f:
        data: dict[str, Any] = json.load(f)
    first, last = data["first"], data["last"]
    if first is None or last is None or last[0] == first[0]:
        return [f"{path}: too few steps ({data['runs']})"]
    steps = last[0] - first[0]
    lines = [f"worker pid {os.path.basename(path)[7:-5]}: steps {first[0]}..{last[0]} of {data['runs']}; "
             f"process CPU {1e3 * (last[1] - first[1]) / steps:.3f} ms per step, wall {1e3 * (last[2] - first[2]) / steps:.3f} ms"]
    for tid, (name, cpu) in sorted(last[3].items()):
        spent = cpu - first[3].get(tid, (name, 0.0))[1]
        if spent > 0.005:
            lines.append(f"  thread {tid} ({name}): {1e3 * spent / steps:.3f} ms CPU per step")
    before, after = first[4], last[4]
    for stage in sorted(after):
        cpu, wall, calls = (after[stage][i] - before.get(stage, [0.0, 0.0, 0])[i] for i in range(3))
        if calls:
            lines.append(f"  {stage:22s} CPU {1e3 * cpu / steps:7.3f}  wall {1e3 * wall / steps:7.3f} ms per step"
                         f"  ({calls / steps:.2f} calls)")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=DEFAULT_DATA, help="folder with train-*.tsv (bench_tf_peer_wd.py writes it)")
    p.add_argument("--revision-dir", default=None, help="run the psflow in this folder instead of this checkout's")
    args = p.parse_args()
    root = os.path.abspath(args.revision_dir or os.path.dirname(HERE))
    out = tempfile.mkdtemp(prefix="psflow-wd-stages-")
    env = dict(os.environ, PSFLOW_STAGE_TIMERS=out,
               PYTHONPATH=os.pathsep.join([os.path.join(HERE, "wd_stage_timers"), root]))
    command = [sys.executable, "-m", "psflow", "train", "--format", "criteo", "--train",
               os.path.join(args.data, "train-*.tsv"), "--model", "wide_deep", "--embedding-dim", "8",
               "--hidden", "256,128", "--batch-size", "512", "--ps", "1", "--workers", "2", "--epochs", "1",
               "--quiet", "--output", os.path.join(out, "run")]
    subprocess.run(command, env=env, cwd=root, check=True, stdout=subprocess.DEVNULL)
    for path in sorted(glob.glob(os.path.join(out, "worker-*.json"))):
        print("\n".join(report(path)))


if __name__ == "__main__":
    main()
