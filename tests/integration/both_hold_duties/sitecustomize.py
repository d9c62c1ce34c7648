"""Makes two workers finishing together both hold the chief duties at their own end, every time (for
tests/integration/test_evaluator.py; on a process's path only where a test puts this directory on PYTHONPATH).

A worker whose data ended waits for the others (``ClusterRecovery.linger``) and hands the duties on if it sees one
still training. Here each first waits until ps task 0 lists every worker as finished, so neither sees the other
training: neither hands them on, and both hold them at their own end, one after the other (the race that two
workers reaching --max-steps together meet now and then under load).
"""

from __future__ import annotations

import time
from typing import Any

from psflow.train import recovery

_linger = recovery.ClusterRecovery.linger


def _linger_once_all_finished(self: Any, num_workers: int, **kwargs: Any) -> Any:
    while len(self.client.ps_stats().finished or ()) < num_workers:
        time.sleep(0.02)
    return _linger(self, num_workers, **kwargs)


recovery.ClusterRecovery.linger = _linger_once_all_finished  # type: ignore[method-assign]
