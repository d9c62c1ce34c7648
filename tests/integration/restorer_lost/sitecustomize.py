"""Loses the worker that restored the cluster within the run, once its restore is done and before it tells its hooks
(for tests/integration/test_summary_start_restorer_lost.py; on a process's path only where a test puts this directory
on PYTHONPATH). In the process whose ``ClusterRecovery.restore`` returns first (the chief lease's holder, which
restored every ps task at a new generation), SIGKILL to itself: the cluster settles with no worker holding the
lease, and the lease passes to another worker once it lapses. ``PSFLOW_TEST_RESTORER_DIES`` is a file's path,
created by the one process that dies (so a restarted worker, or a later restore, runs unchanged). Every other
process runs unchanged.
"""

from __future__ import annotations

import os
import signal
from typing import Any

_MARK = os.environ.get("PSFLOW_TEST_RESTORER_DIES")

if _MARK:
    from psflow.train import recovery

    _restore = recovery.ClusterRecovery.restore

    def _restore_then_die(self: Any, *args: Any, **kwargs: Any) -> None:
        _restore(self, *args, **kwargs)
        try:
            os.close(os.open(_MARK, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        os.kill(os.getpid(), signal.SIGKILL)

    recovery.ClusterRecovery.restore = _restore_then_die  # type: ignore[method-assign]
