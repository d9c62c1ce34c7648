"""Shared test support: paths, the cluster token and ClusterHandle.

Lives in its own uniquely named module (not conftest.py) so that test modules
can import it reliably: several conftest.py files exist under tests/, and
``import conftest`` would resolve to whichever was loaded last.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

from psflow.cluster import ClusterSpec
from psflow.coord.api import DEFAULT_ELECTION, CoordinationBackend, LeaderInfo, Lease
from psflow.ps.client import ParameterClient
from psflow.ps.service import ParameterService

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
A9A = REPO / "data" / "a9a" / "a9a"
A9A_T = REPO / "data" / "a9a" / "a9a.t"
TOKEN = "test-token-0123456789"
T = TypeVar("T")


class TaskExited(AssertionError):
    """A task process exited before it served; ``log`` is its log."""

    def __init__(self, task: str, code: int, log: str) -> None:
        super().__init__(f"{task} exited ({code}) before it served:\n{log[-3000:]}")
        self.log = log

    @property
    def port_taken(self) -> bool:
        """Its picked port was bound by another process between the pick and the task's bind."""
        return "already in use" in self.log


@dataclass
class ClusterHandle:
    """Processes of a test cluster; ``procs[(job, index)]``."""

    cluster: ClusterSpec
    workdir: Path
    token: str
    procs: dict[tuple[str, int], subprocess.Popen[bytes]] = field(default_factory=dict)

    def log(self, job: str, index: int) -> str:
        path = self.workdir / f"{job}-{index}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self, tail: int = 3000) -> str:
        """The last ``tail`` characters of every started task's log, each under its name (failure messages)."""
        return "\n".join(f"--- {job} {index} (exit {proc.poll()}) ---\n{self.log(job, index)[-tail:]}"
                         for (job, index), proc in sorted(self.procs.items()))

    def wait_serving(self, index: int, limit: float = 120.0) -> None:
        """Blocks until ps task ``index`` logs that it serves at its address (psflow.server logs it once its
        ports are bound): this process, not whatever else might listen on the port.

        Raises:
            TaskExited: the process exited first (its log in the message), not a blind wait on a dead task.
            AssertionError: not serving within ``limit`` seconds (a safety net; a passing run never meets it).
        """
        proc = self.procs[("ps", index)]
        name = f"/job:ps/task:{index}"
        line = f"{name}: serving at {self.cluster.task_address('ps', index)} (pid {proc.pid})"
        deadline = time.monotonic() + limit
        while line not in self.log("ps", index):
            if proc.poll() is not None:
                raise TaskExited(name, proc.returncode, self.log("ps", index))
            assert time.monotonic() < deadline, f"{name} not serving within {limit:.0f} s\n{self.logs()}"
            time.sleep(0.05)

    def start(self, job: str, index: int, *extra: str) -> subprocess.Popen[bytes]:
        """(Re)starts one task process."""
        cluster_file = self.workdir / "cluster.json"
        cluster_file.write_text(self.cluster.to_json())
        out = open(self.workdir / f"{job}-{index}.log", "ab")
        env = dict(os.environ, PSFLOW_TOKEN=self.token, PYTHONUNBUFFERED="1")
        if job == "ps" and "--checkpoint-root" not in extra:  # tests save checkpoints under their tmp_path
            extra = (*extra, "--checkpoint-root", str(self.workdir))
        proc = subprocess.Popen(
            [sys.executable, "-m", "psflow.launch.task", "--cluster", str(cluster_file), "--job", job,
             "--task", str(index), *extra],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=str(REPO),
        )
        out.close()
        self.procs[(job, index)] = proc
        return proc

    def kill(self, job: str, index: int, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[(job, index)]
        if proc.poll() is None:
            os.kill(proc.pid, sig)
            proc.wait(timeout=10)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()


def run_bounded(cmd: list[str], *, timeout: float, cwd: Path = REPO,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Runs ``cmd`` in a process group of its own and captures its output (text).

    Past ``timeout`` the whole group (the command and every process it started) is SIGKILLed by
    its id, then TimeoutExpired is raised; whatever happens, nothing of the group outlives the call.
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(cwd), env=env,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def run_cli(*args: str, timeout: float = 200) -> subprocess.CompletedProcess[str]:
    """Runs the ``psflow`` command in a child process (bounded by ``timeout``, as :func:`run_bounded`)."""
    return run_bounded([sys.executable, "-m", "psflow", *args], timeout=timeout)


#: Sets psflow's stop signals (argv[1]: those to ignore, comma-separated numbers) and execs argv[2:].
_SIGNALS_THEN_EXEC = """
import os, signal, sys
ignored = {int(n) for n in sys.argv[1].split(",") if n}
for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)
os.execv(sys.argv[2], sys.argv[2:])
"""


def with_stop_signals(cmd: list[str], *, ignored: tuple[int, ...] = ()) -> list[str]:
    """``cmd`` (its first item a path, e.g. ``sys.executable``), started by a tiny Python wrapper that sets SIGTERM,
    SIGHUP and SIGINT to their default action but those in ``ignored``, which it ignores (``SIG_IGN``, as ``nohup``
    leaves SIGHUP), and then execs ``cmd``: an ignored signal stays ignored across ``exec``, exactly as the command
    inherits it from ``nohup``. Whatever this pytest process ignores, the command starts as asked (no preexec_fn
    runs in this process, which has threads)."""
    return [sys.executable, "-c", _SIGNALS_THEN_EXEC, ",".join(str(int(sig)) for sig in ignored), *cmd]


def wait_until(condition: Callable[[], T | None], what: str, limit: float = 120.0) -> T:
    """Polls ``condition`` every 0.1 s until it returns a true value (returned); fails naming ``what``.

    ``limit`` is a safety net, never reached by a passing run: no test depends on how fast the machine is.
    """
    deadline = time.monotonic() + limit
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {limit:.0f} s (safety net): {what}")
        time.sleep(0.1)


def in_fresh_process(case: Callable[..., T], *args: Any, limit: float = 90.0) -> T:
    """Runs ``case(*args)`` in a child of multiprocessing's fork server and returns its result (pickled back).

    For tests that fork (:mod:`psflow.data.reader_process`): a fork from the pytest process copies whatever
    earlier tests left running there, gRPC's threads included, and gRPC is not fork-safe (the forked reader
    died of SIGSEGV). The fork server is a fresh interpreter, started once per session; each case runs in a
    fork of it, so what earlier tests did never matters. ``case`` is a module-level function; its module is
    imported in the child with its directory first on ``sys.path``, as pytest does (its ``conftest`` imports
    resolve to its own directory's). The case's exception fails the caller with the child's traceback.
    ``limit`` is a safety net, never reached by a passing run.
    """
    module = sys.modules[case.__module__]
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["numpy", "psflow.data"])  # imported once, in the server (from its first start)
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_run_case, args=(str(module.__file__), case.__module__, case.__qualname__, args,
                                                 send), name=f"fresh-{case.__name__}")  # not a daemon: it forks
    child.start()
    send.close()
    try:
        if not recv.poll(limit):
            raise AssertionError(f"{case.__name__} not done within {limit:.0f} s (safety net) in pid {child.pid}")
        try:
            ok, value = recv.recv()
        except EOFError:
            child.join(timeout=10)
            raise AssertionError(f"{case.__name__}: its process (pid {child.pid}) died: exit code "
                                 f"{child.exitcode}") from None
    finally:
        recv.close()
        child.join(timeout=10)
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)
            child.join()
    if not ok:
        raise AssertionError(f"{case.__name__} failed in a fresh process:\n{value}")
    result: T = value
    return result


