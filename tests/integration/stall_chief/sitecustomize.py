"""Stops worker 0 (SIGSTOP, by itself) at one point of its run's end, so that a test can take it for gone and
resume it (SIGCONT) when it chooses (for tests/integration/test_chief_stalled_at_end.py; on a process's path only
where a test puts this directory on PYTHONPATH). ``PSFLOW_TEST_STALL`` names the point:

* ``after_last_push``: its data ended and it sent ``Leave``: it has pushed its last step, and its session's end
  (final checkpoint, final evaluation) is still to come.

Any other process (ps tasks, other workers) runs unchanged.
"""

from __future__ import annotations

import os
import signal
from typing import Any

_POINT = os.environ.get("PSFLOW_TEST_STALL")


def _stop() -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


if _POINT == "after_last_push":
    from psflow.train import recovery

    _linger = recovery.ClusterRecovery.linger

    def _stalled_linger(self: Any, num_workers: int, **kwargs: Any) -> Any:
        if self.client.client_name == "/job:worker/task:0":
            _stop()
        return _linger(self, num_workers, **kwargs)

    recovery.ClusterRecovery.linger = _stalled_linger  # type: ignore[method-assign]
