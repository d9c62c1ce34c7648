"""Who serves the status page: the local launcher, or the chief under ``psflow server``.

The chief under ``psflow server`` (:func:`chief_status_page`) knows no
processes: its page shows what pings, ``Stats`` and the chief's own summaries
say (a task's pid changing counts as a restart), served from the chief's
process on ``--status-host``/``--status-port`` for as long as it runs.


:class:`LauncherStatus` is what ``run_local`` holds for one run: it starts the
collector and the HTTP server (printing ``psflow: status http://127.0.0.1:PORT/``, the
run's first line, then the run's size and directory) before any task starts, tells the collector each task process's pid, exit and
restarts (with a death-and-restart history per task), and the faults, restarts
and hangs of :mod:`psflow.launch.resilience`. With ``--no-status`` it serves
nothing and samples nothing, but is still there for the run's end.

However the run ends, :func:`write_run_files` writes ``metrics.json``,
``status.json`` and ``metrics.prom`` (the final ``/metrics``, in the text format
Prometheus' node-exporter textfile collector reads) from the run's one final
snapshot (:mod:`psflow.status.final_snapshot`), so they agree on every figure
they share; :class:`InProcessEnding` does the same for ``--in-process`` runs.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from psflow import jsonio, storage
from psflow.cluster import ClusterSpec
from psflow.cluster.replicas import BACKUP_JOB, ps_replicas
from psflow.launch.in_process import mode_fields
from psflow.launch.supervisor import describe_exit
from psflow.rpc.tls import TlsConfig
from psflow.status.collector import ProcessInfo, StatusCollector
from psflow.status.server import StatusConfig, StatusServer, prometheus_text
from psflow.train.chief import is_chief
from psflow.train.config import TrainConfig

__all__ = ["ChiefStatusPage", "InProcessEnding", "LauncherStatus", "METRICS_FILE", "METRICS_JSON", "chief_status_page",
           "write_run_files"]

log = logging.getLogger("psflow.status.collector")

METRICS_FILE = "metrics.prom"
METRICS_JSON = "metrics.json"


def write_run_files(final: Mapping[str, Any], output_dir: str, collector: StatusCollector | None) -> dict[str, str]:
    """Writes a run's end from its final snapshot: ``metrics.json`` (the snapshot itself), then, with a
    collector, ``status.json`` (:meth:`StatusCollector.finish`) and ``metrics.prom`` (its last ``/metrics``).

    Each file is replaced atomically (a temp file, then a rename). Never raises for a file that cannot
    be written (the disk refuses it, or it holds a value JSON cannot: ``TypeError``, ``ValueError``; the file
    before it stays whole): returns file name -> the error, for each one that failed (empty: all written);
    status.json's is the collector's WARNING naming the file.
    """
    failed: dict[str, str] = {}
    path = os.path.join(output_dir, METRICS_JSON)
    try:
        storage.write_atomically(path, jsonio.dumps(final, indent=1).encode(), durable=False)
    except (OSError, ValueError, TypeError) as e:  # the disk's refusal, or a value JSON cannot hold
        failed[METRICS_JSON] = f"could not write {path}: {e}"
    if collector is None:
        return failed
    collector.finish(final)  # writes status.json (its run_dir is output_dir)
    path = os.path.join(output_dir, METRICS_FILE)
    try:
        storage.write_atomically(path, prometheus_text(collector), durable=False)
    except (OSError, ValueError, TypeError) as e:
        failed[METRICS_FILE] = f"could not write {path}: {e}"
    return failed


class LauncherStatus:
    """The status page of one local run (``lc``: a :class:`~psflow.launch.processes.LocalCluster`)."""

    def __init__(self, config: TrainConfig, lc: Any, output_dir: str, status: StatusConfig,
                 out: TextIO | None) -> None:
        """Starts sampling and serving at once (the tasks may not be up yet: they show as starting);
        with ``status.enabled`` false, neither (the collector is kept for the run's end). Prints
        ``psflow: status URL`` on ``out`` (the run's first line, where nothing before it had to be
        said), then ``psflow: N ps + M workers, run directory DIR``.

        Raises:
            ConfigError: the page's address cannot be bound, or needs a token it would not have.
        """
        self._lc = lc
        self._output_dir = output_dir
        run = {"run_dir": os.path.abspath(output_dir), "run_id": config.run_id, **config.sync.reported(),
               "replication": config.sync.replication, "model": config.model.name, "num_ps": config.cluster.num_ps,
               "num_workers": config.cluster.num_workers, "ps_replicas": ps_replicas(lc.cluster)}
        self.collector = StatusCollector(lc.cluster, token=lc.token, run=run, interval=status.interval,
                                         run_dir=output_dir, summary_dir=config.report.summary_dir,
                                         checkpoints=bool(config.checkpoint.dir), processes=self._processes,
                                         events=self._events)
        self.server: StatusServer | None = None
        if status.enabled:
            try:
                # The run's own cluster token is known to no one: off loopback the page requires PSFLOW_TOKEN.
                self.server = StatusServer(self.collector, host=status.host, port=status.port, token=status.token)
            except BaseException:
                self.collector.stop()
                raise
            self.collector.start()
            self.server.start()
            print(f"psflow: status {self.server.url}", file=out, flush=True)
        backups = f" (+ {lc.cluster.num_tasks(BACKUP_JOB)} ps backups)" if run["ps_replicas"] else ""
        print(f"psflow: {config.cluster.num_ps} ps{backups} + {config.cluster.num_workers} workers, run directory {output_dir}",
              file=out, flush=True)

    @property
    def url(self) -> str | None:
        return self.server.url if self.server is not None else None

    def _processes(self) -> dict[str, ProcessInfo]:
        resilience = self._lc.resilience
        supervisor = resilience.supervisor if resilience is not None else None
        events = list(supervisor.events) if supervisor is not None else []
        out: dict[str, ProcessInfo] = {}
        for t in list(self._lc.tasks):  # a restarted task's process replaces the old one in the list
            history: list[dict[str, Any]] = []
            for e in events:
                if e.task != t.name:
                    continue
                history.append({"time": e.time, "event": "dead", "detail": f"pid {e.pid} {e.exit}"})
                if e.new_pid is not None:
                    history.append({"time": e.restarted_at, "event": "restarted", "detail": f"pid {e.new_pid}"})
            code = t.exit_code
            if code is None:
                state, exit_ = "running", None
            elif code == 0:
                state, exit_ = "finished", "exited 0"
            else:
                exit_ = describe_exit(code)
                state = "restarting" if supervisor is not None and supervisor.scheduled(t.name) else "dead"
            restarts = supervisor.restarts.get(t.name, 0) if supervisor is not None else 0
            out[t.name] = ProcessInfo(t.pid, state, exit_, restarts, history)
        return out

    def _events(self) -> Mapping[str, Any]:
        resilience = self._lc.resilience
        return resilience.metrics() if resilience is not None else {}

    def set_phase(self, phase: str) -> None:
        self.collector.set_phase(phase)

    def write(self, final: Mapping[str, Any]) -> dict[str, str]:
        """The run ended (however): metrics.json, status.json and metrics.prom from its final snapshot
        (:func:`write_run_files`); returns the files that could not be written, with why."""
        return write_run_files(final, self._output_dir, self.collector)

    def close(self) -> None:
        """Stops serving and sampling (status.json keeps the last snapshot, the final one once
        :meth:`write` ran); idempotent."""
        if self.server is not None:
            self.server.close()
        self.collector.stop()


class InProcessEnding:
    """The end of an ``--in-process`` run (``run_in_process``'s ``on_end``): the same three files as a
    cluster run's, from its final snapshot. The tasks are services in this process: status.json lists
    them with this process's pid. ``config``: the one given to ``run_in_process`` (the mode the user asked for,
    which the page reports with what ran: :func:`~psflow.launch.in_process.mode_fields`). ``final``: the
    snapshot, once the run ended."""

    def __init__(self, config: TrainConfig, output_dir: str, out: TextIO | None = None) -> None:
        self._config, self._output_dir, self._out = config, output_dir, out
        self.final: Mapping[str, Any] | None = None

    def __call__(self, final: Mapping[str, Any], cluster: ClusterSpec) -> dict[str, str]:
        """Writes the files; returns those that could not be written (file name -> error), each a line on ``out``
        (but a finished run's metrics.json, which its caller raises: psflow.cli.train), never an error here."""
        self.final = final
        config, phase = self._config, str(final.get("phase"))
        run = {"run_dir": os.path.abspath(self._output_dir), "run_id": config.run_id, **mode_fields(config.sync),
               "replication": "in-process", "model": config.model.name, "num_ps": config.cluster.num_ps, "num_workers": 1}
        state = {"finished": "finished", "failed": "dead"}.get(phase, "stopped")
        names = [f"/job:{job}/task:{i}" for job in cluster.jobs for i in cluster.task_indices(job)]
        collector = StatusCollector(cluster, token=None, run=run, run_dir=self._output_dir,
                                    summary_dir=config.report.summary_dir,
                                    processes=lambda: {n: ProcessInfo(os.getpid(), state) for n in names})
        try:
            failed = write_run_files(final, self._output_dir, collector)
        finally:
            collector.stop()
        for name, line in failed.items():
            if name != METRICS_JSON or phase != "finished":
                print(f"psflow: {line}", file=self._out or sys.stderr, flush=True)
        return failed


class ChiefStatusPage:
    """The status page served by the chief's process under ``psflow server``."""

    def __init__(self, collector: StatusCollector, server: StatusServer) -> None:
        self.collector, self.server = collector, server

    def close(self) -> None:
        self.server.close()
        self.collector.stop()


def chief_status_page(cluster: ClusterSpec, job: str, index: int, config: TrainConfig, *, token: str | None,
                      status: StatusConfig, tls: TlsConfig | None = None) -> ChiefStatusPage | None:
    """Starts the page if ``/job:<job>/task:<index>`` is the cluster's chief (None otherwise).

    The collector's channels to every task use ``tls`` (the task's own; ``None``: plain text); the
    page itself is plain HTTP (see :mod:`psflow.status.server` for who may read it).

    Logs ``psflow: status URL`` on stderr. Raises ConfigError as :class:`StatusServer`.
    """
    if not is_chief(cluster, job, index):
        return None
    trainers = sum(cluster.num_tasks(j) for j in ("chief", "worker") if j in cluster.jobs)  # a chief trains too
    run = {**config.sync.reported(), "replication": config.sync.replication, "model": config.model.name, "run_id": config.run_id,
           "num_ps": cluster.num_tasks("ps"), "num_workers": trainers, "phase": "training",
           "ps_replicas": ps_replicas(cluster),
           "served_by": f"/job:{job}/task:{index}"}
    collector = StatusCollector(cluster, token=token, run=run, interval=status.interval,
                                summary_dir=config.report.summary_dir, checkpoints=bool(config.checkpoint.dir), tls=tls)
    try:
        server = StatusServer(collector, host=status.host, port=status.port, token=token)
    except BaseException:
        collector.stop()
        raise
    collector.start()
    server.start()
    print(f"psflow: status {server.url}", file=sys.stderr, flush=True)
    return ChiefStatusPage(collector, server)
