"""Makes the ``psflow train`` launcher's every write of a ``metrics.json`` fail as on a full disk (OSError ENOSPC),
the other files written as usual (for tests/integration/test_metrics_json_unwritable.py; on a process's path only where a
test puts this directory on PYTHONPATH). Task processes (which also read this file) are left alone."""

from __future__ import annotations

import errno
import sys
from typing import Any

if "train" in sys.argv and "psflow.launch.task" not in " ".join(sys.argv):
    from psflow import storage

    _write = storage.write_atomically

    def _full_disk(path: str, *args: Any, **kwargs: Any) -> None:
        if path.endswith("metrics.json"):
            raise OSError(errno.ENOSPC, "No space left on device", path)
        _write(path, *args, **kwargs)

    storage.write_atomically = _full_disk
