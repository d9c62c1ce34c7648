"""The README's Python API snippet ("The pieces, in one glance") runs as it is written, against real ps tasks.

The ```python block is read from README.md; only its addresses change (``h0:2222`` ... become free ports on
127.0.0.1) and the arrays it leaves to the reader (``ids``, ``g``, ``gb``) are defined before it. Two ps tasks run
as their own processes (``psflow.Server(..., "ps", i).join()``); the snippet runs as worker 0, the cluster's
chief, and nobody else: a snippet whose ``register`` waits for a chief to initialize the variables never returns
(it blocks for ``connect_timeout``, 60 s, then raises), so a README that drops ``chief=`` fails here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO

from psflow.launch.ports import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

README = REPO / "README.md"
HOSTS = ("h0:2222", "h1:2222", "h2:2222", "h3:2222")

PRELUDE = """\
import numpy as np
ids = np.array([3, 524290, 1000000], dtype=np.int64)   # rows on both partitions of "weights"
g = np.ones((3, 1), dtype=np.float32)
gb = np.ones((1,), dtype=np.float32)
"""

EPILOGUE = """
import json
after = client.pull({"weights": ids, "bias": None})
bias_tasks = [p.task for v in variables.placements() if v.var.name == "bias" for p in v.partitions]
print("RESULT " + json.dumps({"step": int(step), "rows": {k: np.asarray(v).tolist() for k, v in rows.items()},
                              "after": {k: np.asarray(v).tolist() for k, v in after.items()},
                              "bias_tasks": bias_tasks}))
"""

PS = "import json, sys, psflow; psflow.Server(psflow.ClusterSpec(json.loads(sys.argv[1])), 'ps', int(sys.argv[2])).join()"


def _snippet() -> str:
    text = README.read_text(encoding="utf-8")
    marker = "The pieces, in one glance:"
    assert marker in text, f"README.md has no {marker!r}"
    found = re.search(r"```python\n(.*?)```", text.split(marker, 1)[1], re.S)
    assert found is not None, "README.md: no ```python block after 'The pieces, in one glance:'"
    code = found.group(1)
    for host in HOSTS:
        assert f'"{host}"' in code, f"the snippet no longer names {host}: update this test"
    return code


def test_the_readme_python_snippet_registers_pushes_and_pulls(tmp_path: Path) -> None:
    ports = free_ports(4)
    addresses = [f"127.0.0.1:{p}" for p in ports]
    code = _snippet()
    for host, address in zip(HOSTS, addresses, strict=True):
        code = code.replace(f'"{host}"', f'"{address}"')
    script = tmp_path / "snippet.py"
    script.write_text(PRELUDE + code + EPILOGUE)
    cluster = json.dumps({"ps": addresses[:2], "worker": addresses[2:]})
    env = {k: v for k, v in os.environ.items() if k != "PSFLOW_TOKEN"}  # the snippet passes no token: all have none
    procs = []
    try:
        for i in range(2):
            with open(tmp_path / f"ps{i}.log", "wb") as log:
                procs.append(subprocess.Popen([sys.executable, "-c", PS, cluster, str(i)], stdout=log,
                                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=str(tmp_path)))
        try:
            run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                                 cwd=str(tmp_path), timeout=50)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"README.md's Python snippet did not finish within 50 s (a register that waits for a chief "
                        f"nobody is?): {(e.stderr or b'')[-1500:]!r}")
        assert run.returncode == 0, run.stderr[-3000:]
    finally:
        for p in procs:  # only what this test started, by its Popen
            if p.poll() is None:
                p.kill()
                p.wait()
    [line] = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert result["step"] == 1  # the first push of the cluster
    assert result["bias_tasks"] == [0]  # "assigned to /job:ps/task:0 (round-robin)", as the comment says
    assert result["rows"] == {"weights": [[0.0], [0.0], [0.0]], "bias": [0.0]}  # zeros before the push
    # FTRL moved every pushed row against its gradient (all ones): each value below zero
    assert all(v[0] < 0 for v in result["after"]["weights"]) and result["after"]["bias"][0] < 0
