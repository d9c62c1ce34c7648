"""``Server``: the gRPC endpoint of one task, as ``tf.distribute.Server`` is.

A ``ps`` task serves the :class:`~psflow.ps.service.ParameterService` (its
variables, optimizer slots and, on ps task 0, global_step). In a cluster with a
``ps_backup`` job (replicated shards, :mod:`psflow.ps.replication`) a ``ps`` or
``ps_backup`` task serves its shard's service with replication: the members of
shard k hold the partitions placed on ps task k, and the primary forwards every
change to the backups. The embedded coordination backend's lease table lives
on ps task 0; in a replicated cluster every member of shard 0 serves it, the
shard's primary answers and carries it to the backups with the shard's other
changes (:mod:`psflow.ps.replication.leases`). A ``worker`` or
``chief`` task serves a small WorkerService (liveness and status), so every
task of a cluster can be reached at its address.

Lifecycle: built and started by the constructor (``start=True``, as TF does);
:meth:`Server.join` blocks until the server stops, which happens on
:meth:`Server.stop` or on a ``Shutdown`` request from a client of the cluster,
and, for a ps task built with ``stop_when_run_over`` (what ``psflow server``
does unless ``--keep-serving``), once the run is over: every training worker
of the cluster has sent ``Done`` (:mod:`psflow.ps.run_end`, which says when a
worker sends it). The task then logs ``<task>: run over (workers 0-1
finished, final checkpoint ckpt-... written): exiting`` and stops. In a replicated shard only the
primary hears the workers' ``Done``; once every backup holds the last one, it stops the shard's other
members first (each logs ``<task>: stopped by <primary>, its shard's primary: the run is over``), so
backups started by hand exit too; a member started with ``stop_when_run_over`` False (``--keep-serving``)
serves on, as a primary would. A backup promoted after some workers' ``Done`` holds them (replicated with
the shard), so it ends the run as its primary would have.

Security: with a ``token`` every call (gRPC and the TCP carrier) must carry
it, ``Shutdown`` included; without one the server logs a WARNING when it
starts and reports ``"authentication": "off"`` in its ``Ping`` and ``Stats``
replies (``psflow server`` refuses to run so unless given ``--insecure``).
A ps task writes checkpoint shards (``SaveShard`` with a path) only under its
``checkpoint_root``; without one it writes none (shards then travel in the
reply: ``--checkpoint-transport rpc``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from psflow.cluster import ClusterSpec, TaskId
from psflow.cluster.replicas import BACKUP_JOB, PS_JOB, member_address, ps_replicas, shard_of
from psflow.coord.lease_table import COORDINATION_SERVICE, LeaseTable
from psflow.ps.failover import refused
from psflow.ps.global_step import StepJournal
from psflow.ps.protocol import Ack
from psflow.ps.replication import ReplicationConfig, ShardReplication
from psflow.ps.replication.after_acked import AfterAcked
from psflow.ps.run_end import training_workers
from psflow.ps.service import ParameterService
from psflow.rpc.api import PARAMETER_SERVICE, WORKER_SERVICE, CarrierServer, ConnectConfig, Handler, Reply, RpcError, ServeConfig
from psflow.rpc.framing import Frame
from psflow.rpc.registry import open_channel, serve
from psflow.rpc.tcp import TCP_PORT_KEY, TRANSPORT_METHOD
from psflow.rpc.tcp_server import TcpLimits
from psflow.rpc.tls import TlsConfig

__all__ = ["Server", "STEP_JOURNAL_FILE", "step_journal"]

#: The file in a ps task's ``state_dir`` that keeps global_step's bound.
STEP_JOURNAL_FILE = "global_step.json"


def step_journal(state_dir: str | None, job_name: str, holds_step: bool) -> StepJournal | None:
    """global_step's journal (:mod:`psflow.ps.global_step`) in ``state_dir``, on a task of shard 0 (``holds_step``):
    ps task 0 and, replicated, shard 0's backups, which hand values out once promoted and follow their primary's
    meanwhile, so whichever member a restore after the whole shard's loss finds, its floor bounds the values the
    shard handed out. None on any other task, or without ``state_dir``."""
    if not state_dir or not holds_step or job_name not in (PS_JOB, BACKUP_JOB):
        return None
    return StepJournal(os.path.join(state_dir, STEP_JOURNAL_FILE))
#: A ``Shutdown``'s meta key: the shard primary whose run is over, stopping the other members (_stop_after_run).
_RUN_OVER_BY = "run_over_by"

log = logging.getLogger(__name__)


class Server:
    """An in-process server for one task of a cluster.

    >>> cluster = ClusterSpec({"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]})
    >>> server = Server(cluster, "ps", 0)          # doctest: +SKIP
    >>> server.target                              # doctest: +SKIP
    'grpc://127.0.0.1:2222'
    >>> server.join()                              # doctest: +SKIP  (blocks: what a ps task does)
    """

    def __init__(
        self,
        cluster: ClusterSpec | Mapping[str, Sequence[str] | Mapping[int, str]],
        job_name: str,
        task_index: int,
        *,
        start: bool = True,
        token: str | None = None,
        bind_address: str | None = None,
        max_workers: int = 64,
        worker_handlers: Mapping[str, Handler] | None = None,
        tls: TlsConfig | None = None,
        state_dir: str | None = None,
        checkpoint_root: str | None = None,
        tcp_limits: TcpLimits | None = None,
        stop_when_run_over: bool = False,
        save_ledger_file: str | None = None,
    ) -> None:
        """Builds the server of task ``/job:<job_name>/task:<task_index>``.

        Args:
            cluster: the cluster, as a :class:`ClusterSpec` or its dict form.
            job_name: ``ps``, ``worker`` or ``chief``.
            task_index: the task's index in its job.
            start: start serving now (as TF does by default).
            token: cluster token every incoming call must carry (``None``: none).
            bind_address: listen here instead of the task's address in the
                cluster (e.g. ``0.0.0.0:2222`` behind NAT).
            max_workers: concurrent handler threads (sync pushes each hold one while
                they wait for the step, so allow at least the number of workers).
            worker_handlers: extra WorkerService methods (e.g. ``RunStep`` for
                in-graph replication).
            tls: serve over TLS (:class:`~psflow.rpc.tls.TlsConfig` with this
                task's certificate and key); ``None``: plain text.
            state_dir: where the ps task holding global_step keeps its bound
                (``global_step.json``) so that, restarted, it never hands out a
                step value twice; put it on storage that outlives the process.
                ``None``: not kept (after a restart of ps task 0, step values
                since the restored checkpoint repeat).
            checkpoint_root: (ps tasks) the only directory under which
                ``SaveShard`` writes shard files (symlinks resolved; ``..`` and
                other directories refused); ``None``: no shard files at all.
            tcp_limits: timeouts and connection limits of the ps task's TCP
                carrier (default :class:`~psflow.rpc.tcp_server.TcpLimits`).
            stop_when_run_over: (ps tasks) stop once every training worker of the
                cluster sent ``Done`` (see :mod:`psflow.ps.run_end`); False: serve
                until stopped (the local launcher, which reads the ps tasks after
                the workers finish, stops them itself).
            save_ledger_file: (the ps task holding global_step, unreplicated) where its checkpoint ledger
                outlives a restart (:class:`~psflow.ps.save_ledger.SaveLedger`); the local launcher's, scoped
                to one run. ``None``: in memory only.

        Raises:
            ClusterError: the job or task is not in the cluster.
            ListenError: the address cannot be bound (a RuntimeError; names the port and why).
            StepJournalError: the global_step journal in ``state_dir`` is damaged.
        """
        self.cluster = cluster if isinstance(cluster, ClusterSpec) else ClusterSpec(cluster)
        self.task = TaskId(job_name, task_index)
        address = self.cluster.task_address(job_name, task_index)  # raises for unknown tasks
        self._stopped = threading.Event()
        self.parameter_service: ParameterService | None = None
        self.replication: ShardReplication | None = None
        self._after_acked = AfterAcked()
        self._keep_serving = not stop_when_run_over
        services: dict[str, Mapping[str, Handler]] = {}
        self._ps_handlers: dict[str, Handler] = {}
        replicated = ps_replicas(self.cluster) > 0 and job_name in (PS_JOB, BACKUP_JOB)
        if job_name == "ps" or replicated:
            shard = shard_of(job_name, task_index, self.cluster) if replicated else task_index
            holds_step = shard == min(self.cluster.task_indices("ps"))
            journal = step_journal(state_dir, job_name, holds_step)
            self.parameter_service = ParameterService(
                shard, holds_global_step=holds_step, on_shutdown=self.stop, step_journal=journal,
                checkpoint_root=checkpoint_root, confine_shards=True, training_workers=training_workers(self.cluster),
                on_run_over=self._run_over if stop_when_run_over else None, extra_stats=self._extra_stats,
                save_ledger_file=save_ledger_file if holds_step and not replicated else None,
            )
            # One table for both carriers, so that Stats says the same over gRPC and TCP.
            self._ps_handlers = self.parameter_service.handlers()
            if replicated:  # a member of a replicated shard (psflow.ps.replication)
                # Its Replicate calls go over the TCP carrier every member serves without TLS (start()).
                self.replication = ShardReplication(
                    ReplicationConfig(self.cluster, self.task.name, shard, token=token, tls=tls,
                                      transport="grpc" if tls is not None else "tcp"), self.parameter_service)
                self._ps_handlers = self.replication.handlers(self._ps_handlers)
                if "Done" in self._ps_handlers:  # the run's end waits for the last Done's entry (_run_over)
                    self._ps_handlers["Done"] = self._after_acked.wrap(self._ps_handlers["Done"])
            services[PARAMETER_SERVICE] = {**self._ps_handlers, TRANSPORT_METHOD: self._transport}
            if holds_step:  # the embedded leases: ps task 0's table (replicated, every member of shard 0's)
                table = LeaseTable(self.task.name)
                services[COORDINATION_SERVICE] = (self.replication.serve_leases(table) if self.replication is not None
                                                  else table.handlers())
        services[WORKER_SERVICE] = {"Ping": self._ping, "Shutdown": self._shutdown, **(worker_handlers or {})}
        self._grpc = serve("grpc", ServeConfig(self.task.name, bind_address or address, services, token=token,
                                               tls=tls, max_workers=max_workers))
        host = address.rsplit(":", 1)[0]
        self.address = f"{host}:{self._grpc.port}"
        self._token, self._tls, self._tcp_limits = token, tls, tcp_limits
        self._tcp_bind = (bind_address or address).rsplit(":", 1)[0] + ":0"  # the TCP carrier: a free port
        self._tcp: CarrierServer | None = None
        self._started = False
        if start:
            self.start()

    @property
    def target(self) -> str:
        """``grpc://host:port`` of this task."""
        return f"grpc://{self.address}"

    def start(self) -> None:
        """Starts serving; idempotent."""
        if not self._started:
            self._grpc.start()
            if self.parameter_service is not None and self._tls is None:  # the lean data-path carrier (no TLS)
                tcp = ServeConfig(self.task.name, self._tcp_bind, {PARAMETER_SERVICE: self._ps_handlers},
                                  token=self._token, limits=self._tcp_limits)
                self._tcp = serve("tcp", tcp)
                self._tcp.start()
            self._started = True
            log.info("%s: serving at %s (pid %d)", self.task.name, self.address, os.getpid())
            if self.replication is not None:
                self.replication.start()
            if self._token is None:
                log.warning("%s: authentication is OFF (no cluster token): any peer that reaches %s can call "
                            "every method, Shutdown included", self.task.name, self.address)

    def join(self, timeout: float | None = None) -> bool:
        """Blocks until the server stops (or ``timeout`` seconds pass).

        Returns:
            True if the server has stopped.
        """
        return self._stopped.wait(timeout)

    def stop(self, grace: float = 0.5) -> None:
        """Stops serving (in-flight calls get ``grace`` seconds); idempotent."""
        if self._stopped.is_set():
            return
        if self.replication is not None:
            self.replication.stop()
        self._grpc.stop(grace)
        if self._tcp is not None:
            self._tcp.stop(grace)
        self._stopped.set()
        log.info("%s: stopped", self.task.name)

    def _transport(self, frame: Frame) -> Reply:
        """Where this ps task's TCP carrier listens (``tcp_port`` None: not offered, e.g. under TLS)."""
        return {TCP_PORT_KEY: self._tcp.port if self._tcp is not None else None}, {}

    @property
    def authentication(self) -> str:
        """``"token"`` (every call must carry the cluster token) or ``"off"``."""
        return "off" if self._token is None else "token"

    def _ping(self, frame: Frame) -> Reply:
        meta: dict[str, Any] = {"task": self.task.name, "pid": os.getpid(), "time": time.time(),
                                "authentication": self.authentication}
        return meta, {}

    def _extra_stats(self) -> dict[str, Any]:
        """What the ParameterService's Stats adds on a served task: how calls are authenticated and the TCP
        carrier's counters."""
        extra: dict[str, Any] = {"authentication": self.authentication,
                                 "tcp": self._tcp.stats() if self._tcp is not None else None}
        if self.replication is not None:
            extra["replication"] = self.replication.stats()
        return extra

    def _run_over(self, description: str) -> None:
        """(``stop_when_run_over``) The last training worker's ``Done`` arrived: stop serving, and (a replicated
        shard's primary) stop the shard's other members first, which the workers' ``Done`` never reaches."""
        log.info("%s: run over (%s): exiting", self.task.name, description)
        # On another thread: the Done that completed the ledger gets its reply within stop()'s grace. A replicated
        # primary's backups are stopped once they hold that Done (after_acked.py), not while it reaches them.
        self._after_acked.run(threading.Thread(target=self._stop_after_run, name="psflow-run-over", daemon=True).start)

    def _stop_after_run(self) -> None:
        """Sends ``Shutdown`` (marked as the run's end) to every other member of this task's shard, each at most
        2 s, never raising (one not stopped is logged: it serves until ``psflow shutdown``), then stops."""
        if self.replication is not None:
            config = ConnectConfig(token=self._token, tls=self._tls, connect_timeout=2.0, rpc_timeout=2.0)
            for name in self.replication.members:
                if name == self.task.name:
                    continue
                channel = open_channel("grpc", name, member_address(self.cluster, name), WORKER_SERVICE, config)
                try:
                    channel.call("Shutdown", {_RUN_OVER_BY: self.task.name})
                except RpcError as e:
                    if refused(e):  # nothing listens there (e.g. the primary this one was promoted over): no warning
                        log.info("%s: %s, a member of its shard, is not running (%s)", self.task.name, name, e)
                        continue
                    log.warning("%s: could not stop %s, a member of its shard, at the run's end (%s); it serves "
                                "until stopped (psflow shutdown)", self.task.name, name, e)
                finally:
                    channel.close()
        self.stop()

    def _shutdown(self, frame: Frame) -> Reply:
        by = frame.meta.get(_RUN_OVER_BY)
        if self.replication is not None and by in self.replication.members:  # a name of the cluster's, safe to log
            if self._keep_serving:  # a backup serves on after the run as its primary would (--keep-serving)
                log.info("%s: the run is over (%s, its shard's primary, said so): serving on until stopped "
                         "(psflow shutdown)", self.task.name, by)
                reply = Ack().to_frame()
                return reply.meta, reply.arrays
            log.info("%s: stopped by %s, its shard's primary: the run is over", self.task.name, by)
        threading.Thread(target=self.stop, name="psflow-shutdown", daemon=True).start()
        reply = Ack().to_frame()
        return reply.meta, reply.arrays
