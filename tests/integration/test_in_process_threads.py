"""``run_in_process`` (the Python API of ``psflow train --in-process``) scopes PyTorch's threads to its run.

The run gives PyTorch's intra-op threads the cores less the reader process's (or ``$PSFLOW_TORCH_THREADS``,
set by the user) through the variable that :func:`psflow.torch.configure_threads` reads when the model is
built. It used to set the variable in the caller's environment and leave it there, with PyTorch's count
changed: a second run, the caller's own PyTorch code and every process it started afterwards inherited them.
Now both are restored when the run ends, and the run itself still computes with the same threads.

Each case runs in a fresh process (:func:`support.in_fresh_process`): the run forks its reader, and the
variable and PyTorch's count belong to the process.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import A9A, in_fresh_process

from psflow.cluster import ClusterSpec
from psflow.train.config import TORCH_THREADS_ENV, TrainConfig

# Not importorskip: the cases' processes import this module, and one of them must not have PyTorch imported.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(240),
              pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs psflow[torch]")]


def _run(out: str) -> tuple[str | None, int]:
    """One short ``dnn`` run in ``out``; returns (the variable, PyTorch's threads) as the run's end saw them."""
    from psflow.launch.in_process import run_in_process

    seen: list[tuple[str | None, int]] = []

    def on_end(final: dict[str, Any], cluster: ClusterSpec) -> None:  # called inside the run, after training
        import torch  # imported by the run by now (not before it: see _first_import_by_the_run)

        assert final["phase"] == "finished", final
        seen.append((os.environ.get(TORCH_THREADS_ENV), torch.get_num_threads()))

    config = TrainConfig.flat(train=(str(A9A),), num_features=124, num_ps=1, num_workers=1, max_steps=5, model="dnn")
    run_in_process(config, out, on_end=on_end)
    return seen[0]


def _twice_after_torch(tmp: str, given: str | None) -> dict[str, Any]:
    """In a fresh process that imported PyTorch and set its own count: two runs, then the state left behind."""
    import torch

    if given is None:
        os.environ.pop(TORCH_THREADS_ENV, None)
    else:
        os.environ[TORCH_THREADS_ENV] = given
    mine = (os.cpu_count() or 1) + 2  # a count no run picks
    torch.set_num_threads(mine)
    during = [_run(os.path.join(tmp, f"run-{i}")) for i in range(2)]
    return {"mine": mine, "during": during, "after": (os.environ.get(TORCH_THREADS_ENV), torch.get_num_threads())}


def _first_import_by_the_run(tmp: str) -> dict[str, Any]:
    """In a fresh process that has not imported PyTorch: one run (which imports it), then the state left behind."""
    os.environ.pop(TORCH_THREADS_ENV, None)
    assert "torch" not in sys.modules
    during = _run(os.path.join(tmp, "run"))
    import torch

    return {"during": during, "after": (os.environ.get(TORCH_THREADS_ENV), torch.get_num_threads())}


def test_the_run_leaves_the_callers_environment_and_threads_as_they_were(tmp_path: Path) -> None:
    result = in_fresh_process(_twice_after_torch, str(tmp_path), None, limit=200)
    run_threads = max(1, (os.cpu_count() or 1) - 1)
    assert result["during"] == [(str(run_threads), run_threads)] * 2  # each run: the cores less the reader's
    assert result["after"] == (None, result["mine"])


def test_a_count_the_user_set_is_used_and_kept(tmp_path: Path) -> None:
    result = in_fresh_process(_twice_after_torch, str(tmp_path), "3", limit=200)
    assert result["during"] == [("3", 3)] * 2
    assert result["after"] == ("3", result["mine"])


def test_a_run_that_imports_pytorch_leaves_pytorchs_own_count(tmp_path: Path) -> None:
    fresh = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], check=True,
                           capture_output=True, text=True, timeout=120,
                           env={k: v for k, v in os.environ.items() if k != TORCH_THREADS_ENV})
    result = in_fresh_process(_first_import_by_the_run, str(tmp_path), limit=200)
    assert result["after"] == (None, int(fresh.stdout))
