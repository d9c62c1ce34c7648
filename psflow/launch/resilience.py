"""What the local launcher's watch loop does about failures: restart, detect hangs, inject chaos.

:class:`Resilience` bundles a :class:`~psflow.launch.supervisor.Supervisor`
(restart policy), a :class:`~psflow.launch.health.HealthMonitor` (hang
detection) and a :class:`~psflow.launch.chaos.ChaosInjector` (``--chaos``)
for one :class:`~psflow.launch.processes.LocalCluster`. The watch loop calls, in
each iteration (every 50 ms):

    1. :meth:`Resilience.on_exit` for each task that exited non-zero: True
       means "handled" (a restart is scheduled), False means "failed" (the
       loop stops the cluster and raises its failure report, to which
       :meth:`Resilience.on_failure` adds the injected faults and hang kills,
       also written to ``faults.json``);
    2. :meth:`Resilience.tick`: restarts tasks whose backoff passed (same
       command, same port; the new process replaces the old one in
       ``LocalCluster.tasks``, and its log continues the same file).

Chaos faults fire from their own thread, which reads global_step from the ps
tasks every 5 ms from the moment they start (so faults fire at their step
even before the launcher's client is connected). The same thread then records
each fault's recovery time (``recovery_seconds`` in metrics.json): from the
fault until global_step advances after the task's replacement started (for a
ps task: past the value the chief restored, not the restore's jump itself), or
until a replacement with nothing left to train exits 0; see
:mod:`psflow.launch.fault_recovery`. A fault whose task was not restarted has
none, unless it was a replicated shard's member whose shard went on (the
promoted backup replaced it). That recovery is also what lets the next round
of faults fire (their spacing is counted from the step it was seen at; see
:mod:`psflow.launch.chaos`), so a step jump after a restore of ps task 0 does
not fire every later fault at once. Its polls tell the health monitor which ps
members are up: each whose own ``Stats`` answered, as the process that ran under
its name when it was asked (:meth:`~psflow.launch.health.HealthMonitor.mark_up`).

Hang detection runs on its own thread (:meth:`Resilience.start`, stopped by
:meth:`Resilience.close`, which ``LocalCluster.stop_all`` calls), so a watch
loop blocked in a slow RPC does not delay it: every ``health.interval``
seconds it pings the running tasks' processes, and the process of a task
unresponsive for ``health.unresponsive_after`` seconds is SIGKILLed (that
process, never a replacement started since: :mod:`psflow.launch.hang_kill`),
so the restart policy (or the fail-fast report) then handles it like any death.

The default configuration changes nothing about today's behaviour except
hang detection: restart policy ``never``, no chaos.

A restart policy needs checkpoints: a ps task restarted empty is restored
from the newest one, and without one the run can only stop
(:mod:`psflow.train.state_loss`). So :func:`with_recovery_checkpoints` gives a
run with a restart policy and no ``--checkpoint-dir`` one inside its run
directory, ``<output>/checkpoints`` (the chief saves there when training
starts, then at the usual cadence), and says so in one console line; the
run's config.json records it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from psflow import jsonio
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.cluster import ClusterError, ClusterSpec, TaskId
from psflow.cluster.replicas import BACKUP_JOB, PS_JOB, ps_replicas, shard_of
from psflow.coord import CoordinationBackend, CoordinationError, create_backend
from psflow.launch.chaos import ChaosInjector, InjectedFault
from psflow.launch.chaos_plan import IN_GRAPH_CLIENT, ChaosPlan, DutyHolder, chief_task
from psflow.launch.fault_recovery import RecoveryWatch, Replacement, StepReading, final_reading, poll_reading
from psflow.launch.hang_kill import kill_hung
from psflow.launch.health import HealthConfig, HealthMonitor, TaskHealth
from psflow.launch.shard_targets import ask_statuses, shard_target
from psflow.launch.supervisor import RestartConfig, Supervisor
from psflow.rpc.api import PARAMETER_SERVICE, ConnectConfig
from psflow.rpc.grpc_client import TaskChannel
from psflow.status.replication import ps_members
from psflow.train.chief import trainer_task
from psflow.train.config import ConfigError, TrainConfig
from psflow.train.duties import coordination_config, elects_chief
from psflow.train.faults import read_task_config

__all__ = ["ResilienceConfig", "Resilience", "with_recovery_checkpoints", "DEFAULT_CHECKPOINT_SUBDIR"]

log = logging.getLogger("psflow.launch")

#: Seconds between two global_step reads of the chaos thread (a fault fires within this of its step,
#: plus one Stats round trip; a small data set trains at ~1 step per ms here).
_CHAOS_POLL = 0.005


@dataclass(frozen=True)
class ResilienceConfig:
    """Launcher settings for failures.

    Attributes:
        restart: restart policy (default ``never``: fail fast).
        health: hang detection timings; ``None`` turns it off.
        chaos: faults to inject.
        ps_replicas: backups of every ps shard (``--ps-replicas``; 0, the default: unreplicated, as before).
            Each backup is a task of job ``ps_backup`` (:mod:`psflow.cluster.replicas`), started, watched and
            restarted like a ps task.

    Raises:
        ConfigError: ``ps_replicas`` is negative (names ``--ps-replicas``).
    """

    restart: RestartConfig = field(default_factory=RestartConfig)
    health: HealthConfig | None = field(default_factory=lambda: HealthConfig(unresponsive_after=30.0))
    chaos: ChaosPlan = field(default_factory=ChaosPlan)
    ps_replicas: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.ps_replicas, bool) or not isinstance(self.ps_replicas, int) or self.ps_replicas < 0:
            raise ConfigError(f"--ps-replicas {self.ps_replicas!r}: want a whole number >= 0 (backups of each ps shard)")


class Resilience:
    """Failure handling for one local cluster; used by its watch loop only (not thread-safe)."""

    def __init__(self, lc: Any, config: ResilienceConfig, *, in_graph: bool = False) -> None:
        """Prepares supervisor, monitor and injector for ``lc`` (a LocalCluster); starts nothing.

        ``in_graph``: the run's client (``/job:client/task:0``) is a task faults may name, and its chief.

        Raises:
            ChaosError: a chaos fault names a task that is not in the cluster.
        """
        self.lc = lc
        self.config = config
        self.supervisor = Supervisor(config.restart, self._restart)
        self._chief = IN_GRAPH_CLIENT if in_graph else chief_task(lc.cluster)  # the configured chief
        self._replicated = ps_replicas(lc.cluster) > 0  # ps shards with backups: faults name shards
        # The ps tasks holding none of the variables (psflow.launch.idle_ps), set once the placement is known
        self.idle_ps: frozenset[str] = frozenset()
        self.injector = ChaosInjector(config.chaos, lc.cluster, self._find, holder=self._duty_holder,
                                      client=in_graph, member=self._shard_member,
                                      ended=self._ended) if config.chaos else None
        self.recovery = RecoveryWatch(self._replacement)  # of the faults fired; under self._lock
        self._coordination: CoordinationBackend | None = None  # asks who holds the chief lease (kill:chief)
        self._train_config: TrainConfig | None = None
        self._restarted_at: dict[str, float] = {}  # task -> wall time its current process was started by a restart
        self._gone_on: set[str] = set()  # shard members not restarted whose shard went on (under self._lock)
        self._stopped: list[Any] = []  # the processes (not pids: one may be reused) a stop fault hit; chaos thread
        self.monitor = None
        if config.health is not None:
            self.monitor = HealthMonitor(lc.cluster, token=lc.token, config=config.health,
                                         on_unresponsive=lambda health, _line: self._kill_hung(health))
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._chaos_thread: threading.Thread | None = None
        self.hang_kills: list[str] = []

    def start(self) -> None:
        """Starts the health monitor's and the chaos injector's threads (when configured); idempotent."""
        if self.monitor is not None:
            self.monitor.start(self._running)
        if self.injector is not None and self._chaos_thread is None:
            self._chaos_thread = threading.Thread(target=self._chaos_loop, name="psflow-chaos", daemon=True)
            self._chaos_thread.start()

    def close(self) -> None:
        """Stops both threads and drops the restarts still in their backoff (the tasks are being stopped: none is
        made, and the end reports none as made or under way: :meth:`Supervisor.cancel_pending`); idempotent."""
        self._closed.set()
        self.supervisor.cancel_pending("the run's tasks were stopped first")
        if self.monitor is not None:
            self.monitor.stop()
        if self._chaos_thread is not None:
            self._chaos_thread.join(timeout=5)

    def _chaos_loop(self) -> None:
        # Its own thread and channels: the launcher's client connects only after
        # the tasks start, and training on a small data set can outrun that.
        connect = ConnectConfig(connect_timeout=1.0, rpc_timeout=1.0, token=self.lc.token)
        channels = [TaskChannel(name, address, PARAMETER_SERVICE, connect) for name, address in ps_members(self.lc.cluster)]
        try:
            while (self.injector is not None and (self.injector.pending() or self.recovery.watching())
                   and not self._closed.wait(_CHAOS_POLL)):
                asked = self._running()  # the process under each name when asked: the one an answer is of
                with self._lock:  # a killed ps task's own Stats: readmitted (psflow.launch.fault_recovery)
                    watched = self.recovery.ps_tasks()
                reading = poll_reading(channels, replicated=self._replicated, also=watched)
                if reading is None:
                    continue
                if self.monitor is not None:  # each member whose own Stats answered serves: that process is up
                    self.monitor.mark_up({name: asked[name] for name in reading.answered if name in asked})
                self._observe(self._act(channels, reading), time.monotonic())
        finally:
            for ch in channels:
                ch.close()
            if self._coordination is not None:
                self._coordination.close()

    def _act(self, channels: list[TaskChannel], reading: StepReading) -> StepReading:
        """One poll of the chaos thread: fires with the trainers held (:meth:`_fire_held`) where a fault may fire
        now (a round comes due, or a begun round's target answers: :meth:`ChaosInjector.may_fire`), so no fault
        ever fires unheld; else only drops the faults left if training ended (holding the trainers at every
        poll would stop training every few ms). The unheld branch never polls: a poll asks the targets again
        (a shard's members, the chief lease), and one that answered between that ask and may_fire's would be
        hit unheld; it is hit at the next poll, held. Returns the reading the faults were decided on."""
        if self.injector is None:
            return reading
        if self.injector.may_fire(reading.step):
            return self._fire_held(channels, reading)
        with self._lock:
            if self._training_ended(reading):
                self.injector.training_ended(reading.step)
        return reading

    def _fire(self, reading: StepReading) -> list[InjectedFault]:
        """Drops the faults left if training ended, else fires those due (see :mod:`psflow.launch.chaos`)."""
        if self.injector is None:
            return []
        now = time.monotonic()
        with self._lock:
            if self._training_ended(reading):
                self.injector.training_ended(reading.step)
            fired = self.injector.poll(reading.step)
            for fault in fired:
                self.recovery.fired(fault, now, reading)
        return fired

    def _fire_held(self, channels: list[TaskChannel], reading: StepReading) -> StepReading:
        """Fires a due round with every training process (workers, chief, in-graph client) held by SIGSTOP
        for the moment of a fresh reading and the signals, and returns that reading.

        So whether training ended is decided on a state no worker can move past meanwhile: a fault is
        fired only while some worker has not finished its data, and that worker, resumed, finds the
        fault already there (a lingering worker waits for it, :meth:`ClusterRecovery.linger`), so the
        cluster is restored with every worker rewound; otherwise it is not fired. Without the hold, the
        last worker could pass its final check between the reading and the signal and leave, and the
        run's result would depend on that race. A task a ``stop`` fault hit stays stopped: one of this poll,
        and one of an earlier poll (not held, so not resumed: a begun round fires its other faults later).
        """
        held = [t for t in list(self.lc.tasks) if t.job in ("worker", "chief", IN_GRAPH_CLIENT[0])
                and t.exit_code is None and not any(t is s for s in self._stopped)]
        stopped: list[Any] = []  # each signalled through its process (send_signal): none reaped meanwhile, by pid
        fired: list[InjectedFault] = []
        try:
            for t in held:
                with contextlib.suppress(ProcessLookupError):
                    t.send_signal(signal.SIGSTOP)
                    stopped.append(t)
            _wait_stopped(stopped)
            reading = poll_reading(channels, replicated=self._replicated) or reading
            fired = self._fire(reading)
            tasks = list(self.lc.tasks)  # each process a stop hit: alive now (just signalled), so its pid is its own
            self._stopped += [t for f in fired if f.signal == signal.SIGSTOP.name
                              for t in tasks if t.name == f.task and t.pid == f.pid]
        finally:
            keep = {f.pid for f in fired if f.signal == signal.SIGSTOP.name}
            for t in stopped:
                if t.pid not in keep:
                    with contextlib.suppress(ProcessLookupError):  # a held one a kill fault hit, reaped since
                        t.send_signal(signal.SIGCONT)
        return reading

    def _training_ended(self, reading: StepReading) -> bool:
        """Every trainer finished its data, per the step task's count of ``Leave`` (chaos faults left are not
        fired): each chief and worker task; in an in-graph run its client alone (its workers run the client's
        steps and never leave; the client leaves once its data ended, before its final save and evaluation, as a
        between-graph worker does: :mod:`psflow.train.in_graph_client`; a restore forgets it, and its restart
        leaves again under the same name, counted once)."""
        cluster: ClusterSpec = self.lc.cluster
        trainers = 1 if self._chief == IN_GRAPH_CLIENT else sum(
            cluster.num_tasks(job) for job in ("chief", "worker") if job in cluster.jobs)
        return trainers > 0 and reading.finished >= trainers

    def _duty_holder(self) -> DutyHolder | None:
        """(The chaos thread, for ``kill:chief``) the task holding the chief duties now: the chief
        lease's holder where the workers elect one (None while nobody holds it), else the configured chief."""
        if self._train_config is None:
            try:
                with open(os.path.join(self.lc.output_dir, "config.json")) as f:
                    self._train_config = read_task_config(f.read())[0]
            except (OSError, ValueError) as e:  # no run config to read: the configured chief
                log.warning("chaos: cannot tell who holds the chief duties (%s); using the configured chief", e)
                return DutyHolder(*self._chief)
        config = self._train_config
        if not elects_chief(config):
            return DutyHolder(*self._chief)
        try:
            if self._coordination is None:
                coordination = coordination_config(config, self.lc.cluster, token=self.lc.token)
                self._coordination = create_backend(dataclasses.replace(coordination, rpc_timeout=1.0))
            leader = self._coordination.leader()
        except CoordinationError as e:
            log.debug("chaos: who holds the chief lease: %s", e)
            return None
        if leader is None:
            return None
        try:
            task = trainer_task(self.lc.cluster, TaskId.parse(leader.candidate).index)
        except ClusterError as e:
            log.warning("chaos: the chief lease's holder %r is no task of this cluster: %s", leader.candidate, e)
            return None
        if config.chief.coordination == "embedded" and leader.epoch < self._restarted_at.get(task.name, 0.0) * 1000:
            return None  # a lease granted before the task's process was restarted: its dead predecessor's
        return DutyHolder(task.job, task.index, leader.epoch)

    def _shard_member(self, job: str, shard: int) -> str | None:
        """(The chaos thread, replicated shards) the task a ``ps`` or ``ps-backup`` fault on ``shard`` hits now,
        asked of the shard's members (:mod:`psflow.launch.shard_targets`); None while there is none."""
        return shard_target(job, shard, ask_statuses(self.lc.cluster, shard, self.lc.token))

    def _observe(self, reading: StepReading | None, now: float) -> None:
        with self._lock:
            recovered = self.recovery.observe(reading, now)
        _say_recovered(recovered)

    def settle(self, ps_stats: list[dict[str, Any]]) -> None:
        """(The run's end, before its final snapshot) settles the faults' recovery with the snapshot's
        ``Stats`` of the ps tasks (:meth:`RecoveryWatch.settle`): a replacement that finished, or a step,
        after the chaos thread's last poll counts; with ``--ps-replicas`` the shard primaries' views are read
        too, so a restarted member not back in its shard's view is not recovered. Then every fault of the plan
        is listed, one line each (:meth:`ChaosInjector.summary`): fired, with its recovery or why it has none,
        or not fired and why."""
        with self._lock:
            recovered = self.recovery.settle(final_reading(ps_stats, replicated=self._replicated), time.monotonic())
            summary = self.injector.summary() if self.injector is not None else []
        _say_recovered(recovered)
        for line in summary:  # every fault of the plan, fired or not, and why: a schedule that did less says so
            log.warning("%s", line)

    def _replacement(self, name: str, old_pid: int) -> Replacement:
        for t in list(self.lc.tasks):
            if t.name == name and t.pid != old_pid:
                if t.exit_code is None:
                    return Replacement.RUNNING
                return Replacement.FINISHED if t.exit_code == 0 else Replacement.NONE
        # A shard member not restarted while its shard went on: the promoted backup replaced it.
        return Replacement.WENT_ON if name in self._gone_on else Replacement.NONE

    def _running(self) -> dict[str, Any]:
        """The tasks the monitor watches, each with its process (a hang is one process's: :mod:`~psflow.launch.health`)."""
        return {t.name: t for t in list(self.lc.tasks) if t.exit_code is None}

    def _find(self, job: str, index: int) -> Any:
        """The task's process where it runs (:meth:`~psflow.launch.processes.TaskProcess.exited`: an exit the
        watch loop has not recorded yet counts, so no fault is sent to a zombie's pid), else None."""
        for t in list(self.lc.tasks):
            if t.job == job and t.index == index and t.exited() is None:
                return t
        return None

    def _ended(self, job: str, index: int) -> str | None:
        """(The chaos thread) Why the task will not run again, where its process exited 0 (its work done: a task
        that exits 0 is never restarted); None otherwise (running, or exited otherwise: restarted or failing)."""
        for t in list(self.lc.tasks):
            if t.job == job and t.index == index and t.exited() == 0:
                return f"{t.name} (pid {t.pid}) exited 0 (its work done; a task that exits 0 is not restarted)"
        return None

    def _restart(self, task: Any) -> Any:
        self._restarted_at[task.name] = time.time()  # embedded lease epochs are wall-clock ms (kill:chief)
        new = self.lc.start_task(task.job, task.index, os.path.join(self.lc.output_dir, "config.json"))
        self.lc.tasks.remove(new)
        self.lc.tasks[self.lc.tasks.index(task)] = new  # replaces the dead one: the loop sees the live task
        task.log_file.close()
        if self.monitor is not None:
            self.monitor.forget(task.name)
        return new

    def on_exit(self, task: Any, *, refuse: str | None = None) -> bool:
        """A task exited non-zero: True if a restart is scheduled or the run goes on without it (a replicated
        shard's member while another member of its shard runs: :meth:`Supervisor.on_exit`), False if the run
        must fail (``refuse``: the reason it must, whatever the policy)."""
        live = None
        if self._replicated and task.job in (PS_JOB, BACKUP_JOB):
            live = functools.partial(self.lc.shard_running, shard_of(task.job, task.index, self.lc.cluster))
        decision = self.supervisor.on_exit(task, task.exit_code, refuse=refuse, shard_live=live,
                                           holds_nothing=task.name in self.idle_ps)
        if decision.goes_on:
            with self._lock:
                self._gone_on.add(task.name)
        return decision.restart or decision.goes_on

    @property
    def restarts(self) -> bool:
        """Whether the policy restarts a task that failed (not ``never``)."""
        return self.config.restart.policy != "never"

    def tick(self, client: Any) -> None:
        """Restarts tasks whose backoff passed; see the module docstring."""
        self.supervisor.restart_due()

    def _kill_hung(self, health: TaskHealth) -> None:  # on the monitor's thread
        """SIGKILLs the process the check saw hang, never another (:func:`~psflow.launch.hang_kill.kill_hung`:
        through its descriptor; one gone since, or replaced by a restart, is said so, not killed), and reports it
        in one line (the monitor logs nothing of it itself) that ``hangs`` records too."""
        line, killed = kill_hung(health, list(self.lc.tasks))
        log.log(logging.ERROR if killed else logging.WARNING, "%s", line)
        with self._lock:
            self.hang_kills.append(line)

    def on_failure(self) -> str:
        """The run failed: writes ``faults.json`` (as :meth:`metrics`) in the run directory and
        returns lines for the failure report: injected faults, hang kills, restarts (empty if none)."""
        try:
            with open(os.path.join(self.lc.output_dir, "faults.json"), "w") as f:
                jsonio.dump(self.metrics(), f, indent=1)
        except OSError as e:
            log.warning("could not write faults.json: %s", e)
        lines = []
        with self._lock:
            if self.injector is not None:
                lines += [f"chaos: {f.spec}: sent {f.signal} to {f.task} (pid {f.pid}) at global_step {f.at_step}"
                          for f in self.injector.injected]
            lines += [f"health: {line}" for line in self.hang_kills]
        lines += [f"supervisor: {e.task} (pid {e.pid}) {e.exit}: {e.decision}" for e in self.supervisor.events]
        return "".join("\n" + line for line in lines)

    def metrics(self) -> dict[str, Any]:
        """``faults``, ``restarts`` and ``hangs`` for metrics.json."""
        with self._lock:
            faults = [f.to_json() for f in self.injector.injected] if self.injector is not None else []
            not_fired = self.injector.not_fired_count() if self.injector is not None else 0
        return {
            "faults": faults,
            "faults_not_fired": not_fired,
            "restarts": [e.to_json() for e in self.supervisor.events],
            "hangs": self._hangs(),
        }

    def _hangs(self) -> list[str]:
        with self._lock:
            return list(self.hang_kills)


def _say_recovered(faults: list[InjectedFault]) -> None:
    for fault in faults:
        log.warning("chaos: %s: recovered at global_step %s, %.2f s after the fault", fault.spec,
                    fault.recovered_at_step, fault.recovery_seconds)


def _wait_stopped(tasks: list[Any], *, timeout: float = 1.0) -> None:
    """Waits until each task's process is stopped (:meth:`~psflow.launch.processes.TaskProcess.stopped`: every
    thread of it; or it exited, or was reaped): a SIGSTOP takes effect when its target next runs, not when the
    signal is sent. Bounded by ``timeout`` s. Each is asked through its process descriptor, never by pid, so a
    task reaped meanwhile (its pid free for a process psflow did not start) is not waited for and no other
    process's state is read as its."""
    deadline = time.monotonic() + timeout
    for t in tasks:
        while time.monotonic() < deadline and not t.stopped():
            time.sleep(0.0005)


#: Where a run with a restart policy and no --checkpoint-dir keeps its checkpoints, inside its run directory.
DEFAULT_CHECKPOINT_SUBDIR = "checkpoints"


def with_recovery_checkpoints(config: TrainConfig, resilience: ResilienceConfig, output_dir: str, *,
                              out: TextIO | None = None) -> TrainConfig:
    """The run's config with a checkpoint directory wherever a task may be restarted.

    Unchanged with ``--checkpoint-dir`` or restart policy ``never``. Otherwise ``checkpoint_dir``
    becomes ``<output_dir>/checkpoints`` (absolute), and one line saying so goes to ``out``: a ps
    task that dies is then restored from the newest checkpoint there (the one saved when training
    started, at worst), and at most the work since that checkpoint is redone. A directory an
    earlier run in ``output_dir`` left checkpoints in is resumed from, as ``--checkpoint-dir`` would be.
    """
    if config.checkpoint.dir or resilience.restart.policy == "never":
        return config
    directory = os.path.abspath(os.path.join(output_dir, DEFAULT_CHECKPOINT_SUBDIR))
    if out is not None:
        earlier = latest_checkpoint(directory) if os.path.isdir(directory) else None
        print(f"psflow: --restart-policy {resilience.restart.policy} without --checkpoint-dir: checkpoints go to "
              f"{directory}, so a ps task that dies is restored from the newest"
              + (f" (it holds an earlier run's: this run resumes from {os.path.basename(earlier)})" if earlier else ""),
              file=out, flush=True)
    return dataclasses.replace(config, checkpoint=dataclasses.replace(config.checkpoint, dir=directory))
