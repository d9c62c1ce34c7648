"""Loses ps tasks after the run's training ended, before the launcher's final evaluation (for
tests/integration/test_ps_lost_after_training.py and test_ps_lost_not_restarted.py; on a process's path only where
a test puts this directory on PYTHONPATH). In the launcher only (the process whose ``psflow.launch.local._watch``
returns: every driver task exited 0, so the chief's final checkpoint is written), each task of
``PSFLOW_TEST_LOSE_PS`` (a ps index, or a comma-separated list of ``job:index``: ``ps:1,ps_backup:1``) is killed
(SIGKILL, by its pid) and, unless ``PSFLOW_TEST_LOSE_RESTART`` is ``0``, started again as the launcher starts a
task: a fresh, empty process that nobody restores (no chief is left). With ``0`` it stays dead, as under
``--restart-policy never`` (the launcher's watch of the training, which restarts tasks, has returned). Every
other process runs unchanged.
"""

from __future__ import annotations

import os
import signal
from typing import Any

_LOSE = os.environ.get("PSFLOW_TEST_LOSE_PS")

if _LOSE is not None:
    from psflow.launch import local

    _watch = local._watch

    def _watch_then_lose_ps_tasks(lc: Any, *args: Any, **kwargs: Any) -> None:
        _watch(lc, *args, **kwargs)
        for spec in (_LOSE or "0").split(","):
            job, index = spec.split(":") if ":" in spec else ("ps", spec)
            task = next(t for t in reversed(lc.tasks) if t.job == job and t.index == int(index))
            os.kill(task.pid, signal.SIGKILL)
            task.popen.wait(timeout=30)
            if os.environ.get("PSFLOW_TEST_LOSE_RESTART") != "0":
                lc.start_task(job, int(index), os.path.join(lc.output_dir, "config.json"))

    local._watch = _watch_then_lose_ps_tasks
