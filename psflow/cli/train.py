"""``psflow train``: a local cluster of real processes (or ``--in-process``) trained in a fresh or given run
directory, which one run holds at a time (its run lock, taken before anything is written there); prints the
run's summary as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from psflow import jsonio
from psflow.cli.training import config_from_args, faults_from_args
from psflow.data.infer import schema_yaml
from psflow.launch.launcher_signals import EndNotWritten, stop_at_once_leaves
from psflow.launch.lifeline import LaunchInterrupted
from psflow.status.progress import final_line
from psflow.status.report import RUN_SUMMARIES
from psflow.train.build import inferred_schema
from psflow.train.config import ConfigError, TrainConfig
from psflow.train.faults import FaultInjection

__all__ = ["run_train"]


def run_train(args: argparse.Namespace) -> int:
    from psflow.checkpoint.lock import new_run_id
    from psflow.cli.status import status_config
    from psflow.launch.in_process import IN_GRAPH_REFUSED
    from psflow.launch.task import configure_logging

    if not args.train:
        raise ConfigError("--train is required")
    if args.verbose:
        configure_logging(verbose=True)
    if args.ps_replicas < 0:
        raise ConfigError(f"--ps-replicas {args.ps_replicas}: want a whole number >= 0 (backups of each ps shard)")
    if args.in_process and args.ps_replicas:
        raise ConfigError(f"--ps-replicas {args.ps_replicas} needs a cluster of processes (each backup is a task): "
                          "not with --in-process")
    # Before the in-process banner and the run directory. 0 or less is not a worker count, whatever the mode:
    # config_from_args below says so ("--workers must be >= 1"), as every other mode does.
    if args.in_process and args.workers is not None and args.workers > 1:
        raise ConfigError(f"--in-process runs one worker, got --workers {args.workers}")
    if args.in_process and args.replication == "in-graph":
        raise ConfigError(IN_GRAPH_REFUSED)
    if args.in_process and args.chaos:  # no task to kill: the run would go on without the faults, saying nothing
        raise ConfigError(f"--chaos {args.chaos[0]} kills tasks of a cluster of processes: not with --in-process")
    if args.ps_replicas and args.steps_in_flight > 2:  # (psflow.train.worker checks it again, for other callers)
        raise ConfigError(f"--steps-in-flight {args.steps_in_flight} is not supported with --ps-replicas "
                          f"{args.ps_replicas}: use 1 or 2")
    config = config_from_args(args)
    status = status_config(args)  # before anything is written: a PSFLOW_TOKEN of only whitespace is refused
    _check_output(args.output)
    output = args.output or tempfile.mkdtemp(prefix=f"psflow-{time.strftime('%Y%m%d-%H%M%S')}-")
    # One run per run directory, taken before anything is written there: another live run's is refused, naming it
    # (psflow.checkpoint.lock.RunDirLock). The launcher finds it held by this process and leaves it to this.
    run = config.run_id or new_run_id()
    config = dataclasses.replace(config, run_id=run)
    if config.report.summary_dir is None:  # the chief's TensorBoard summaries: a fresh directory per run (psflow report)
        summaries = os.path.abspath(os.path.join(output, RUN_SUMMARIES, run))
        config = dataclasses.replace(config, report=dataclasses.replace(config.report, summary_dir=summaries))
    printed: list[bool] = []  # the run's summary was printed

    def summary(metrics: dict[str, Any]) -> None:
        _print_summary(metrics)
        printed.append(True)

    # A signal stopping this process at once after the run's end (launcher_signals.hold_to_exit) says what it leaves.
    _leaves_undone(output, config, printed, run)
    try:
        return _train_in(output, run, args, config, status, summary)
    finally:
        for name in ("summary", "run lock", "checkpoint lock"):
            stop_at_once_leaves(name, None)


def _leaves_undone(output: str, config: TrainConfig, printed: list[bool], run: str) -> None:
    """What a stop at once after the end (:func:`~psflow.launch.launcher_signals.stop_at_once_leaves`) would leave:
    a finished run's summary not printed yet (its figures are in metrics.json, where that was written), and each lock
    this process still holds for run ``run`` (its file names this process and run as the lock judges its own:
    :func:`~psflow.checkpoint.holder.is_this_process`; an earlier process of the run under this pid is not this one):
    a file naming it, which a run from this host takes over, its process gone, and a run from another host never
    does (:mod:`psflow.checkpoint.lock`: deleted by hand); an object store's is not asked from the handler."""
    from psflow.checkpoint.holder import is_this_process
    from psflow.checkpoint.lock import LOCK_NAME, RUN_LOCK_NAME
    from psflow.launch.run_status import METRICS_JSON

    def summary(end: Any, written: bool) -> str | None:
        if printed or end.get("phase") != "finished":
            return None
        return "the run's summary" + (f" (its figures are in {os.path.join(output, METRICS_JSON)})" if written else "")

    def lock(path: str) -> Callable[[Any, bool], str | None]:
        def left(end: Any, written: bool) -> str | None:
            with open(path, "rb") as f:  # (gone, unreadable: not this process's, nothing said)
                holder = json.loads(f.read())
            if not is_this_process(holder, run):
                return None
            return f"{path} is left (a run there from this host takes it over, its process gone; from another host, delete it)"
        return left

    stop_at_once_leaves("summary", summary)
    stop_at_once_leaves("run lock", lock(os.path.join(output, RUN_LOCK_NAME)))
    if config.checkpoint.dir and "://" not in config.checkpoint.dir:
        stop_at_once_leaves("checkpoint lock", lock(os.path.join(config.checkpoint.dir, LOCK_NAME)))


