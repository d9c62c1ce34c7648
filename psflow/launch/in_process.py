"""A whole run in one process: the fast path with no RPC (``psflow train --in-process``).

The ps tasks' :class:`~psflow.ps.service.ParameterService` objects live in
this process and the worker's :class:`~psflow.ps.client.ParameterClient`
reaches them through :class:`~psflow.rpc.inprocess.InProcessChannel`: the same
placement, optimizers, step accounting, hooks and checkpoints as a cluster,
without sockets, framing or copies. One worker; its input is read and parsed
in a child process (``reader_process``, see :mod:`psflow.data.reader_process`)
so that parsing runs on another core while this one trains.

With one worker ``--mode ssp`` runs as async (nobody to wait for or run ahead
of): the run reports the mode the user asked for, with its staleness, and says
what ran (:func:`mode_fields`: ``"ran_as": "async"`` in metrics.json and on the
status page), and the worker's log says so once; ``sync`` and ``async`` run as
asked.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

from psflow import jsonio
from psflow.checkpoint.ledger import checkpoint_status
from psflow.cluster import ClusterSpec
from psflow.launch.eval_set import after_training
from psflow.launch.lifeline import LauncherSignals
from psflow.launch.log_format import LineFormatter
from psflow.ps.client import ParameterClient
from psflow.ps.dynamic import table_totals
from psflow.ps.service import ParameterService
from psflow.rpc.api import ConnectConfig
from psflow.rpc.inprocess import InProcessChannel
from psflow.status.final_snapshot import Resumed, final_snapshot, newest_if_unnamed, resumed_from
from psflow.train.build import build_model
from psflow.train.config import MODE_FLAGS, TORCH_THREADS_ENV, ConfigError, SyncSettings, TrainConfig
from psflow.train.duties import claim_run
from psflow.train.evaluation import evaluate, parameters
from psflow.train.faults import NO_FAULTS, FaultInjection
from psflow.train.inputs import check_inputs
from psflow.train.preflight import check_settings
from psflow.train.worker import load_eval, run_worker
from psflow.train.worker_result import eval_not_done

__all__ = ["IN_GRAPH_REFUSED", "mode_fields", "run_in_process"]

#: In-graph replication is a client task driving worker tasks: refused with --in-process in this one line (psflow
#: train refuses it before its in-process banner).
IN_GRAPH_REFUSED = "--replication in-graph needs a client task and worker tasks: not with --in-process"

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _log_to(path: str) -> Iterator[None]:
    """Sends psflow's INFO log lines to ``path`` while the block runs (the task log of a cluster run)."""
    handler = logging.FileHandler(path)
    handler.setFormatter(LineFormatter())
    logger = logging.getLogger("psflow")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        handler.close()


def run_in_process(config: TrainConfig, output_dir: str, *,
                   on_end: Callable[[dict[str, Any], ClusterSpec], None] | None = None,
                   faults: FaultInjection = NO_FAULTS, signals: LauncherSignals | None = None,
                   announce: Callable[[], None] | None = None) -> dict[str, Any]:
    """Trains with ``config.cluster.num_ps`` in-process ps services and one worker; returns the metrics.

    Blocks for the whole run. However it ends (finished, failed, interrupted: a
    ``KeyboardInterrupt``, whose ``signum`` attribute, if any, names the signal),
    it ends with one final snapshot (:mod:`psflow.status.final_snapshot`, the same
    fields as a cluster run's), handed to ``on_end`` with the run's cluster
    (default: written to ``output_dir/metrics.json``); then the metrics are
    returned or the error re-raised. As a cluster run does, it writes the
    worker's log to ``output_dir/logs/worker-0.log`` (the ps services' lines too).
    ``faults``: tests' faults for its worker (:mod:`psflow.train.faults`). ``signals``: the launcher's
    (installed), deferred while a checkpoint is saved, so that a save is whole and counted when the run ends.
    PyTorch's intra-op threads are the run's only while it runs (:func:`_torch_threads_for_the_run`): the
    caller's environment and PyTorch's count are as they were when it returns or raises. ``announce``: called
    once the inputs and settings passed their checks, before anything starts (``psflow train``'s banner: a
    refused input or setting is then the command's only line, as a cluster run's is).

    Raises:
        ConfigError: more than one worker asked for.
        DataError: malformed input, or an empty ``--train`` or ``--eval`` (before anything starts).
        RunDirLockedError: another live run holds ``output_dir`` (names it; nothing written there).
        CheckpointLockedError: another live run holds the checkpoint directory (likewise).
    """
    with _torch_threads_for_the_run():  # the preflight's model too: it is built as the run's is
        return _run(config, output_dir, on_end, faults, signals, announce)