def _run_case(path: str, module_name: str, qualname: str, args: tuple[Any, ...], out: Connection) -> None:
    """In the fresh process: imports the case's module (its directory first) and sends (ok, result or traceback).

    The case starts with the stop signals at their default action (SIGINT: Python's KeyboardInterrupt), as a
    command started from a terminal: a signal this pytest process inherited ignored (a run under ``nohup``, or as
    a background job of a script, which ignores SIGINT) is inherited by the fork server, and psflow leaves an
    inherited ignore in place (:mod:`psflow.launch.stop_signals`)."""
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.path.insert(0, os.path.dirname(path))
        case = importlib.import_module(module_name)
        for part in qualname.split("."):
            case = getattr(case, part)
        out.send((True, case(*args)))
    except BaseException:  # noqa: BLE001 - every failure goes to the test, which raises it
        out.send((False, traceback.format_exc()))
    finally:
        out.close()


def registered_ps_task() -> ParameterService:
    """An in-process ps task 0 of two, holding global_step, with ``w`` (10 x 2,
    partitioned in 2, constant 1.0, SGD at 0.5) registered by a chief client ``w0``."""
    from psflow.optim import OptimizerSpec
    from psflow.placement import VariableSet, fixed_size_partitioner, replica_device_setter
    from psflow.rpc.framing import Frame

    vs = VariableSet(replica_device_setter(cluster=ClusterSpec({"ps": ["10.231.0.1:1", "10.231.0.2:1"]})))
    vs.get_variable("w", (10, 2), partitioner=fixed_size_partitioner(2), initializer={"name": "constant", "value": 1.0})
    svc = ParameterService(0, holds_global_step=True)
    svc.register(Frame({"layout": [p.to_json() for p in vs.placements()],
                        "optimizer": OptimizerSpec("sgd", {"learning_rate": 0.5}).to_json(), "client": "w0",
                        "chief": True}))
    return svc


def one_ps_chief(client_name: str = "chief") -> tuple[ParameterClient, ParameterService]:
    """An in-process ps task 0 (the only one, holding global_step) with ``w`` (4 x 2), and the chief's client
    ``client_name`` of it, registered (SGD at 0.1)."""
    from psflow.optim import OptimizerSpec
    from psflow.placement import VariableSet, replica_device_setter
    from psflow.rpc.inprocess import InProcessChannel

    cluster = ClusterSpec({"ps": ["127.0.0.1:1"]})
    variables = VariableSet(replica_device_setter(cluster=cluster))
    variables.get_variable("w", (4, 2))
    service = ParameterService(0, holds_global_step=True)
    client = ParameterClient(cluster, variables.placements(), client_name=client_name,
                             channels={0: InProcessChannel("/job:ps/task:0", service.handlers())})
    client.register(OptimizerSpec("sgd", {"learning_rate": 0.1}), chief=True)
    return client, service


class HeldLeases(CoordinationBackend):
    """A coordination backend double for the election tests: a lease it granted stays held until it lapses,
    renewals keep it as it is, and it knows no leader. A test names how ``campaign`` grants (the one abstract
    method left)."""

    def renew(self, lease: Lease) -> Lease:
        return lease

    def is_held(self, lease: Lease) -> bool:
        return lease.remaining() > 0

    def resign(self, lease: Lease) -> None:
        pass

    def leader(self, election: str = DEFAULT_ELECTION) -> LeaderInfo | None:
        return None

    def close(self) -> None:
        pass

