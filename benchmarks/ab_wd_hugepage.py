"""Issue 29's W&D command, two sides alternated in pairs: ps memory, start-up, steady and end-to-end speed.

    .venv/bin/python benchmarks/ab_wd_hugepage.py --pairs 3 --shapes p1w2-async,single
    .venv/bin/python benchmarks/ab_wd_hugepage.py --baseline-rev 47e10cf --rev 178668d --pairs 4

Without ``--baseline-rev``: the same psflow (``--psflow-rev``) with numpy's huge-page advice as it is and with
``NUMPY_MADVISE_HUGEPAGE=0`` in the task processes' environment (numpy then advises nothing for any array of
the process). With ``--baseline-rev A --rev B``: psflow at A against psflow at B, numpy's default in both; each
revision is a ``git archive`` snapshot built with its own ``setup.py build_ext`` (bench_tf_peer.extract_psflow),
run as its own ``python -m psflow train``.

Why: numpy advises the kernel to back every array of 4 MiB or more with transparent huge pages
(``MADV_HUGEPAGE``, where THP is in ``madvise`` mode, as here). A lazy partition (psflow/ps/lazy_rows.py) is a
zero-filled array whose pages are committed on first write: with 2 MiB pages one touched row commits 2 MiB
(65,536 rows of 8 floats), so a few hundred hashed ids spread over a 2^20-row table commit all of it; psflow
since 178668d backs lazy partitions with small pages (psflow/ps/memory.py).

Each run is bench_tf_peer_wd.py's ``--user-defaults`` command (the command a user types), the two sides
alternated (order flipped every other pair), shapes interleaved. Reported per pair as B / A (or off / default):
the ps tasks' peak RSS (VmHWM), the one-epoch rate from "initialized the variables" (the first steps' page
faults are in it), the rate after the first logged step >= 40 (steady), end to end (the command's wall time)
and the command's CPU seconds (every process it waited for). ``--psflow-extra '--epochs 3'`` puts the steady
window mostly in epochs 2 and 3, where no row is new. Writes ``--json-out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_tf_peer_wd as wd  # noqa: E402
from bench_tf_peer import extract_psflow  # noqa: E402

METRICS = ("ps_peak_rss_mib", "examples_per_sec", "examples_per_sec_after_warmup", "examples_per_sec_end_to_end",
           "cpu_seconds", "wall_s")


@dataclass(frozen=True)
class Side:
    """One side of the comparison: a label, the psflow snapshot it runs and its ``NUMPY_MADVISE_HUGEPAGE``."""

    label: str
    commit: str
    src: str
    numpy_hugepage: str | None  # None: unset (numpy's default)


def one(args: argparse.Namespace, key: str, side: Side) -> dict[str, Any]:
    """One run of shape ``key`` on ``side``."""
    saved = os.environ.pop("NUMPY_MADVISE_HUGEPAGE", None)
    if side.numpy_hugepage is not None:
        os.environ["NUMPY_MADVISE_HUGEPAGE"] = side.numpy_hugepage
    args.psflow_src = side.src
    try:
        per_step = next(p for k, *_, p in wd.SHAPES if k == key)
        return dict(wd.measured(lambda: wd.psflow_run(args, args.data, "tsv", key, per_step)),
                    loadavg_1min_before=os.getloadavg()[0])
    finally:
        os.environ.pop("NUMPY_MADVISE_HUGEPAGE", None)
        if saved is not None:
            os.environ["NUMPY_MADVISE_HUGEPAGE"] = saved


def sides(args: argparse.Namespace) -> tuple[Side, Side]:
    """(the reference side, the measured side)."""
    if args.baseline_rev is None:
        commit, src = extract_psflow(args.psflow_rev, args.workdir)
        return (Side(f"{commit[:10]}, numpy default (huge pages)", commit, src, None),
                Side(f"{commit[:10]}, NUMPY_MADVISE_HUGEPAGE=0", commit, src, "0"))
    (a, a_src), (b, b_src) = (extract_psflow(r, args.workdir) for r in (args.baseline_rev, args.rev))
    return Side(f"baseline {a[:10]}", a, a_src, None), Side(f"rev {b[:10]}", b, b_src, None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="/tmp/tf_peer")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--shapes", default="p1w2-async,single", help="bench_tf_peer_wd.py configurations")
    p.add_argument("--psflow-rev", default="HEAD", help="the revision of the numpy on/off comparison")
    p.add_argument("--baseline-rev", help="compare psflow at this revision (A) with --rev (B) instead")
    p.add_argument("--rev", default="HEAD", help="the measured revision, with --baseline-rev")
    p.add_argument("--psflow-extra", default="", help="flags added to the command (e.g. '--epochs 3': the last wins)")
    p.add_argument("--run-timeout", type=float, default=600.0)
    p.add_argument("--json-out", default=os.path.join(HERE, "results", "wd_hugepage_issue29.json"))
    args = p.parse_args()
    args.user_defaults = True
    args.data = os.path.join(args.workdir, "data", "ctr_wd")
    pair_sides = sides(args)
    os.makedirs(os.path.join(args.workdir, "runs_wd"), exist_ok=True)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {k: {s.label: [] for s in pair_sides} for k in shapes}
    for pair in range(args.pairs):
        for key in shapes:
            for side in (pair_sides if pair % 2 == 0 else pair_sides[::-1]):
                r = one(args, key, side)
                runs[key][side.label].append(r)
                print(f"[{pair + 1}/{args.pairs} {time.strftime('%H:%M:%S')}] {key} {side.label}: "
                      + ("FAILED " + " | ".join(r["tail"]) if r.get("failed") else
                         ", ".join(f"{m} {r.get(m) or 0:,.1f}" for m in METRICS)), flush=True)
    summary = summarize(runs, shapes, pair_sides)
    with open(args.json_out, "w") as f:
        json.dump({"command": "benchmarks/ab_wd_hugepage.py " + " ".join(sys.argv[1:]),
                   "sides": [{"label": s.label, "commit": s.commit, "NUMPY_MADVISE_HUGEPAGE": s.numpy_hugepage}
                             for s in pair_sides],
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "summary": summary, "runs": runs},
                  f, indent=1, default=float)


def summarize(runs: dict[str, dict[str, list[dict[str, Any]]]], shapes: list[str],
              pair_sides: tuple[Side, Side]) -> dict[str, Any]:
    """Per shape and metric: both sides' medians and the per-pair ratios measured / reference (printed too)."""
    summary: dict[str, Any] = {}
    ref, new = pair_sides
    for key in shapes:
        a, b = runs[key][ref.label], runs[key][new.label]
        ok = [(x, y) for x, y in zip(a, b, strict=True) if not x.get("failed") and not y.get("failed")]
        summary[key] = {m: {"reference_median": statistics.median(x[m] for x, _ in ok),
                            "measured_median": statistics.median(y[m] for _, y in ok),
                            "measured_over_reference_pair_ratios": [y[m] / x[m] for x, y in ok]}
                        for m in METRICS if ok and all(x.get(m) and y.get(m) for x, y in ok)}
        for m, v in summary[key].items():
            print(f"{key} {m}: {ref.label} {v['reference_median']:,.1f}, {new.label} {v['measured_median']:,.1f}, "
                  f"ratio per pair " + ", ".join(f"{q:.2f}" for q in v["measured_over_reference_pair_ratios"]))
    return summary


if __name__ == "__main__":
    main()
