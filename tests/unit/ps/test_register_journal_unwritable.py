"""A chief's Register that ps task 0 cannot record in its global_step journal (psflow/ps/service.py ``register``:
:meth:`~psflow.ps.global_step.GlobalStep.claim` cannot write the file) is refused with one line naming ps task 0 and
the journal file, as a conflict with the task's state (FAILED_PRECONDITION), not as a bug (INTERNAL, "internal
error", a traceback in the ps task's log). In-process service behind an in-process channel (the same dispatch as
over a network); the journal's directory is replaced by a file after the task started, so its next write fails.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.global_step import StepJournal
from psflow.ps.protocol import RegisterRequest
from psflow.ps.service import ParameterService
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import FailedPreconditionError, FencedOffError, RemoteError
from psflow.rpc.inprocess import InProcessChannel

pytestmark = pytest.mark.timeout(60)

TASK = "/job:ps/task:0"


def test_a_register_whose_run_the_journal_cannot_record_is_refused_in_one_line_naming_the_file(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "state"
    journal = StepJournal(str(state / "global_step.json"))
    service = ParameterService(0, holds_global_step=True, step_journal=journal)
    state.write_text("not a directory")  # the journal's directory cannot be made: its write fails
    vs = VariableSet(replica_device_setter(ps_tasks=1))
    vs.get_variable("w", (3,))
    chief = RegisterRequest(tuple(vs.placements()), OptimizerSpec("sgd", {"learning_rate": 1.0}), SyncConfig(),
                            "/job:worker/task:0", chief=True, defer_ready=True, run="run-b")
    channel = InProcessChannel(TASK, service.handlers())
    with caplog.at_level(logging.INFO):
        with pytest.raises((FailedPreconditionError, RemoteError)) as refused:  # RemoteError: INTERNAL, before
            channel.call(RegisterRequest.METHOD, chief.to_frame().meta)
    error = refused.value
    assert type(error) is FailedPreconditionError and not isinstance(error, (RemoteError, FencedOffError)), error
    text = str(error)
    assert text.startswith(f"{TASK}: Register: cannot write the global_step journal {state / 'global_step.json'}: ")
    assert "internal error" not in text and "\n" not in text
    assert "run run-b not registered" in text
    lines = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(lines) == 1 and lines[0].exc_info is None, [r.getMessage() for r in lines]  # one line, no traceback
    assert TASK in lines[0].getMessage() and str(state / "global_step.json") in lines[0].getMessage()