def _train_in(output: str, run: str, args: argparse.Namespace, config: TrainConfig, status: Any,
              summary: Callable[[dict[str, Any]], None]) -> int:
    """:func:`run_train` in ``output``, held for run ``run`` (its run lock) to the end; prints the summary."""
    from psflow.checkpoint.lock import RunDirLock
    from psflow.launch.local import run_local
    from psflow.launch.resilience_flags import resilience_config

    with RunDirLock(output, run):
        _show_inferred_schema(config, output)
        try:
            if args.in_process:
                metrics = _in_process(config, output, faults_from_args(args))
                if not args.quiet:
                    print(final_line(metrics), file=sys.stderr, flush=True)
            else:
                # The status URL is the run's first line, then "N ps + M workers, run directory ..." (LauncherStatus).
                metrics = run_local(config, output, progress=None if args.quiet else sys.stderr,
                                    resilience=resilience_config(args), status=status, verbose=args.verbose,
                                    faults=faults_from_args(args))
        except EndNotWritten as e:  # training's result still printed; then the error's one line, exit status 1
            if args.in_process and not args.quiet:  # its last line (a cluster run's bar printed it)
                print(final_line(e.final), file=sys.stderr, flush=True)
            summary(dict(e.final))
            raise
        except LaunchInterrupted as e:
            if e.final is None or e.final.get("phase") != "finished":
                raise  # cli.main reports it: 128 + n, or a failed run's end's status (launcher_signals)
            # The signal arrived after the run had finished (every task stopped): its end stands, and so does what
            # follows a finished run: its last line (a cluster run's bar printed it), its summary on stdout, exit
            # status 0 (a script reads the run's outcome).
            if args.in_process and not args.quiet:
                print(final_line(e.final), file=sys.stderr, flush=True)
            if e.ended is None:  # its metrics.json was not written: failed (exit 1), its result printed as EndNotWritten's
                summary(dict(e.final))
                raise
            print(f"psflow train: {e}", file=sys.stderr, flush=True)
            metrics = dict(e.ended)
    summary(metrics)
    return 0


def _print_summary(metrics: dict[str, Any]) -> None:
    """A run's result on stdout (its figures as JSON), with the lines of what it skipped or held on stderr."""
    summary = {k: metrics[k] for k in ("global_step", "examples", "examples_this_run", "wall_seconds",
                                       "examples_per_sec")}
    if metrics.get("bad_records_skipped"):
        summary["bad_records_skipped"] = metrics["bad_records_skipped"]
        print(f"psflow: skipped {metrics['bad_records_skipped']} bad records (see the worker logs)", file=sys.stderr)
    for name, table in (metrics.get("dynamic_tables") or {}).items():
        if table.get("shares_unread"):  # a ps task not read held a share: no total is known (table_totals)
            shares = "; ".join(f"the share on {u.get('task')} was not read ({u.get('error')})" for u in table["shares_unread"])
            print(f"psflow: dynamic table {name!r}: totals not known: {shares}", file=sys.stderr)
            continue
        print(f"psflow: dynamic table {name!r}: {table.get('rows', 0):,} rows ({table.get('memory_bytes', 0) / 2**20:.1f} MiB), "
              f"{table.get('admitted', 0):,} admitted, {table.get('rejected_lookups', 0):,} lookups of ids not admitted "
              f"(read as zeros), {table.get('dropped_gradients', 0):,} gradients dropped, "
              f"{table.get('evicted_capacity', 0):,} evicted by capacity, {table.get('evicted_ttl', 0):,} by ttl",
              file=sys.stderr)
    if "eval" in metrics:
        summary["eval"] = metrics["eval"]
    print(jsonio.dumps(summary, indent=1))


