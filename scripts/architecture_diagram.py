"""Writes docs/architecture.svg: the processes of a ``psflow train`` run and what travels between them.

Hand-placed boxes and arrows written as plain SVG (no library, no randomness): the same file every
time, so a change to the picture is a reviewable diff of this script and of the SVG.

    python scripts/architecture_diagram.py            # writes docs/architecture.svg
    python scripts/architecture_diagram.py OUT.svg    # writes OUT.svg
"""

from __future__ import annotations

import sys
from pathlib import Path
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 980, 640
OUT = Path(__file__).resolve().parent.parent / "docs" / "architecture.svg"

# Colours: processes blue, files grey, the outside world green.
PROCESS, FILES, OUTSIDE = ("#e8f0fc", "#2a6fdb"), ("#f2f2f2", "#888888"), ("#e9f6e9", "#2e8b57")


def box(x: int, y: int, w: int, h: int, title: str, lines: list[str], colours: tuple[str, str],
        stacked: bool = False) -> str:
    """A rounded box with a bold title and smaller lines under it; ``stacked``: drawn as several (N tasks)."""
    fill, stroke = colours
    out = []
    if stacked:
        for d in (8, 4):
            out.append(f'<rect x="{x + d}" y="{y - d}" width="{w}" height="{h}" rx="8" fill="{fill}" '
                       f'stroke="{stroke}" stroke-width="1.2"/>')
    out.append(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="8" fill="{fill}" stroke="{stroke}" '
               f'stroke-width="1.6"/>')
    out.append(f'<text x="{x + 12}" y="{y + 22}" class="title">{escape(title)}</text>')
    for i, line in enumerate(lines):
        out.append(f'<text x="{x + 12}" y="{y + 42 + 16 * i}" class="line">{escape(line)}</text>')
    return "\n".join(out)


def arrow(points: list[tuple[int, int]], label: list[str], at: tuple[int, int], *, both: bool = False,
          anchor: str = "start", dashed: bool = False) -> str:
    """A polyline with an arrowhead at its end (and its start, ``both``) and a label whose first line is at ``at``."""
    path = " ".join(f"{x},{y}" for x, y in points)
    style = ' stroke-dasharray="5,4"' if dashed else ""
    start = ' marker-start="url(#head-start)"' if both else ""
    out = [f'<polyline points="{path}" class="edge"{style}{start} marker-end="url(#head)"/>']
    for i, line in enumerate(label):
        out.append(f'<text x="{at[0]}" y="{at[1] + 15 * i}" class="label" text-anchor="{anchor}">{escape(line)}</text>')
    return "\n".join(out)


def diagram() -> str:
    parts = [
        # The outside world, top right: who reads the status page.
        box(650, 20, 310, 92, "browser, Prometheus, psflow status", [
            "read the run while it trains (127.0.0.1,", "or another address with the cluster token)"], OUTSIDE),
        # The launcher, top left.
        box(20, 20, 400, 156, "psflow train: the launcher", [
            "starts one process per task (free ports, 127.0.0.1)",
            "restarts a dead task (--restart-policy on-failure)",
            "samples every task each second: the status page",
            "evaluates the model at the end; writes metrics.json,",
            "status.json and metrics.prom to the run directory",
            "a lifeline pipe: no task outlives it"], PROCESS),
        # The tasks.
        box(20, 270, 330, 150, "worker tasks (worker 0 is the chief)", [
            "each reads its own share of the records",
            "pulls the rows its batch needs, computes",
            "the gradient, pushes it",
            "chief: initializes once, checkpoints, writes",
            "summaries, evaluates every N steps"], PROCESS, stacked=True),
        box(630, 270, 330, 150, "ps tasks", [
            "hold the variables (tables split over them)",
            "and the optimizer's slots; apply each push",
            "with the optimizer (TensorFlow's formulas)",
            "ps task 0: global_step, one count per push",
            "the examples count, the checkpoint ledger"], PROCESS, stacked=True),
        # Files.
        box(20, 520, 290, 100, "training files (--train)", [
            "LIBSVM, TFRecord, Criteo TSV;", "sorted, split among the workers"], FILES),
        box(345, 520, 290, 100, "run directory (--output)", [
            "logs/, metrics.json, status.json,", "metrics.prom, summaries/ (TensorBoard)"], FILES),
        box(670, 520, 290, 100, "checkpoint directory", [
            "a shard per ps task, manifest last,", "then the pointer: never half written"], FILES),
        # What travels.
        arrow([(650, 66), (420, 66)], ["HTTP GET: the page, /api/status, /metrics"], (535, 58), anchor="middle"),
        arrow([(150, 176), (150, 262)], ["start, restart, stop;", "Ping each second"], (160, 212)),
        arrow([(300, 176), (300, 222), (795, 222), (795, 262)], ["start, restart, stop; Ping and Stats each second"],
              (430, 214)),
        '<text x="494" y="256" class="note" text-anchor="middle">every RPC: gRPC or psflow\'s TCP, with the '
        'cluster token</text>',
        arrow([(358, 318), (630, 318)], ["Push: gradient rows, reader position;", "returns the step it took"],
              (494, 300), anchor="middle"),
        arrow([(630, 372), (358, 372)], ["Pull: the rows a batch needs"], (494, 364), anchor="middle"),
        arrow([(358, 408), (630, 408)], ["chief: initialize; save and restore checkpoints"], (494, 400),
              anchor="middle", dashed=True),
        arrow([(165, 520), (165, 428)], ["records"], (175, 480)),
        arrow([(300, 428), (440, 512)], ["logs; the chief's", "summaries"], (382, 462)),
        arrow([(815, 428), (815, 512)], ["each ps task writes", "(and restores) its shard"], (825, 462), both=True),
    ]
    style = """
  .title { font: bold 15px sans-serif; fill: #1a1a1a; }
  .line { font: 12.5px sans-serif; fill: #333; }
  .label { font: 12px sans-serif; fill: #1f4e9c; }
  .note { font: italic 12px sans-serif; fill: #555; }
  .edge { fill: none; stroke: #1f4e9c; stroke-width: 1.6; }"""
    return "\n".join([
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="psflow architecture: processes and what travels '
        'between them">',
        "<!-- Generated by scripts/architecture_diagram.py; edit that script, not this file. -->",
        f"<style>{style}\n</style>",
        '<defs><marker id="head" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8" markerHeight="8" '
        'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#1f4e9c"/></marker>',
        '<marker id="head-start" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8" markerHeight="8" '
        'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#1f4e9c"/></marker></defs>',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
        *parts,
        "</svg>",
        "",
    ])


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print(f"usage: python scripts/architecture_diagram.py [OUT.svg] (got {' '.join(argv)}): no options; "
              "without OUT.svg it writes docs/architecture.svg", file=sys.stderr)
        return 2
    out = Path(argv[0]) if argv else OUT
    out.write_text(diagram())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
