"""Expected errors are one line; gRPC's C-core stays quiet unless --verbose, set before grpc is imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from psflow.cli.main import main
from psflow.coord.api import CoordinationError, LeaseLostError
from psflow.data import BadRecordError, DataError
from psflow.errors import ConfigError, PsflowError
from psflow.launch.console import expected_in_task, quiet_grpc, wants_verbose
from psflow.optim import OptimizerSpec
from psflow.optim.schedules import ScheduleSpec
from psflow.optim.spec import OptimizerError
from psflow.placement import PlacementError, VariableSet, replica_device_setter
from psflow.ps.client import ClientError
from psflow.ps.global_step import StepJournal
from psflow.ps.optimizers import make_optimizer
from psflow.ps.protocol import RegisterRequest
from psflow.ps.save_hold import SaveHold
from psflow.ps.service import ParameterService
from psflow.ps.staleness import StalenessClock
from psflow.ps.store import ParameterStore, StoreError
from psflow.ps.sync import Contribution, SyncAggregator, SyncConfig
from psflow.rpc.api import (
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    ListenError,
    PreconditionFailed,
    RpcError,
    TaskUnavailableError,
    refusal,
)
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.hooks import NanLossError
from psflow.train.recovery import RecoveryError
from psflow.train.state_loss import StateLostError


def test_quiet_grpc_sets_none_unless_verbose_and_a_value_set_wins() -> None:
    env: dict[str, str] = {}
    quiet_grpc(env, verbose=False)
    assert env == {"GRPC_VERBOSITY": "NONE"}
    env = {}
    quiet_grpc(env, verbose=True)
    assert env == {}
    env = {"GRPC_VERBOSITY": "debug", "GRPC_TRACE": "http"}
    quiet_grpc(env, verbose=False)
    assert env == {"GRPC_VERBOSITY": "debug", "GRPC_TRACE": "http"}


def test_wants_verbose_reads_the_whole_flag_before_a_double_dash() -> None:
    assert wants_verbose(["train", "--train", "x", "--verbose"])
    assert not wants_verbose(["train", "--verb"])  # the parser refuses it: flags are matched whole
    assert not wants_verbose(["train", "--", "--verbose"])
    assert not wants_verbose(["train", "--quiet"])


def test_a_task_shows_psflow_errors_as_one_line_but_not_another_tasks_failure() -> None:
    one_line = [ConfigError("x"), DataError("x"), BadRecordError("a9a", "bad label"), ListenError("x"), NanLossError("x"),
                StateLostError("x"), StoreError("x"), ClientError("x"), PlacementError("x")]
    assert all(expected_in_task(e) for e in one_line)
    # Another task's failure seen from this one: the launcher names that task as the root cause, and this
    # task's log keeps the traceback. Anything that is not a PsflowError is a bug.
    traceback = [RpcError("x"), TaskUnavailableError("x"), DeadlineExceededError("x"), CoordinationError("x"),
                 LeaseLostError("x"), RecoveryError("x"), ValueError("x"), RuntimeError("x"), OSError("x"), KeyError("x")]
    assert not any(expected_in_task(e) for e in traceback)



def test_a_ps_tasks_refusal_of_the_learning_rate_schedule_is_one_line() -> None:
    """A ps task refuses the update at the step where the schedule's rate underflows for FTRL or overflows
    (psflow.ps.optimizer_base): the user's --learning-rate-schedule, not another task's failure. It reaches the
    worker as the message of an InvalidArgumentError, which ended the worker with a traceback's tail."""
    schedule = ScheduleSpec("exponential_decay", {"learning_rate": 0.1, "decay_steps": 1, "decay_rate": 0.5})
    with pytest.raises(OptimizerError) as refused:
        make_optimizer(OptimizerSpec("ftrl", {"learning_rate": schedule})).learning_rate(123)
    grows = ScheduleSpec("exponential_decay", {"learning_rate": 0.1, "decay_steps": 1, "decay_rate": 10.0})
    with pytest.raises(OptimizerError) as overflowed:
        make_optimizer(OptimizerSpec("sgd", {"learning_rate": grows})).learning_rate(60)
    for e in (refused.value, overflowed.value):
        assert expected_in_task(InvalidArgumentError(f"/job:ps/task:0: PushPull: {e}"))
    assert not expected_in_task(InvalidArgumentError("/job:ps/task:0: Push: gradient of 'w' has shape (3,), not (4,)"))


def test_a_step_failed_by_a_save_past_its_save_timeout_is_one_line() -> None:
    """A sync step (or an ssp wait) whose chief's save lasted longer than --save-timeout fails the waiting push
    naming the save and the flag (psflow.ps.save_hold): the user's --save-timeout or storage, not another task's
    failure. It ended the worker with a traceback's tail, which the launcher showed as the root cause."""
    now = [0.0]
    hold = SaveHold(lambda: now[0])
    hold.notice("/job:worker/task:0", "gs://b/ckpt", 10, True, bound=5.0)
    now[0] = 7.0
    why = hold.describe(["/job:worker/task:0"])
    assert "--save-timeout" in why
    for message in (f"sync step 10 timed out after 2.0 s with 1 of 2 gradients; missing: /job:worker/task:0{why}",
                    f"/job:worker/task:0 made no progress for 2.0 s (clock 9){why}"):
        assert expected_in_task(FailedPreconditionError(f"/job:ps/task:0: PushPull: /job:ps/task:0: {message}"))


