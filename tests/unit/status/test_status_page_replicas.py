"""The status page shows a replicated run's pushes acknowledged, applied and lost, and each shard's primary and
backups (status.json had them; the page showed none). status.js is run under Node with a stub document, where
Node is installed (CI images without it skip: the page's other checks stay in test_status_server.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

PAGE = Path(__file__).resolve().parents[3] / "psflow" / "status" / "page"
NODE = shutil.which("node")

# Loads status.js into a context whose document hands out stub elements (its first poll() fails quietly), then
# renders the snapshot given on stdin with renderReplicas and prints what the page's two elements hold.
_HARNESS = r"""
const vm = require("vm"), fs = require("fs");
const elements = {};
const element = (id) => elements[id] || (elements[id] = {id, hidden: false, children: [], textContent: "",
  replaceChildren(...c) { this.children = c; }, appendChild(c) { this.children.push(c); }});
const document = {getElementById: element, createElement: (tag) => element(tag + Math.random())};
const context = {document, fetch: () => Promise.reject(new Error("no server")), setTimeout: () => 0, console};
vm.createContext(context);
vm.runInContext(fs.readFileSync(process.argv[process.argv.length - 1], "utf8"), context);
const snapshot = JSON.parse(fs.readFileSync(0, "utf8"));
context.renderReplicas(snapshot);
console.log(JSON.stringify({hidden: element("replicas-box").hidden,
                            lines: element("replicas").children.map((c) => c.textContent)}));
"""


def _render(snapshot: dict[str, object]) -> dict[str, object]:
    assert NODE is not None
    r = subprocess.run([NODE, "-e", _HARNESS, "--", str(PAGE / "status.js")], input=json.dumps(snapshot),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    out: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_the_page_shows_updates_lost_and_each_shards_primary() -> None:
    snapshot = {"pushes_acknowledged": 607, "pushes_applied": 396, "updates_lost": 211,
                "shards": [{"shard": 0, "primary": "/job:ps_backup/task:0", "epoch": 2, "backups": [],
                            "updates_lost": 104},
                           {"shard": 1, "primary": "/job:ps/task:1", "epoch": 1,
                            "backups": [{"task": "/job:ps_backup/task:1", "lag_entries": 3, "lag_seconds": 0.25}],
                            "updates_lost": 107}]}
    shown = _render(snapshot)
    assert shown == {"hidden": False, "lines": [
        "pushes acknowledged 607 | applied 396 | updates lost 211",
        "shard 0: primary /job:ps_backup/task:0 (epoch 2), no backup; 104 updates lost",
        "shard 1: primary /job:ps/task:1 (epoch 1), backups /job:ps_backup/task:1 (3 entries, 0.25 s behind); "
        "107 updates lost"]}, shown
    assert _render({"updates_lost": None, "shards": None}) == {"hidden": True, "lines": []}


def test_the_page_has_the_replicas_box_and_renders_it() -> None:
    html = (PAGE / "index.html").read_text()
    assert 'id="replicas-box" hidden' in html and 'id="replicas"' in html
    assert re.search(r"renderCheckpoints\(s\.checkpoints\);\s*renderReplicas\(s\);", (PAGE / "status.js").read_text())
