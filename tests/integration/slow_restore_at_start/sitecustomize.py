"""Holds a chief for 1 s between its restore at start's loads and its ``SetReady`` (for
tests/integration/test_chaos_during_restore_at_start.py; on a process's path only where a test puts this directory on
PYTHONPATH, with ``PSFLOW_TEST_SLOW_RESTORE_AT_START=1``).

:func:`psflow.checkpoint.restore.restore` is wrapped before any psflow module binds it: its first call in a process
(a worker's restore at start, as the elected chief) returns after 1 s more. Meanwhile ps task 0 holds the
checkpoint's global_step and is not ready, so the launcher's chaos thread reads that step and a fault due by then
fires on that reading, every time rather than where a 5 ms poll happens to land in the restore's few ms.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

# A task process (``python -m psflow.launch.task --job ...``: its argv[0] is still '-m' while site runs).
if os.environ.get("PSFLOW_TEST_SLOW_RESTORE_AT_START") == "1" and "--job" in sys.argv:
    import psflow.checkpoint.restore as _restore_module

    _original = _restore_module.restore
    _calls: list[int] = []

    def _held_restore(*args: Any, **kwargs: Any) -> Any:
        result = _original(*args, **kwargs)
        _calls.append(1)
        if len(_calls) == 1:
            time.sleep(1.0)
        return result

    _restore_module.restore = _held_restore  # type: ignore[assignment]
