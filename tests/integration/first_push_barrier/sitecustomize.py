"""Holds each worker's first push until every worker of the run has read its parameters and computed its first
gradient (for tests/integration/test_restore_loss_at_end.py; on a process's path only where a test puts this
directory on PYTHONPATH). ``PSFLOW_TEST_FIRST_PUSH_BARRIER=DIR:N``: a worker task process (``--job worker``) about
to make its first push (``ParameterClient.push_pull`` or ``push_detailed``) writes ``DIR/worker-I`` and waits
until N such files exist (at most 200 s; then it pushes all the same, and the test's check of the files fails).

So in a sync run no step is applied before every worker has read the step it tags its push with: with N workers
and ``--replicas-to-aggregate`` below N, the first step's pushes beyond those aggregated are stale, whatever the
machine's speed. Without it, a worker started late (its process starting on a loaded machine) may find the run's
``--max-steps`` done by the others, which never push a stale gradient between two (each step: theirs alone).
Other processes (the launcher, the ps tasks) are left as they are.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

_SPEC = os.environ.get("PSFLOW_TEST_FIRST_PUSH_BARRIER", "")
_held: list[bool] = []


def _worker_index() -> str | None:
    args = sys.argv
    if "--job" in args and "--task" in args and args[args.index("--job") + 1] == "worker":
        return args[args.index("--task") + 1]
    return None


def _wait_for_every_worker(directory: str, count: int, index: str) -> None:
    if _held:
        return
    _held.append(True)
    with open(os.path.join(directory, f"worker-{index}"), "w") as f:
        f.write(str(os.getpid()))
    deadline = time.monotonic() + 200.0
    while time.monotonic() < deadline:
        if sum(name.startswith("worker-") for name in os.listdir(directory)) >= count:
            return
        time.sleep(0.02)


if _SPEC and (_INDEX := _worker_index()) is not None:
    from psflow.ps import client

    _DIR, _COUNT = _SPEC.rsplit(":", 1)

    def _held_first(method: Any) -> Any:
        def held(self: Any, *args: Any, **kwargs: Any) -> Any:
            _wait_for_every_worker(_DIR, int(_COUNT), str(_INDEX))
            return method(self, *args, **kwargs)

        return held

    client.ParameterClient.push_pull = _held_first(client.ParameterClient.push_pull)  # type: ignore[method-assign]
    client.ParameterClient.push_detailed = _held_first(  # type: ignore[method-assign]
        client.ParameterClient.push_detailed)