def test_a_timed_out_sync_step_or_ssp_wait_is_one_line() -> None:
    """A sync step that timed out under --on-timeout fail (every later push of the run fails with it, until a
    restore), or an ssp worker declared lost: the user's --sync-timeout against a worker that died or hung. Each
    worker's exit, the restarted ones' too, ended with a traceback, whose tail the launcher showed as the root
    cause's log; now one line naming the ps task, the step and what timed out. Made with the ps modules' own words."""
    agg = SyncAggregator(SyncConfig(mode="sync", replicas_to_aggregate=2, total_num_replicas=2, timeout=0.01),
                         ParameterStore(), task_name="/job:ps/task:0", advance=lambda: 1, current=lambda: 10)
    with pytest.raises(PreconditionFailed) as timed_out:
        agg.contribute(10, Contribution("/job:worker/task:1", []))
    now = [0.0]

    def ticking() -> float:  # a second a reading: the wait below ends with its timeout, in no real time
        now[0] += 1.0
        return now[0]

    ssp = StalenessClock(SyncConfig(mode="ssp", total_num_replicas=2, staleness=0, timeout=2.0),
                         task_name="/job:ps/task:0", clock=ticking)
    with pytest.raises(PreconditionFailed) as lost:  # task:1 never moved past clock 0
        ssp.advance("/job:worker/task:0", 8)
    for e in (timed_out.value, lost.value):
        text = refusal("/job:ps/task:0", "PushPull", e).text
        assert "sync step 10 timed out" in text or "made no progress for 2.0 s" in text, text
        assert expected_in_task(FailedPreconditionError(text)), text
    assert not expected_in_task(FailedPreconditionError("/job:ps/task:0: Push: the lease of epoch 3 was lost"))

class _NewError(PsflowError):
    """Stands for any error psflow raises on purpose, one added after the command line was written included."""


def test_a_chiefs_register_refused_for_an_unwritable_global_step_journal_is_one_line(tmp_path: Path) -> None:
    """ps task 0 refuses the chief's Register when its global_step journal cannot be written (a full disk, its
    --state-dir gone: psflow.ps.service), logs one line and stays up: the chief's exit is the run's only report, the
    user's disk to fix, and it ended with a traceback under the launcher. Made by the ps service itself; any other
    refusal of a Register (another layout) still keeps its traceback."""
    state = tmp_path / "state"
    service = ParameterService(0, holds_global_step=True, step_journal=StepJournal(str(state / "global_step.json")))
    state.write_text("not a directory")  # the journal's next write fails
    vs = VariableSet(replica_device_setter(ps_tasks=1))
    vs.get_variable("w", (3,))
    chief = RegisterRequest(tuple(vs.placements()), OptimizerSpec("sgd", {"learning_rate": 1.0}), SyncConfig(),
                            "/job:worker/task:0", chief=True, defer_ready=True, run="run-b")
    with pytest.raises(FailedPreconditionError) as refused:
        InProcessChannel("/job:ps/task:0", service.handlers()).call(RegisterRequest.METHOD, chief.to_frame().meta)
    assert "cannot write the global_step journal" in str(refused.value)
    assert expected_in_task(refused.value), refused.value
    assert not expected_in_task(FailedPreconditionError(
        "/job:ps/task:0: Register: variable 'w' is registered with shape (3,), this client has (4,)"))


@pytest.fixture()
def shutdown_raising(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """``psflow shutdown`` raising the error put in the list (the command line's handling, not shutdown's)."""
    import psflow.cli.main

    errors: list[BaseException] = []

    def raise_it(args: object) -> int:
        raise errors[0]

    monkeypatch.setenv("GRPC_VERBOSITY", "NONE")  # main() sets it where unset: not in this test process for good
    monkeypatch.setattr(psflow.cli.main, "run_shutdown", raise_it)
    return errors


def test_the_command_shows_every_psflow_error_as_one_line(shutdown_raising: list[BaseException],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    shutdown_raising.append(_NewError("/job:ps/task:1: what is wrong, named"))
    assert main(["shutdown", "--insecure"]) == 1
    assert capsys.readouterr().err == "psflow shutdown: error: /job:ps/task:1: what is wrong, named\n"


def test_the_command_keeps_a_bugs_traceback(shutdown_raising: list[BaseException]) -> None:
    shutdown_raising.append(KeyError("step"))
    with pytest.raises(KeyError):
        main(["shutdown", "--insecure"])


def test_the_command_shows_an_os_refusal_of_its_own_calls_as_one_line(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GRPC_VERBOSITY", "NONE")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert main(["shutdown", "--insecure", "--cluster", "/nonexistent/psflow-cluster.json"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("psflow shutdown: error: [Errno 2] No such file or directory") and err.count("\n") == 1


def test_the_cli_module_does_not_import_grpc() -> None:
    """main() must set GRPC_VERBOSITY before grpc is imported (gRPC reads it then, once)."""
    code = "import sys, psflow.cli.main; print('grpc' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False", "a module-level import of psflow.cli.main imports grpc: import it in the " \
                                        "function that uses it (see the module docstring)"
