"""Issue 29's W&D command with numpy's huge pages on (its default) and off, alternated pairs: ps memory and start-up.

    .venv/bin/python benchmarks/ab_wd_hugepage.py --pairs 3 --shapes p1w2-async,single

numpy advises the kernel to back every array of 4 MiB or more with transparent huge pages (``MADV_HUGEPAGE``,
where THP is in ``madvise`` mode, as here) unless ``NUMPY_MADVISE_HUGEPAGE=0`` is set when it is imported. A lazy
partition (psflow/ps/lazy_rows.py) is a zero-filled array whose pages are committed on first write: with 2 MiB
pages one touched row commits 2 MiB (65,536 rows of 8 floats), so a few hundred hashed ids spread over a 2^20-row
table commit all of it. This runs the same ``psflow train`` (bench_tf_peer_wd.py ``--user-defaults``, the
measured revision's ``git archive`` snapshot) with the variable unset and with it set to 0, in the task processes'
environment only, alternated (order flipped every other pair), and reports the ps tasks' peak RSS (VmHWM), the
one-epoch rate from "initialized the variables" (the first steps' page faults are in it), the rate after the
first logged step >= 40, end to end (the command's wall time) and the command's CPU seconds. psflow's code is
not changed. Writes benchmarks/results/wd_hugepage_issue29.json (``--json-out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_tf_peer_wd as wd  # noqa: E402
from bench_tf_peer import extract_psflow  # noqa: E402

SIDES = ("numpy default (huge pages)", "NUMPY_MADVISE_HUGEPAGE=0")
METRICS = ("ps_peak_rss_mib", "examples_per_sec", "examples_per_sec_after_warmup", "examples_per_sec_end_to_end",
           "cpu_seconds", "wall_s")


def one(args: argparse.Namespace, key: str, side: str) -> dict[str, Any]:
    """One run of shape ``key`` with the variable unset (``SIDES[0]``) or set to 0."""
    saved = os.environ.pop("NUMPY_MADVISE_HUGEPAGE", None)
    if side == SIDES[1]:
        os.environ["NUMPY_MADVISE_HUGEPAGE"] = "0"
    try:
        per_step = next(p for k, *_, p in wd.SHAPES if k == key)
        return dict(wd.measured(lambda: wd.psflow_run(args, args.data, "tsv", key, per_step)),
                    loadavg_1min_before=os.getloadavg()[0])
    finally:
        os.environ.pop("NUMPY_MADVISE_HUGEPAGE", None)
        if saved is not None:
            os.environ["NUMPY_MADVISE_HUGEPAGE"] = saved


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="/tmp/tf_peer")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--shapes", default="p1w2-async,single", help="bench_tf_peer_wd.py configurations")
    p.add_argument("--psflow-rev", default="HEAD")
    p.add_argument("--run-timeout", type=float, default=600.0)
    p.add_argument("--json-out", default=os.path.join(HERE, "results", "wd_hugepage_issue29.json"))
    args = p.parse_args()
    args.user_defaults, args.psflow_extra = True, ""
    args.data = os.path.join(args.workdir, "data", "ctr_wd")
    commit, args.psflow_src = extract_psflow(args.psflow_rev, args.workdir)
    os.makedirs(os.path.join(args.workdir, "runs_wd"), exist_ok=True)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {k: {s: [] for s in SIDES} for k in shapes}
    for pair in range(args.pairs):
        for key in shapes:
            for side in (SIDES if pair % 2 == 0 else SIDES[::-1]):
                r = one(args, key, side)
                runs[key][side].append(r)
                print(f"[{pair + 1}/{args.pairs} {time.strftime('%H:%M:%S')}] {key} {side}: "
                      + ("FAILED " + " | ".join(r["tail"]) if r.get("failed") else
                         ", ".join(f"{m} {r.get(m) or 0:,.1f}" for m in METRICS)), flush=True)
    summary: dict[str, Any] = {}
    for key in shapes:
        a, b = (runs[key][s] for s in SIDES)
        ok = [(x, y) for x, y in zip(a, b, strict=True) if not x.get("failed") and not y.get("failed")]
        summary[key] = {m: {"default_median": statistics.median(x[m] for x, _ in ok),
                            "off_median": statistics.median(y[m] for _, y in ok),
                            "off_over_default_pair_ratios": [y[m] / x[m] for x, y in ok]}
                        for m in METRICS if ok and all(x.get(m) and y.get(m) for x, y in ok)}
        for m, v in summary[key].items():
            print(f"{key} {m}: default {v['default_median']:,.1f}, off {v['off_median']:,.1f}, off/default per pair "
                  + ", ".join(f"{q:.2f}" for q in v["off_over_default_pair_ratios"]))
    with open(args.json_out, "w") as f:
        json.dump({"command": "benchmarks/ab_wd_hugepage.py " + " ".join(sys.argv[1:]), "psflow_commit": commit,
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "summary": summary, "runs": runs},
                  f, indent=1, default=float)


if __name__ == "__main__":
    main()
