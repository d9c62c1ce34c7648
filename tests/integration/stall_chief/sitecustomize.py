"""Stops worker 0 (SIGSTOP, by itself) at one point of its run's end, so that a test can take it for gone and
resume it (SIGCONT) when it chooses (for tests/integration/test_chief_stalled_at_end.py; on a process's path only
where a test puts this directory on PYTHONPATH). ``PSFLOW_TEST_STALL`` names the point:

* ``after_last_push``: its data ended and it sent ``Leave``: it has pushed its last step, and its session's end
  (final checkpoint, final evaluation) is still to come;
* ``mid_final_eval``: in its first evaluation (the final one where the run evaluates only at its end), after it
  asked ps task 0 whether the final model was evaluated already;
* ``in_save_lock``: inside a save's locked section (the checkpoint directory's mutex held, its pointer about to be
  switched), at its first save once the file ``PSFLOW_TEST_STALL_FILE`` names exists (the test creates it when
  it wants the stop).

Any other process (ps tasks, other workers) runs unchanged.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

_POINT = os.environ.get("PSFLOW_TEST_STALL")


def _worker_0() -> bool:
    argv = f" {' '.join(sys.argv)} "
    return " --job worker " in argv and " --task 0 " in argv


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

elif _POINT == "mid_final_eval":
    from psflow.train import ready_eval

    _evaluate = ready_eval.evaluate
    _stalled: list[bool] = []

    def _stalled_evaluate(*args: Any, **kwargs: Any) -> Any:
        if _worker_0() and not _stalled:
            _stalled.append(True)
            _stop()
        return _evaluate(*args, **kwargs)

    ready_eval.evaluate = _stalled_evaluate  # type: ignore[assignment]

elif _POINT == "in_save_lock":
    from psflow.checkpoint import pointer

    _write_pointer = pointer.write_pointer
    _trigger = os.environ["PSFLOW_TEST_STALL_FILE"]
    _stopped_once: list[bool] = []

    def _stalled_write_pointer(*args: Any, **kwargs: Any) -> Any:
        if _worker_0() and not _stopped_once and os.path.exists(_trigger):
            _stopped_once.append(True)
            _stop()
        return _write_pointer(*args, **kwargs)

    pointer.write_pointer = _stalled_write_pointer