def _run(config: TrainConfig, output_dir: str, on_end: Callable[[dict[str, Any], ClusterSpec], None] | None,
         faults: FaultInjection, signals: LauncherSignals | None,
         announce: Callable[[], None] | None = None) -> dict[str, Any]:
    """:func:`run_in_process` inside its threads' scope."""
    if config.cluster.num_workers != 1:
        raise ConfigError(f"--in-process runs one worker, got --workers {config.cluster.num_workers}")
    if config.sync.replication != "between-graph":
        raise ConfigError(IN_GRAPH_REFUSED)
    check_inputs(config)
    check_settings(config)  # memory, dynamic tables: refused in one line before anything starts
    if announce is not None:
        announce()
    asked = config.sync
    config = replace(config, sync=_runs_as(config.sync), data=replace(config.data, reader_process=True))
    # The run's id; its run directory, then its checkpoint directory, taken before anything is written there
    # (another live run's is refused, naming it); released when the run ends, however it ends.
    config, claimed = claim_run(config, output_dir, out=sys.stderr)
    with claimed:
        return _run_claimed(config, asked, output_dir, on_end or _metrics_json(output_dir), faults, signals)


def mode_fields(sync: SyncSettings) -> dict[str, Any]:
    """What an in-process run with ``sync`` reports of its mode (metrics.json, the status page): the mode the user
    asked for, ssp with its ``staleness``, and ``ran_as`` where one worker runs it as another mode."""
    fields = sync.reported()
    ran_as = _runs_as(sync).mode
    if ran_as != sync.mode:
        fields["ran_as"] = ran_as
    return fields


def _runs_as(sync: SyncSettings) -> SyncSettings:
    """The settings one worker runs: ssp as async (nobody to wait for or run ahead of), the rest as asked.

    The mode's own settings (--staleness, --sync-timeout, ...), moot here, go back to their defaults, which async
    takes (it refuses them set, MODE_FLAGS: the user typed them with --mode ssp)."""
    if sync.mode != "ssp":
        return sync
    defaults = SyncSettings()
    return replace(sync, mode="async", **{name: getattr(defaults, name) for _, name in MODE_FLAGS.values()})


def _metrics_json(output_dir: str) -> Callable[[dict[str, Any], ClusterSpec], None]:
    def write(final: dict[str, Any], cluster: ClusterSpec) -> None:
        with open(os.path.join(output_dir, "metrics.json"), "w") as f:
            jsonio.dump(final, f, indent=1)

    return write


def _run_claimed(config: TrainConfig, asked: SyncSettings, output_dir: str,
                 on_end: Callable[[dict[str, Any], ClusterSpec], None], faults: FaultInjection,
                 signals: LauncherSignals | None) -> dict[str, Any]:
    """:func:`run_in_process` once the run holds its run and checkpoint directories; ``config.sync`` is what runs,
    ``asked`` what the user asked for (what the run reports)."""
    # Placeholder addresses: nothing listens or connects; the channels below replace them.
    cluster = ClusterSpec({"ps": [f"127.0.0.1:{i + 1}" for i in range(config.cluster.num_ps)], "worker": ["127.0.0.1:65535"]})
    services = [ParameterService(i, holds_global_step=i == 0) for i in range(config.cluster.num_ps)]
    channels = {i: InProcessChannel(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)}
    model, variables = build_model(config, cluster)
    timeouts = ConnectConfig(connect_timeout=config.cluster.connect_timeout, rpc_timeout=config.cluster.rpc_timeout,
                             save_timeout=config.cluster.save_timeout)  # (--save-timeout bounds the saves here too)
    client = ParameterClient(cluster, variables.placements(), client_name="/job:worker/task:0", config=timeouts,
                             sync=config.sync_config(), channels=channels)
    resumed = resumed_from(config.checkpoint.dir)  # what the worker's session restores: the examples before this run
    os.makedirs(os.path.join(output_dir, "logs"), exist_ok=True)
    started = time.monotonic()
    run = _Run(config, mode_fields(asked), client, len(channels), resumed, started)
    try:
        with _log_to(os.path.join(output_dir, "logs", "worker-0.log")):
            if asked.mode != config.sync.mode:
                log.info("--mode %s with one worker runs as %s: no other worker to wait for or run ahead of "
                         "(metrics.json reports mode %s, ran_as %s)", asked.mode, config.sync.mode, asked.mode,
                         config.sync.mode)
            result = run_worker(config, cluster, 0, client=client, faults=faults,
                                save_section=functools.partial(_uncut, signals) if signals is not None else None)
        # The final evaluation too: an eval record that cannot be read, or a signal while it runs, ends the run
        # with its snapshot (before, no metrics.json at all).
        eval_batch = after_training(functools.partial(load_eval, config))
        source = parameters(client, moving_averages=config.report.eval_moving_averages)
        evaluation = evaluate(model, source, eval_batch) if eval_batch is not None else None
        final = run.snapshot("finished", rate_seconds=result.wall_seconds, evaluation=evaluation,
                             extra={"examples_processed": result.examples, "workers": [asdict(result)],
                                    "eval_not_done": eval_not_done([asdict(result)])})
    except BaseException as e:  # a failed or interrupted run ends with its snapshot too
        try:
            on_end(run.ended_by(e), cluster)
        except Exception:  # noqa: BLE001 - the run's own error is the one the user must see
            logging.getLogger(__name__).exception("could not write the final snapshot of the run that failed")
        raise
    if final.get("checkpoints_failed"):
        print(f"psflow: {final['checkpoints_failed']} checkpoint saves FAILED (see {output_dir}/logs/worker-0.log)",
              file=sys.stderr, flush=True)
    on_end(final, cluster)
    return final


