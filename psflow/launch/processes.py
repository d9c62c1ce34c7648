"""The processes of one local cluster: started, watched and ended here, by pid.

:class:`LocalCluster` starts one process per task (``python -m psflow.launch.task``) in its own process
group, each with a lifeline (:mod:`psflow.launch.lifeline`) and its log file, and ends every one of them by
pid (SIGTERM, then SIGKILL, to the task's own group) whatever happens, KeyboardInterrupt included. As a
context manager on the main thread it turns SIGTERM, SIGHUP and SIGINT into
:class:`~psflow.launch.lifeline.LaunchInterrupted` (but one it inherited ignored, which stays ignored, by
it and by the tasks it starts: :mod:`psflow.launch.stop_signals`). :class:`TaskHosts` says where each task
runs (a seam for harnesses that put each task in its own network namespace); :func:`failure_report` names
the failed tasks, the first one as the root cause.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TextIO

from psflow.cluster import ClusterSpec
from psflow.cluster.replicas import BACKUP_JOB, PS_JOB, shard_members
from psflow.errors import PsflowError
from psflow.launch.console import quiet_grpc
from psflow.launch.exits import ProcessDescriptor, exit_status, stopped
from psflow.launch.lifeline import LauncherSignals, LaunchInterrupted, Lifeline, signal_name
from psflow.launch.ports import free_ports
from psflow.launch.resilience import Resilience
from psflow.launch.run_end import RunEnd
from psflow.launch.supervisor import describe_exit
from psflow.launch.task import TOKEN_ENV
from psflow.ps.global_step import StepJournal
from psflow.ps.save_ledger import SAVE_LEDGER_FILE
from psflow.server import STEP_JOURNAL_FILE
from psflow.train.config import TORCH_THREADS_ENV

__all__ = ["LaunchError", "LocalCluster", "TaskHosts", "TaskProcess", "failure_report", "task_env"]

log = logging.getLogger("psflow.launch")


class LaunchError(PsflowError, RuntimeError):
    """A task of a local cluster failed; the message names the root cause."""

    #: The launcher starts the cluster again after it: no failure of the run (a taken port: ``PortTaken``).
    starts_again: ClassVar[bool] = False


@dataclass(frozen=True)
class TaskHosts:
    """Where the tasks of a local cluster run; the default is every task on 127.0.0.1.

    A seam for harnesses that put each task on its own address, e.g. in its
    own network namespace (tests/netns.py): ``hosts[(job, index)]`` is the
    host part of the task's cluster address (the task listens there, so it
    must be one of the addresses the task's process sees), and
    ``prefixes[(job, index)]`` goes before the task's command (e.g.
    ``("ip", "netns", "exec", "ns1")``; it must exec the command, keeping its
    pid and open file descriptors, as ``ip netns exec`` does). Ports are still
    picked free on this machine. The launcher reaches every task at its
    cluster address, so each must be reachable from here.
    """

    hosts: Mapping[tuple[str, int], str] = field(default_factory=dict)
    prefixes: Mapping[tuple[str, int], tuple[str, ...]] = field(default_factory=dict)

    def host(self, job: str, index: int) -> str:
        return self.hosts.get((job, index), "127.0.0.1")

    def prefix(self, job: str, index: int) -> list[str]:
        return list(self.prefixes.get((job, index), ()))

    def with_backups(self, num_ps: int, replicas: int) -> TaskHosts:
        """This placement with a host for every ``ps_backup`` task it does not place itself: a shard's backups
        go to hosts other than its primary's (and than each other's) where the placement has such hosts.

        ``ps_backup`` task j is a backup of shard ``j % num_ps`` (:mod:`psflow.cluster.replicas`). Each host
        named here (with its prefix) is a candidate, in the order first named; a backup takes the candidate
        that carries the fewest of this shard's members, then the fewest backups so far, then the first named.
        With one host (or none: every task on 127.0.0.1), every backup is there too. Pure; unchanged when
        ``replicas`` is 0 or every backup is placed already.
        """
        candidates: dict[str, tuple[str, ...]] = {}
        for key, host in self.hosts.items():
            candidates.setdefault(host, tuple(self.prefixes.get(key, ())))
        if replicas <= 0 or not candidates:
            return self
        hosts, prefixes = dict(self.hosts), dict(self.prefixes)
        load = {h: 0 for h in candidates}  # backups placed on each host so far
        for j in range(num_ps * replicas):
            if (BACKUP_JOB, j) in hosts:
                continue
            shard = j % num_ps
            members = [self.host("ps", shard)] + [hosts.get((BACKUP_JOB, k), "127.0.0.1")
                                                    for k in range(shard, j, num_ps)]
            order = list(candidates)
            host = min(order, key=lambda h: (members.count(h), load[h], order.index(h)))
            load[host] += 1
            hosts[(BACKUP_JOB, j)] = host
            if candidates[host]:
                prefixes[(BACKUP_JOB, j)] = candidates[host]
        return TaskHosts(hosts, prefixes)


@dataclass
class TaskProcess:
    """One started task process.

    ``incarnation``: which start of its task this process is (1: the first, 2: its first restart...;
    :meth:`LocalCluster.start_task` counts them), named where a report tells it from the processes after it.

    ``descriptor``: its process descriptor (:meth:`~psflow.launch.exits.ProcessDescriptor.open`, opened as it was
    started), through which :meth:`send_signal` signals it and :meth:`exited` and :meth:`stopped` ask it; None where
    the system has none. Closed by :meth:`close_descriptor` (:meth:`LocalCluster.poll` once it recorded the exit,
    :meth:`LocalCluster.stop_all` once it reaped every task), else when this object is collected. So a launcher
    holds one per task process not reaped and recorded yet, however many it started (restarts, chaos drills, tasks
    kept in lists).
    """

    job: str
    index: int
    popen: subprocess.Popen[bytes]
    log_path: str
    log_file: TextIO
    exit_code: int | None = None
    exited_at: float | None = None
    error_path: str | None = None  # where the task writes an expected error's one line (--error-file)
    descriptor: ProcessDescriptor | None = field(default=None, repr=False, compare=False)
    incarnation: int = 1

    def __post_init__(self) -> None:
        if self.descriptor is not None:
            weakref.finalize(self, self.descriptor.close)  # where close_descriptor never ran (closes once)

    @property
    def pidfd(self) -> int | None:
        """The number of its process descriptor while open; None where there is none, and once closed."""
        return self.descriptor.fd if self.descriptor is not None else None

    def close_descriptor(self) -> None:
        """Closes :attr:`descriptor` (idempotent; a signal from another thread then raises ProcessLookupError).
        Called once the process was reaped: a signal could not reach it any more."""
        if self.descriptor is not None:
            self.descriptor.close()

    @property
    def name(self) -> str:
        return f"/job:{self.job}/task:{self.index}"

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exited(self) -> int | None:
        """Its exit code: the one :meth:`LocalCluster.poll` recorded, else the process's own, None while it runs. An
        exit not recorded yet (a zombie) counts, and is left for the watch loop to reap and record
        (:func:`~psflow.launch.exits.exit_status`: never reaped here). A thread other than the watch loop's (the
        chaos thread) asks this, not ``exit_code``, before it signals the task (:meth:`send_signal`)."""
        return self.exit_code if self.exit_code is not None else exit_status(self.popen, self.descriptor)

    def stopped(self) -> bool:
        """Whether the process no longer runs: stopped (a SIGSTOP took effect on every thread), exited or reaped
        (:func:`~psflow.launch.exits.stopped`: asked through :attr:`descriptor`, never of a pid another process may
        have taken since; nothing reaped). Any thread may ask."""
        return self.exit_code is not None or stopped(self.popen, self.descriptor)

    def send_signal(self, sig: int) -> None:
        """Sends ``sig`` to this task's process, never to another: through :attr:`descriptor`, which names this process
        alone, so once the watch loop reaped it (its pid free for any process) the signal fails. Any thread may
        call it. Where there is no descriptor, by pid while ``Popen`` has not reaped it (a reap on the watch
        loop's thread between that check and the signal is not excluded there).

        Raises:
            ProcessLookupError: the process was reaped (or is gone).
        """
        if self.descriptor is not None:
            if not self.descriptor.send_signal(sig):  # closed: reaped and recorded
                raise ProcessLookupError(f"{self.name} (pid {self.popen.pid}) was reaped (exit status "
                                         f"{self.popen.returncode})")
        elif self.popen.returncode is None:
            os.kill(self.popen.pid, sig)
        else:
            raise ProcessLookupError(f"{self.name} (pid {self.popen.pid}) was reaped (exit status {self.popen.returncode})")

    def error_record(self) -> dict[str, Any] | None:
        """What the task wrote for an expected error (:func:`psflow.launch.task.expected_failure`: ``message``,
        ``type``, ``port_taken``...), or None: no error file, or not a JSON object."""
        if self.error_path is None:
            return None
        try:
            with open(self.error_path, encoding="utf-8") as f:
                record = json.load(f)
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def error_line(self) -> str | None:
        """The one line the task wrote for an expected error (a bad record, a bad flag), or None."""
        message = (self.error_record() or {}).get("message")
        return message if isinstance(message, str) and message else None

    def tail(self, lines: int = 15) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


@dataclass
class LocalCluster:
    """Processes of one local cluster; use as a context manager.

    As a context manager on the main thread it also handles SIGTERM, SIGHUP
    and SIGINT (see the module docstring); leaving it stops every task.
    """

    cluster: ClusterSpec
    output_dir: str
    token: str
    tasks: list[TaskProcess] = field(default_factory=list)
    resilience: Resilience | None = None  # restarts, hang detection, chaos (psflow.launch.resilience)
    verbose: bool = False  # tasks: gRPC's C-core logs, tracebacks of expected errors (psflow.launch.console)
    signals: LauncherSignals = field(default_factory=LauncherSignals, repr=False)
    started: float = field(default_factory=time.monotonic, repr=False)
    _lifeline: Lifeline | None = field(default=None, repr=False)
    placement: TaskHosts = field(default_factory=TaskHosts)  # each task's address host and command prefix
    # What a signal to the launcher ends the run with (returns the report); default: report_interrupt.
    on_interrupt: Callable[[int], str] | None = field(default=None, repr=False)
    _starts: dict[tuple[str, int], int] = field(default_factory=dict, repr=False)  # processes started per task

    @classmethod
    def create(cls, num_ps: int, num_workers: int, output_dir: str, *,
               placement: TaskHosts | None = None, ps_replicas: int = 0,
               signals: LauncherSignals | None = None) -> LocalCluster:
        """Picks free ports, writes ``output_dir/cluster.json``; starts nothing.

        ``signals``: the run's, where it starts a cluster again (:mod:`psflow.launch.port_retry`); default a new one.

        ``ps_replicas``: N > 0 adds job ``ps_backup`` with ``num_ps * N`` tasks, the shards' backups
        (:mod:`psflow.cluster.replicas`), placed by :meth:`TaskHosts.with_backups`; 0: no such job.
        """
        placement = (placement or TaskHosts()).with_backups(num_ps, ps_replicas)
        backups = num_ps * max(0, ps_replicas)
        ports = free_ports(num_ps + num_workers + backups)
        jobs = {
            "ps": [f"{placement.host('ps', i)}:{p}" for i, p in enumerate(ports[:num_ps])],
            "worker": [f"{placement.host('worker', i)}:{p}" for i, p in enumerate(ports[num_ps:num_ps + num_workers])],
        }
        if backups:
            jobs[BACKUP_JOB] = [f"{placement.host(BACKUP_JOB, j)}:{p}"
                                for j, p in enumerate(ports[num_ps + num_workers:])]
        spec = ClusterSpec(jobs)
        os.makedirs(os.path.join(output_dir, "logs"), exist_ok=True)
        # A reused run directory's global_step journals are an earlier run's: their floor would send this run's
        # restores on past that run's last step (psflow.ps.global_step); a restart within this run keeps them.
        for journal in glob.glob(os.path.join(glob.escape(output_dir), "state", "*", STEP_JOURNAL_FILE)):
            for path in (journal, StepJournal(journal).live_path):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)
        with open(os.path.join(output_dir, "cluster.json"), "w") as f:
            f.write(spec.to_json())
        lc = cls(spec, output_dir, secrets.token_hex(16), placement=placement)
        lc.signals = signals if signals is not None else lc.signals
        return lc

    def start_task(self, job: str, index: int, config_path: str) -> TaskProcess:
        """Starts ``python -m psflow.launch.task`` for one task (its next :attr:`TaskProcess.incarnation`)."""
        log_path = os.path.join(self.output_dir, "logs", f"{job}-{index}.log")
        log_file = open(log_path, "a")
        env = task_env(os.environ, token=self.token, workers=self.cluster.num_tasks("worker"),
                       cpus=os.cpu_count() or 1, verbose=self.verbose)
        error_path = os.path.join(self.output_dir, f"error-{job}-{index}.json")
        with contextlib.suppress(FileNotFoundError):
            os.remove(error_path)  # a restarted task's previous error is not this one's
        cmd = [
            *self.placement.prefix(job, index), sys.executable, "-m", "psflow.launch.task",
            "--cluster", os.path.join(self.output_dir, "cluster.json"),
            "--job", job, "--task", str(index), "--config", config_path,
            "--result", os.path.join(self.output_dir, f"result-{job}-{index}.json"), "--error-file", error_path,
            "--supervised",  # the watch loop restarts a dead task or stops the run
        ] + (["--verbose"] if self.verbose else [])
        state_dir = os.path.join(self.output_dir, "state", f"{job}-{index}")
        if job in (PS_JOB, BACKUP_JOB):  # global_step's bound outlives a restart of its holder (psflow.ps.global_step)
            cmd += ["--state-dir", state_dir]
        if job == PS_JOB:  # and so do the checkpoint ledger's counts (psflow.ps.save_ledger), for this run only
            ledger = os.path.join(state_dir, SAVE_LEDGER_FILE)
            if not any(t.job == job and t.index == index for t in self.tasks):  # not a restart: a reused run dir's
                with contextlib.suppress(FileNotFoundError):
                    os.remove(ledger)
            cmd += ["--save-ledger", ledger]
        if self._lifeline is None:
            self._lifeline = Lifeline()
        cmd += ["--lifeline", str(self._lifeline.task_fd)]
        if threading.current_thread() is threading.main_thread():
            # PR_SET_PDEATHSIG fires when the *thread* that started the task exits: only the main
            # thread lives as long as this process. From another thread, the pipe alone watches.
            cmd.append("--exit-with-parent")
        with self.signals.deferring():  # started and recorded, or neither: a signal waits for both
            popen = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, pass_fds=(self._lifeline.task_fd,), process_group=0)
            # its descriptor now, before any thread can reap it (TaskProcess.send_signal)
            incarnation = self._starts[(job, index)] = self._starts.get((job, index), 0) + 1
            task = TaskProcess(job, index, popen, log_path, log_file, error_path=error_path,
                               descriptor=ProcessDescriptor.open(popen.pid), incarnation=incarnation)
            self.tasks.append(task)
        log.debug("started %s as pid %d", task.name, popen.pid)
        return task

    def poll(self) -> list[TaskProcess]:
        """Records exits; returns tasks that exited since the last poll."""
        now, newly = time.monotonic(), []
        for t in self.tasks:
            if t.exit_code is None:
                code = t.popen.poll()
                if code is not None:
                    t.exit_code, t.exited_at = code, now
                    t.close_descriptor()  # reaped: nothing to signal through it
                    newly.append(t)
        return newly

    def shard_running(self, shard: int) -> tuple[int, list[str]]:
        """(Replicated ps shards) ``shard`` and those of its members whose process runs, in member order. Asks each
        process (``Popen.poll``: an exit :meth:`poll` has not recorded yet counts), and again 0.2 s later where
        some run, so that members killed in the same moment (one chaos round) are seen dead."""
        def running() -> list[str]:
            names = {t.name for t in list(self.tasks) if t.popen.poll() is None}
            return [name for name in shard_members(self.cluster, shard) if name in names]
        if running():
            time.sleep(0.2)
        return shard, running()

    def stop_all(self, grace: float = 3.0) -> None:
        """Ends every task still running: SIGTERM, then SIGKILL after ``grace`` s, each to the task's
        process group (the task and what it started); then closes the lifeline. Blocks until every
        task is reaped; idempotent."""
        if self.resilience is not None:
            self.resilience.close()
        running = [t for t in self.tasks if t.popen.poll() is None]
        for t in running:
            _signal_group(t, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for t in running:
            try:
                t.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(t, signal.SIGKILL)
                t.popen.wait()
        for t in self.tasks:  # every one reaped now
            t.log_file.close()
            t.close_descriptor()
        if self._lifeline is not None:
            self._lifeline.close()
            self._lifeline = None

    def report_interrupt(self, signum: int) -> str:
        """After ``signum`` reached the launcher: stops every task, writes ``metrics.json`` (and
        ``faults.json``) from the run's final snapshot, and returns the report for the user. Blocks
        ~``grace`` s at most. ``run_local`` ends its runs through :attr:`on_interrupt` instead (its
        snapshot has the checkpoint ledger, and status.json and metrics.prom are written from it too)."""
        return RunEnd(self, self.output_dir, started=self.started).interrupted(signum)

    def __enter__(self) -> LocalCluster:
        self.signals.install()  # main thread only (else a no-op)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        late: LaunchInterrupted | None = None
        try:
            with self.signals.deferring(check=False):  # no signal cuts the cleanup
                if isinstance(exc, LaunchInterrupted):
                    exc.report = (self.on_interrupt or self.report_interrupt)(exc.signum)
                self.stop_all()
                if not isinstance(exc, LaunchInterrupted):  # one that came during the cleanup: raised as one a
                    try:  # moment earlier (a PortTaken's start is not retried; an end written stands, said), but
                        # after a failure no end was taken for: said, the failure stands (_failure_stands)
                        self.signals.check()
                    except LaunchInterrupted as e:
                        if _failure_stands(exc, e):
                            print(f"psflow: {signal_name(e.signum)} arrived while the tasks of a failed run were "
                                  "stopped: its failure stands; every task stopped", file=sys.stderr, flush=True)
                        else:
                            late = e
                            late.report = (self.on_interrupt or self.report_interrupt)(late.signum)
        finally:
            if late is None and isinstance(exc, LaunchError) and exc.starts_again:
                self.signals.park()  # started again (port_retry): a signal before that is the next start's
            else:
                self.signals.restore()
        if late is not None:
            raise late from exc


def _failure_stands(exc: BaseException | None, interrupt: LaunchInterrupted) -> bool:
    """Whether ``interrupt`` (a signal that came while the tasks were stopped after ``exc``) leaves ``exc`` to end
    the launch: the run failed (an error, not a start made again: :attr:`LaunchError.starts_again`) before any end
    of it was taken (a task not started, the model refused); its error and exit status 1 stand, as without the
    signal, not ``128 + n``. A failed run's end taken (:meth:`~psflow.launch.run_end.RunEnd.failed`) is the
    signal's to report: its status, and its error in the report."""
    if not isinstance(exc, Exception) or interrupt.final is not None:
        return False
    return not (isinstance(exc, LaunchError) and exc.starts_again)


def task_env(base: Mapping[str, str], *, token: str, workers: int, cpus: int, verbose: bool) -> dict[str, str]:
    """The environment of a task process the launcher starts: ``base`` (the launcher's), the cluster token,
    unbuffered output, gRPC's C-core logs off unless ``verbose``, and each task's share of the cores for its
    thread pools. Pure; a value ``base`` sets wins.

    The worker processes share this machine's cores: PyTorch models get one intra-op pool each of
    ``cpus // workers`` threads (:data:`~psflow.train.config.TORCH_THREADS_ENV`, psflow.torch.configure_threads),
    and NumPy's OpenBLAS the same (``OPENBLAS_NUM_THREADS``, unless ``OMP_NUM_THREADS`` or it is set). Left
    to itself, OpenBLAS starts a thread per core in every process when NumPy is imported (~0.04 CPU-s per
    task process on 2 cores, idle ones spinning) for BLAS calls that a task makes few or none of.
    """
    env = dict(base, **{TOKEN_ENV: token, "PYTHONUNBUFFERED": "1"})
    threads = str(max(1, cpus // max(1, workers)))
    env.setdefault(TORCH_THREADS_ENV, threads)
    if "OMP_NUM_THREADS" not in env:
        env.setdefault("OPENBLAS_NUM_THREADS", threads)
    quiet_grpc(env, verbose=verbose)
    return env


def _signal_group(task: TaskProcess, sig: int) -> None:
    """Sends ``sig`` to the process group of ``task`` (its own: started with ``process_group=0``).

    Called only while ``task`` is not reaped, so its pid, the group's id, is not reused."""
    try:
        os.killpg(task.popen.pid, sig)
    except ProcessLookupError:
        pass


def failure_report(failed: list[TaskProcess], stopped: list[TaskProcess]) -> str:
    """Each failed task (the first as the root cause) with its one-line error, or, where it wrote none
    (an unexpected error), the first one's log tail; then the tasks stopped after the failure."""
    first = failed[0]
    lines = [f"{first.name} (pid {first.popen.pid}) {describe_exit(first.exit_code or 0)}: root cause; log: {first.log_path}"]
    error = first.error_line()
    if error is not None:
        lines.append(f"  {error}")
    else:
        lines += ["  last lines of its log:", *("    " + line for line in first.tail().rstrip().splitlines())]
    for t in failed[1:]:
        lines.append(f"then {t.name} (pid {t.popen.pid}) {describe_exit(t.exit_code or 0)}; log: {t.log_path}")
        error = t.error_line()
        if error is not None:
            lines.append(f"  {error}")
    for t in stopped:
        lines.append(f"stopped {t.name} (pid {t.popen.pid}) after the failure")
    return "\n".join(lines)
