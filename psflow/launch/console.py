"""What the command line shows when something is wrong: one line per expected error, gRPC's C-core quiet.

* **Expected errors** are the errors psflow raises on purpose, every :class:`~psflow.errors.PsflowError`
  (bad flags, inputs, records, schemas, checkpoints, a port in use): each names the flag, file, record,
  task or port, so the ``psflow`` command prints it as one line, with no traceback (``--verbose`` adds
  it); so it does an ``OSError`` of its own short-lived calls (a ``--cluster`` file not found). A task
  process does the same for the errors :func:`expected_in_task` accepts. Anything else is a bug and
  keeps its traceback.
* **gRPC's C-core log lines** (``E0000 ... GOAWAY received``) go to stderr from C, past Python's
  logging, and gRPC reads its settings once, when ``grpc`` is imported. :func:`quiet_grpc` sets them in
  an environment: in the ``psflow`` command's own (:func:`psflow.cli.main.main`, before anything
  imports ``grpc``) and in every task's (:meth:`psflow.launch.processes.LocalCluster.start_task`).

This module imports nothing that imports ``grpc``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import MutableMapping, Sequence

from psflow.errors import PsflowError

__all__ = ["GRPC_VERBOSITY_ENV", "ONE_LINE_ERRORS", "expected_in_task", "quiet_grpc", "wants_verbose"]

#: gRPC's minimum log severity (its C-core: DEBUG, INFO, ERROR, NONE), read when ``grpc`` is imported.
GRPC_VERBOSITY_ENV = "GRPC_VERBOSITY"

#: What the ``psflow`` command prints as one line (:func:`psflow.cli.main.main`): every error psflow raises
#: on purpose, and the operating system's refusal of one of the command's own calls (``--cluster`` naming no
#: file, an output directory it may not write).
ONE_LINE_ERRORS: tuple[type[Exception], ...] = (PsflowError, OSError)


def quiet_grpc(env: MutableMapping[str, str], *, verbose: bool) -> None:
    """Unless ``verbose``: sets ``GRPC_VERBOSITY=NONE`` in ``env`` (gRPC's C-core prints nothing; every
    failure still reaches psflow as an :class:`~psflow.rpc.api.RpcError`). A value already in ``env``
    wins, and with ``verbose`` gRPC keeps its own defaults; ``GRPC_TRACE`` passes through either way
    (its lines print only at a verbosity other than NONE).

    Takes effect for a process that imports ``grpc`` after it (its own, or a child started with ``env``).
    """
    if not verbose:
        env.setdefault(GRPC_VERBOSITY_ENV, "NONE")


def wants_verbose(argv: Sequence[str]) -> bool:
    """Whether ``argv`` asks for ``--verbose``: read before the parser exists, because building it
    imports ``grpc`` (after which :func:`quiet_grpc` is too late for this process)."""
    args = list(argv)
    if "--" in args:
        args = args[: args.index("--")]
    return "--verbose" in args  # flags are matched whole (psflow.cli.parser.CommandParser)


def expected_in_task(error: BaseException) -> bool:
    """Whether a task process ends on ``error`` with one line (:func:`psflow.launch.task.main`): a
    :class:`~psflow.errors.PsflowError`, the user's to fix (a bad record or setting, a loss no longer finite,
    a port in use, a ps task's variables lost with no checkpoint to restore them from), except another
    task's failure seen from this one: a remote call that failed (an :class:`~psflow.rpc.api.RpcError`
    other than :class:`~psflow.rpc.api.ListenError`), the coordination service
    (:class:`~psflow.coord.api.CoordinationError`), the cluster not restored in time
    (:class:`~psflow.train.recovery.RecoveryError`). The launcher reports that other task's exit as the
    root cause; this task's log keeps the traceback. An ``OSError`` is not expected here either. But a ps task's
    refusal of the user's ``--learning-rate-schedule`` at the step its rate stops being usable
    (:meth:`psflow.ps.optimizer_base.Optimizer.learning_rate`) is the user's to fix, one line, and so is a sync
    step or ssp wait failed because the chief's save lasted longer than ``--save-timeout``
    (:mod:`psflow.ps.save_hold`): the line names the save and the flag (the chief, stuck in its save, never
    fails on its own). So is a sync step that timed out under ``--on-timeout fail``, or an ssp worker declared
    lost (:func:`_timed_out`): every worker's push fails with it until a restore, the restarted ones' at once,
    and each exit showed a traceback; the line names the ps task, the step (the clock) and what timed out,
    and the launcher still names the first task that failed as the root cause. So is the chief's ``Register``
    refused because ps task 0 cannot write its global_step journal (:func:`_journal_unwritable`: a full disk, its
    ``--state-dir`` gone): ps task 0 logs one line and stays up, so the chief's exit is the only report; the line
    names the task and the file.
    """
    if not isinstance(error, PsflowError):
        return False
    from psflow.coord.api import CoordinationError
    from psflow.rpc.api import ListenError, RpcError

    if isinstance(error, RpcError):
        return (isinstance(error, ListenError) or _schedule_refused(error) or _save_past_its_timeout(error)
                or _timed_out(error) or _journal_unwritable(error))
    # Not imported, so not raised: a ps task never imports the trainer's modules, not even while it ends.
    recovery = sys.modules.get("psflow.train.recovery")
    others = (CoordinationError,) if recovery is None else (CoordinationError, recovery.RecoveryError)
    return not isinstance(error, others)


def _schedule_refused(error: BaseException) -> bool:
    """Whether ``error`` is a ps task's refusal of a push at a step where the run's schedule's rate is not usable
    (it travels as an InvalidArgumentError's message, which names the flag; tests/unit/launch/test_console.py
    makes it with the optimizers' own words)."""
    from psflow.rpc.api import InvalidArgumentError

    return isinstance(error, InvalidArgumentError) and "(--learning-rate-schedule) is " in str(error)


def _save_past_its_timeout(error: BaseException) -> bool:
    """Whether ``error`` is a ps task's refusal of a push whose sync step (or ssp wait) a chief's save held past its
    --save-timeout (:meth:`psflow.ps.save_hold.SaveHold.describe`'s words: tests/unit/launch/test_console.py)."""
    from psflow.rpc.api import FailedPreconditionError

    return isinstance(error, FailedPreconditionError) and "longer than its --save-timeout (" in str(error)


#: A ps task's words for a sync step that timed out (psflow.ps.sync) and an ssp worker declared lost
#: (psflow.ps.staleness), as a refusal carries them: tests/unit/launch/test_console.py makes them with those modules.
_TIMED_OUT = re.compile(r"sync step \d+ timed out after [\d.]+ s with \d+ of \d+ gradients"
                        r"|/job:\w+/task:\d+ made no progress for [\d.]+ s \(clock \d+\)")


def _timed_out(error: BaseException) -> bool:
    """Whether ``error`` is a ps task's refusal of a push whose sync step timed out, or whose ssp wait declared a
    worker lost (``--sync-timeout`` with ``--on-timeout fail``)."""
    from psflow.rpc.api import FailedPreconditionError

    return isinstance(error, FailedPreconditionError) and _TIMED_OUT.search(str(error)) is not None


#: ps task 0's words for a chief's Register it refused because its global_step journal cannot be written
#: (psflow.ps.service, ``register``): tests/unit/launch/test_console.py makes them with that service.
_JOURNAL_UNWRITABLE = re.compile(r"; run .+ not registered: /job:\w+/task:\d+ must record it there before it hands "
                                 r"out the run's global_step values")


def _journal_unwritable(error: BaseException) -> bool:
    """Whether ``error`` is ps task 0's refusal of the chief's ``Register`` whose run its global_step journal cannot
    record (the file cannot be written: the user's disk or ``--state-dir``, named in the line)."""
    from psflow.rpc.api import FailedPreconditionError

    return isinstance(error, FailedPreconditionError) and _JOURNAL_UNWRITABLE.search(str(error)) is not None