@contextlib.contextmanager
def _torch_threads_for_the_run() -> Iterator[None]:
    """PyTorch's intra-op threads for the run, given back to the caller's process when it ends, however it ends.

    PyTorch models: the reader process parses on one core; this process's intra-op threads take the rest
    (OpenMP's spinning threads degrade badly on oversubscribed cores), unless ``$PSFLOW_TORCH_THREADS`` says
    otherwise. The count reaches the model through that variable, which
    :func:`psflow.torch.configure_threads` reads when the model is built; it is set for the run only. On
    leaving, the variable is as it was, and so is PyTorch's count: the one before the run, or, if the run
    first imported PyTorch, PyTorch's own (a second run or the caller's own PyTorch code inherit nothing).
    """
    given = os.environ.get(TORCH_THREADS_ENV)
    before = _torch_threads()
    if given is None:
        os.environ[TORCH_THREADS_ENV] = str(max(1, (os.cpu_count() or 1) - 1))
    try:
        yield
    finally:
        if given is None:
            os.environ.pop(TORCH_THREADS_ENV, None)
        _restore_torch_threads(before)


def _torch_threads() -> int | None:
    """PyTorch's intra-op threads in this process; None where PyTorch is not imported (nothing imports it here)."""
    torch = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None else None


def _restore_torch_threads(before: int | None) -> None:
    """Sets PyTorch's intra-op threads back to ``before``, or (None: PyTorch was not imported before the run) to
    its count before psflow.torch first changed it."""
    if _torch_threads() is None:
        return
    if before is None and "psflow.torch.model" in sys.modules:  # already imported: no import happens here
        from psflow.torch.model import threads_before_configured

        before = threads_before_configured()
    if before is not None and before != _torch_threads():
        sys.modules["torch"].set_num_threads(before)


@contextlib.contextmanager
def _uncut(signals: LauncherSignals) -> Iterator[None]:
    """A section no signal cuts (a checkpoint save); a signal received inside is raised on leaving it, in place of
    an error leaving it too (the run ends either way; the interrupt is what the user asked for). A second signal
    cuts it: a save that hangs (a stuck disk or store) must not keep the user from stopping the run."""
    try:
        with signals.deferring(check=False, second_cuts=True):
            yield
    finally:
        signals.check()


@dataclass(frozen=True)
class _Run:
    """What an in-process run's final snapshot is taken from."""

    config: TrainConfig
    mode: dict[str, Any]  # what it reports of its mode (mode_fields)
    client: ParameterClient
    num_ps: int
    resumed: Resumed | None
    started: float

    def snapshot(self, phase: str, *, rate_seconds: float | None = None, evaluation: dict[str, Any] | None = None,
                 extra: dict[str, Any]) -> dict[str, Any]:
        ps_stats = [self.client.stats(i) for i in range(self.num_ps)]
        # The ledger on ps service 0, which never restarts here.
        ledger = checkpoint_status(self.client) if self.config.checkpoint.dir else None
        more: dict[str, Any] = {**self.mode, "replication": "in-process", **extra}
        dynamic = table_totals(ps_stats)
        if dynamic:
            more["dynamic_tables"] = dynamic
        return final_snapshot(phase=phase, ps_stats=ps_stats, wall_seconds=time.monotonic() - self.started,
                              resumed=self.resumed, rate_seconds=rate_seconds, checkpoints=ledger,
                              newest=newest_if_unnamed(ledger, self.config.checkpoint.dir),
                              events={"faults": [], "restarts": [], "hangs": []},  # one process: nothing restarts
                              evaluation=evaluation, extra=more)

    def ended_by(self, error: BaseException) -> dict[str, Any]:
        """The snapshot of a run that ``error`` ended (a KeyboardInterrupt: interrupted)."""
        if isinstance(error, KeyboardInterrupt):
            signum = int(getattr(error, "signum", signal.SIGINT))
            return self.snapshot("interrupted", extra={"interrupted": signal.Signals(signum).name,
                                                       "exit_code": 128 + signum})
        return self.snapshot("failed", extra={"error": f"{type(error).__name__}: {error}", "exit_code": 1})
