"""The wheel: built with ``python -m build``, installed without extras in a fresh venv, it trains a9a.

Needs the ``build`` package (the ``test`` extra; skipped without it) and a package index for the build's
setuptools and psflow's dependencies (CI has PyPI, so a failed install fails; ``PSFLOW_OFFLINE=1`` skips).
The wheel is built from a copy of the sources (pyproject.toml, setup.py, README.md, psflow/ without
compiled files), as from a fresh checkout: nothing built in the working tree can leak into it, and
nothing is written there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from support import A9A, A9A_T, REPO, run_bounded

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

HINT = "psflow report: error: plots need matplotlib: pip install 'psflow[plots]'"
EXTENSIONS = ("psflow.data._native", "psflow.native._ids", "psflow.ps._kernels", "psflow.models._logistic")


def _can_compile() -> bool:
    """A C compiler and Python's headers: where the install must build the extensions (as scripts/test.sh)."""
    has_cc = shutil.which("cc") is not None or shutil.which("gcc") is not None
    return has_cc and os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))


def _env() -> dict[str, str]:
    """This environment without what would let the source tree or this venv leak into the child."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PSFLOW_NATIVE")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _run(cmd: list[str], *, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """Runs ``cmd`` outside this venv's environment, bounded as :func:`support.run_bounded`."""
    return run_bounded(cmd, cwd=cwd, env=_env(), timeout=timeout)


def _copy_sources(dest: Path) -> None:
    dest.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    shutil.copytree(REPO / "psflow", dest / "psflow", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.egg-info"))


def _build_wheel(tmp_path: Path) -> Path:
    src, dist = tmp_path / "src", tmp_path / "dist"
    _copy_sources(src)
    r = _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(src)], cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (wheel,) = dist.glob("psflow-*.whl")
    return wheel


def _check_contents(wheel: Path, native: bool) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"psflow", "psflow-0.1.0.dist-info"}, names  # no tests, no data
    for name in ("psflow/py.typed", "psflow/data/_native.c", "psflow/data/_native.pyi", "psflow/data/example.proto",
                 "psflow/native/_ids.c", "psflow/native/_ids.pyi", "psflow/native/buffers.h", "psflow/ps/_kernels.c",
                 "psflow/models/_logistic.c", "psflow/torch/_lookup.c",
                 "psflow/cli/main.py",
                 "psflow/status/page/index.html",
                 "psflow/status/page/status.js", "psflow/status/page/status.css"):
        assert name in names, name
    if native:
        for module in EXTENSIONS:
            stem = module.replace(".", "/") + "."
            assert any(n.startswith(stem) and n.endswith(".so") for n in names), (module, names)
        assert "-none-any" not in wheel.name, wheel.name  # a platform wheel
    metadata = zipfile.ZipFile(wheel).read("psflow-0.1.0.dist-info/METADATA").decode()
    core = {re.split(r"[^A-Za-z0-9_.-]", line.split(":", 1)[1].strip())[0].lower()
            for line in metadata.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line}
    assert "numpy" in core and core.isdisjoint({"matplotlib", "tensorboard", "tensorboardx", "kazoo", "torch"}), core


def test_wheel_installs_without_extras_and_trains_a9a(tmp_path: Path) -> None:
    pytest.importorskip("build", reason="the 'build' package (psflow[test]) is not installed")
    if os.environ.get("PSFLOW_OFFLINE") == "1":
        pytest.skip("PSFLOW_OFFLINE=1: building and installing the wheel needs a package index")
    native = _can_compile()
    wheel = _build_wheel(tmp_path)
    _check_contents(wheel, native)

    venv = tmp_path / "venv"
    r = _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    python, psflow = venv / "bin" / "python", venv / "bin" / "psflow"
    r = _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel),
              "-c", str(REPO / "constraints.txt")], cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    # The venv's psflow, not the source tree's; no extra came with it; the C extensions where they can be built.
    probe = ("import importlib.util, json, psflow\n"
             "extras = ('matplotlib', 'tensorboard', 'tensorboardX', 'kazoo', 'torch')\n"
             "print(json.dumps({'file': psflow.__file__, 'extras': [m for m in extras if importlib.util.find_spec(m)]}))\n")
    if native:
        probe += "".join(f"import {m}\n" for m in EXTENSIONS)
    r = _run([str(python), "-c", probe], cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    assert Path(found["file"]).is_relative_to(venv) and found["extras"] == [], found

    run = tmp_path / "run"
    r = _run([str(psflow), "train", "--train", str(A9A), "--eval", str(A9A_T), "--num-features", "124", "--ps", "1",
              "--workers", "1", "--epochs", "1", "--output", str(run), "--quiet"], cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["eval"]["auc"] > 0.85, metrics
    assert "psflow: status http://127.0.0.1:" in r.stderr  # the live page (prometheus-client is core)
    assert "psflow_examples_total" in (run / "metrics.prom").read_text()
    r = _run([str(psflow), "status", str(run)], cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and "/job:worker/task:0" in r.stdout, r

    r = _run([str(psflow), "report", str(run)], cwd=tmp_path, timeout=120)
    assert r.returncode == 1, r
    assert r.stderr.splitlines() == [HINT] and r.stdout == "", r  # one line, no traceback