def _in_process_banner(config: TrainConfig, output: str) -> None:
    """The in-process run's first line, once its inputs and settings passed their checks (a refused one is the
    command's only line, as a cluster run's is)."""
    print(f"psflow: in-process, {config.cluster.num_ps} ps services + 1 worker, {_mode_words(config)}, "
          f"run directory {output}", file=sys.stderr)


def _mode_words(config: TrainConfig) -> str:
    """The in-process banner's mode: what the user asked for, and what one worker runs it as where that differs
    (``--mode ssp --staleness 3 (runs as async: one worker)``)."""
    from psflow.launch.in_process import mode_fields

    fields = mode_fields(config.sync)
    words = f"--mode {fields['mode']}" + (f" --staleness {fields['staleness']}" if "staleness" in fields else "")
    return words + (f" (runs as {fields['ran_as']}: one worker)" if "ran_as" in fields else "")


def _check_output(output: str | None) -> None:
    """--output is a local directory (logs, cluster.json, metrics, status): a URL is one line before anything is
    written or started (it used to make a local folder ``./s3:/bucket/run``, or stop on the store's traceback)."""
    from psflow import storage

    try:
        storage.local_only(output or "", "--output", "the run's logs, metrics and status")
    except storage.StorageError as e:
        raise ConfigError(str(e)) from None


def _in_process(config: TrainConfig, output: str, faults: FaultInjection) -> dict[str, Any]:
    """``--in-process``: the run, its end written as a cluster run's (metrics.json, status.json, metrics.prom from
    one final snapshot), SIGTERM, SIGHUP and SIGINT included (they end it as :class:`LaunchInterrupted`)."""
    from psflow.cluster import ClusterSpec
    from psflow.launch.in_process import run_in_process
    from psflow.launch.lifeline import LauncherSignals, signal_name
    from psflow.launch.run_end import after_the_end, at_global_step, interrupted_kept
    from psflow.launch.run_status import METRICS_JSON, InProcessEnding

    ending = InProcessEnding(config, output, sys.stderr)
    signals = LauncherSignals()
    signals.install()  # main thread only (else a no-op)

    cut: list[dict[str, Any]] = []  # the end whose writing a second signal cut
    unwritten: dict[str, str] = {}  # the end's files that could not be written: file name -> error

    def on_end(final: dict[str, Any], cluster: ClusterSpec) -> None:
        # ending.final is set first; a signal cuts the writing as LauncherSignals.writing_end says. A file not
        # written (a full disk): said; a finished or failed end's metrics.json: the run failed (end_written).
        with signals.writing_end(output, cut_before=bool(cut)):
            try:
                unwritten.update(ending(final, cluster))
            except LaunchInterrupted:
                cut.append(final)
                raise
            signals.end_written(final, unwritten.get(METRICS_JSON))
        if METRICS_JSON in unwritten and final.get("phase") == "finished":
            raise EndNotWritten(final, unwritten[METRICS_JSON])

    try:
        return run_in_process(config, output, on_end=on_end, faults=faults, signals=signals,
                              announce=functools.partial(_in_process_banner, config, output))
    except LaunchInterrupted as e:
        final = ending.final or {}
        if cut:  # its files may be missing, or some of them
            e.report = (f"interrupted by {signal_name(e.signum)} while the run's end ({cut[0].get('phase')} "
                        f"{at_global_step(cut[0].get('global_step'))}) was written: a second signal cut the writing; "
                        f"{os.path.join(output, METRICS_JSON)} and the status files may be missing")
            raise
        if final.get("phase") not in (None, "interrupted"):  # its end was written before the signal: it stands
            e.report = after_the_end(e.signum, final, output, unwritten=unwritten)  # (not where metrics.json was not)
            e.ended = final if METRICS_JSON not in unwritten else None  # and its exit status (1 where it was not)
            e.final = final  # (its result printed either way)
            raise
        e.report = (f"interrupted by {signal_name(e.signum)} {at_global_step(final.get('global_step'))} after "
                    f"{float(final.get('wall_seconds') or 0.0):.1f} s\n{interrupted_kept(final, config.checkpoint.dir)}\n"
                    + unwritten.get(METRICS_JSON, f"metrics: {os.path.join(output, METRICS_JSON)}"))
        raise
    finally:
        signals.restore()


def _show_inferred_schema(config: TrainConfig, output: str) -> None:
    """Without --schema or --feature: prints the TFRecord schema inferred and writes it to the run directory."""
    inferred = inferred_schema(config)  # cached: config_from_args inferred it already
    if inferred is None or inferred.is_default:
        return
    os.makedirs(output, exist_ok=True)
    path = os.path.join(output, "schema.inferred.yaml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(schema_yaml(inferred))
    print("psflow: " + inferred.describe(), file=sys.stderr)
    print(f"psflow: no --schema given; the schema above is in {path}: edit it and pass --schema to change it",
          file=sys.stderr)
