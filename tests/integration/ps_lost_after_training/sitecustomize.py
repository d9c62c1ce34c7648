"""Loses a ps task after the run's training ended, before the launcher's final evaluation (for
tests/integration/test_ps_lost_after_training.py; on a process's path only where a test puts this directory on
PYTHONPATH). In the launcher only (the process whose ``psflow.launch.local._watch`` returns: every driver task
exited 0, so the chief's final checkpoint is written), ps task ``PSFLOW_TEST_LOSE_PS`` is killed (SIGKILL, by its
pid) and started again as the launcher starts a task: a fresh, empty process that nobody restores (no chief is
left). Every other process runs unchanged.
"""

from __future__ import annotations

import os
import signal
from typing import Any

_INDEX = os.environ.get("PSFLOW_TEST_LOSE_PS")

if _INDEX is not None:
    from psflow.launch import local

    _watch = local._watch

    def _watch_then_lose_a_ps_task(lc: Any, *args: Any, **kwargs: Any) -> None:
        _watch(lc, *args, **kwargs)
        index = int(_INDEX or 0)
        task = next(t for t in reversed(lc.tasks) if t.job == "ps" and t.index == index)
        os.kill(task.pid, signal.SIGKILL)
        task.popen.wait(timeout=30)
        lc.start_task("ps", index, os.path.join(lc.output_dir, "config.json"))

    local._watch = _watch_then_lose_a_ps_task
