"""Writes docs/layers.svg: psflow's packages in their import layers, and the path of one training step.

The layers are read from pyproject.toml's ``[tool.importlinter]`` layers contract (the one ``lint-imports``
checks), top to bottom; each package gets a line saying its job (:data:`JOBS`, which must name every
package of the contract: a package added to the contract without one is refused). The numbered badges are
one worker's step through the packages, as docs/architecture.md tells it (:data:`STEP`). Plain SVG, no
library, no randomness: the same file every time (tests/unit/test_architecture_doc.py checks that the
committed SVG is this script's output).

    python scripts/layers_diagram.py            # writes docs/layers.svg
    python scripts/layers_diagram.py OUT.svg    # writes OUT.svg
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from xml.sax.saxutils import escape

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "docs" / "layers.svg"

#: Each package's job, in a few words (the package's ``__init__`` docstring has the whole map).
JOBS = {
    "cli": "the psflow command: flags -> TrainConfig",
    "launch": "a run's processes, started and ended",
    "deploy": "psflow k8s render: manifests",
    "status": "the status page, metrics files",
    "export": "the model in a portable form",
    "train": "worker loop, TrainStep, chief, recovery",
    "checkpoint": "sharded atomic saves, restore",
    "server": "one task's endpoint (Server)",
    "torch": "PyTorch models (wide_deep, ...)",
    "ps": "ps service and state; client, protocol",
    "models": "the model seam, built-in models",
    "coord": "chief election: leases, fencing",
    "placement": "which ps task holds each row",
    "data": "input files -> Batch",
    "rpc": "carriers (tcp, grpc), dispatch",
    "cluster": "ClusterSpec, TF_CONFIG",
    "optim": "optimizer specs",
    "storage": "files, atomic writes",
    "native": "C loader, id loops",
    "gradients": "gradient types",
    "jsonio": "standard JSON",
    "extras": "pip extras, one-line error",
    "errors": "PsflowError, the root",
}

#: One worker's step: (badge, package, what happens there), in order.
STEP = [
    (1, "data", "the worker's Dataset yields a Batch"),
    (2, "train", "run_worker's session runs TrainStep"),
    (3, "models", "Model.lookups, then Model.compute: loss, gradients"),
    (4, "ps", "ParameterClient + Planner: PullRequest / PushRequest"),
    (5, "rpc", "a carrier sends the Frame; dispatch on the ps task"),
    (6, "ps", "ParameterService: VariableStore, optimizer, StepClock"),
    (7, "train", "the PushReply's global_step goes to the hooks"),
]

WIDTH, ROW, TOP, LEFT = 980, 46, 64, 150
PACKAGE, LEAF, BADGE = ("#e8f0fc", "#2a6fdb"), ("#f2f2f2", "#888888"), "#c0392b"


def layers(pyproject: Path = REPO / "pyproject.toml") -> list[list[str]]:
    """The layers contract's layers, top first, each a list of package names (``psflow.`` dropped)."""
    config = tomllib.loads(pyproject.read_text())
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c.get("type") == "layers")
    out = []
    for layer in contract["layers"]:
        out.append([name.strip().removeprefix("psflow.") for name in layer.split("|")])
    missing = [p for layer in out for p in layer if p not in JOBS]
    if missing:
        raise SystemExit(f"scripts/layers_diagram.py: no job written for package(s) {', '.join(missing)} of "
                         "pyproject.toml's layers contract: add them to JOBS")
    return out


def diagram() -> str:
    rows = layers()
    height = TOP + ROW * len(rows) + 40 + 18 * len(STEP) + 20
    badges: dict[str, list[int]] = {}
    for n, package, _ in STEP:
        badges.setdefault(package, []).append(n)
    parts = [
        '<text x="20" y="30" class="head">psflow\'s packages, top layer first: a package imports its own layer\'s '
        'package or a lower one, never one above</text>',
        '<text x="20" y="48" class="note">(pyproject.toml [tool.importlinter], checked by lint-imports; '
        'in one row, a | b import neither the other. Red badges: one worker\'s step, in order)</text>',
    ]
    span = WIDTH - LEFT - 20
    for i, layer in enumerate(rows):
        y = TOP + ROW * i
        parts.append(f'<text x="20" y="{y + 26}" class="layer">layer {i + 1}</text>')
        w = (span - 8 * (len(layer) - 1)) // len(layer)
        for j, package in enumerate(layer):
            x = LEFT + j * (w + 8)
            fill, stroke = LEAF if i >= len(rows) - 3 else PACKAGE
            parts.append(f'<rect x="{x}" y="{y}" width="{w}" height="{ROW - 8}" rx="6" fill="{fill}" '
                         f'stroke="{stroke}" stroke-width="1.4"/>')
            parts.append(f'<text x="{x + 10}" y="{y + 16}" class="title">psflow.{escape(package)}</text>')
            parts.append(f'<text x="{x + 10}" y="{y + 32}" class="line">{escape(JOBS[package])}</text>')
            mine = badges.get(package, [])
            for k, n in enumerate(mine):  # left to right in step order
                cx = x + w - 14 - 24 * (len(mine) - 1 - k)
                parts.append(f'<circle cx="{cx}" cy="{y + 19}" r="10" fill="{BADGE}"/>')
                parts.append(f'<text x="{cx}" y="{y + 23.5}" class="badge" text-anchor="middle">{n}</text>')
    y = TOP + ROW * len(rows) + 16
    parts.append(f'<text x="20" y="{y}" class="head">One worker\'s step (docs/architecture.md tells it whole)</text>')
    for k, (n, package, what) in enumerate(STEP):
        yy = y + 22 + 18 * k
        parts.append(f'<circle cx="30" cy="{yy - 4}" r="8" fill="{BADGE}"/>')
        parts.append(f'<text x="30" y="{yy}" class="badge small" text-anchor="middle">{n}</text>')
        parts.append(f'<text x="46" y="{yy}" class="line">psflow.{escape(package)}: {escape(what)}</text>')
    style = """
  .head { font: bold 14px sans-serif; fill: #1a1a1a; }
  .title { font: bold 13px sans-serif; fill: #1a1a1a; }
  .layer { font: 12px sans-serif; fill: #555; }
  .line { font: 12px sans-serif; fill: #333; }
  .note { font: italic 12px sans-serif; fill: #555; }
  .badge { font: bold 12px sans-serif; fill: #ffffff; }
  .small { font-size: 11px; }"""
    return "\n".join([
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
        'role="img" aria-label="psflow packages in their import layers, and one training step through them">',
        "<!-- Generated by scripts/layers_diagram.py from pyproject.toml; edit the script, not this file. -->",
        f"<style>{style}\n</style>",
        f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>',
        *parts,
        "</svg>",
        "",
    ])


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else OUT
    out.write_text(diagram())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
