"""A run's final snapshot: the one set of numbers its end is reported from.

However a run of ``psflow train`` ends (finished, a task failed, ``--max-failed-saves``,
SIGTERM/SIGINT/SIGHUP; a cluster, ``--in-process`` or in-graph), the launcher
builds it once with :func:`final_snapshot`, after the last checkpoint and the
evaluation, and writes ``metrics.json`` (the snapshot itself), ``status.json``
and ``metrics.prom`` (:mod:`psflow.launch.run_status`) and the console's last
lines from it, so every figure they share is the same number.

The shared figures (``None`` where nothing answered, e.g. every ps task down):

``phase``              ``finished``, ``failed`` or ``interrupted``
``global_step``        of the ps task holding it
``examples``           the model's history: every record counted once per epoch, over
                       every run that trained this model (a restore sets it back to
                       the checkpoint's count, so redone work is not counted twice)
``resumed_from``       the checkpoint this run resumed (``path``, ``global_step``,
                       ``examples``), or None: a fresh model
``examples_at_start``  ``examples`` when this run began (the resumed checkpoint's; 0)
``examples_this_run``  ``examples - examples_at_start``: what this run added
``wall_seconds``       this run's seconds (start to end of training)
``examples_per_sec``   this run's rate: ``examples_this_run`` over its training seconds
``loss``               the cluster's moving-average training loss at the end
``last_step_loss``     the training loss of the newest step (its push's batch loss)
``checkpoints``        ``saved``, ``failed``, ``failed_in_a_row``, ``last_saved_step``,
                       ``last_saved_path`` over the whole run (None without a
                       checkpoint directory); also flat, as ``checkpoints_saved`` and
                       ``checkpoints_failed``. A run whose ledger counted no save names the
                       directory's newest at the end: the one it restored
                       (``last_saved_by_this_run`` False) or one it wrote uncounted (True;
                       True also for a counted save; None: no checkpoint at all, or none
                       read within ``NEWEST_READ_TIMEOUT`` s: a store that stopped answering)
``faults``, ``faults_not_fired``, ``restarts``, ``hangs``   the launcher's (resilience)
``eval``               the final evaluation, where there was one
``ps``                 each ps task's ``Stats``, as read for this snapshot; with replicated shards
                       (``--ps-replicas``), each shard's primary's
``pushes_acknowledged``, ``pushes_applied``, ``updates_lost``, ``shards``   where the ps tasks report
                       them: pushes acknowledged to the workers, pushes held in the final model, the
                       acknowledged pushes lost with every replica of a shard, and per shard its primary
                       and each backup's lag (:mod:`psflow.status.replication`)

Pure: reads nothing itself (:func:`resumed_from` reads a manifest).
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from psflow.checkpoint.daemon_calls import in_daemon_threads
from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.errors import CheckpointError
from psflow.status.replication import REPLICATION_FIGURES, replication_view, shard_primaries
from psflow.waits import wait_woken

__all__ = ["NEWEST_READ_TIMEOUT", "PHASES", "Resumed", "final_snapshot", "newest_if_unnamed", "resumed_from", "step_task_stats"]

log = logging.getLogger(__name__)

#: How a run can end.
PHASES = ("finished", "failed", "interrupted")

#: Seconds a run's end waits for its directory's newest checkpoint (a pointer and a manifest) where the ledger
#: names no save: a store that stopped answering never ends that read (see :func:`newest_if_unnamed`).
NEWEST_READ_TIMEOUT = 15.0


@dataclass(frozen=True)
class Resumed:
    """The checkpoint a run resumed from: its directory, global_step and examples count."""

    path: str
    global_step: int
    examples: int


def resumed_from(checkpoint_dir: str | None) -> Resumed | None:
    """The checkpoint a run with ``checkpoint_dir`` resumes: the newest complete one there, which the
    chief restores at start. Call before any task starts, holding the directory's lock (nothing else
    writes it then). None: no directory, no checkpoint yet, or one that cannot be read (the chief then
    refuses it and the run fails, so there is nothing to subtract)."""
    if not checkpoint_dir:
        return None
    try:
        path = latest_checkpoint(checkpoint_dir)
        if path is None:
            return None
        manifest = read_manifest(path)
    except (CheckpointError, OSError) as e:
        log.debug("no resumed checkpoint read from %s: %s", checkpoint_dir, e)
        return None
    return Resumed(path, int(manifest.global_step), int(manifest.examples))


def step_task_stats(ps_stats: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The ``Stats`` of the ps task holding global_step (its counters are the run's), or None."""
    for stats in ps_stats:
        if stats.get("global_step") is not None:
            return stats
    return None


def final_snapshot(*, phase: str, ps_stats: Sequence[Mapping[str, Any]], wall_seconds: float,
                   resumed: Resumed | None = None, rate_seconds: float | None = None,
                   checkpoints: Mapping[str, Any] | None = None, newest: Resumed | None = None,
                   events: Mapping[str, Any] | None = None,
                   evaluation: Mapping[str, Any] | None = None,
                   extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The final snapshot (see the module docstring); JSON-ready, a fresh dict.

    Args:
        phase: how the run ended, one of :data:`PHASES`.
        ps_stats: each ps task's ``Stats`` that answered (may be empty: the figures are then None).
        wall_seconds: the run's seconds.
        resumed: the checkpoint the run resumed (:func:`resumed_from`).
        rate_seconds: the seconds ``examples_per_sec`` is over (default ``wall_seconds``).
        checkpoints: the run's checkpoint ledger (``SaveStatusWatcher.ledger()`` or a ``CheckpointStatus``).
        newest: where the ledger names no checkpoint, the newest complete one in the directory at the end
            (:func:`resumed_from` read then); None: ``resumed``.
        events: ``faults``, ``faults_not_fired``, ``restarts``, ``hangs``.
        evaluation: the final eval's metrics.
        extra: more fields (workers' results, mode, ``interrupted`` ...); never replaces a shared figure.

    Raises:
        ValueError: ``phase`` is not one of :data:`PHASES`.
    """
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r}: want one of {', '.join(PHASES)}")
    replication = replication_view(ps_stats)
    if replication is not None:  # replicated shards: each shard's primary's Stats, never a backup's copy
        ps_stats = shard_primaries(ps_stats)
    head = step_task_stats(ps_stats)
    examples = _int(head.get("examples")) if head is not None else None
    at_start = resumed.examples if resumed is not None else 0
    this_run = None if examples is None else max(0, examples - at_start)
    seconds = wall_seconds if rate_seconds is None else rate_seconds
    snapshot: dict[str, Any] = dict(extra or {})
    snapshot.update({
        "phase": phase,
        "global_step": _int(head.get("global_step")) if head is not None else None,
        "examples": examples,
        "resumed_from": asdict(resumed) if resumed is not None else None,
        "examples_at_start": at_start,
        "examples_this_run": this_run,
        "wall_seconds": wall_seconds,
        "examples_per_sec": None if this_run is None else this_run / max(seconds, 1e-9),
        "loss": _finite(head.get("loss_ema")) if head is not None else None,
        "last_step_loss": _finite(head.get("last_loss")) if head is not None else None,
        "ps": [dict(s) for s in ps_stats],
    })
    if replication is not None:
        snapshot.update({k: replication[k] for k in REPLICATION_FIGURES})
        snapshot["shards"] = replication["shards"]  # ("replication" is the run's between-graph or in-graph)
    if checkpoints is not None:
        view = _newest_checkpoint(checkpoints, resumed, newest)
        snapshot["checkpoints"] = view
        snapshot["checkpoints_saved"] = int(view["saved"] or 0)
        snapshot["checkpoints_failed"] = int(view["failed"] or 0)
    for key in ("faults", "faults_not_fired", "restarts", "hangs"):
        if events is not None and key in events:
            snapshot[key] = events[key]
    if evaluation is not None:
        snapshot["eval"] = dict(evaluation)
    return snapshot


def _newest_checkpoint(ledger: Mapping[str, Any], resumed: Resumed | None,
                       newest: Resumed | None) -> dict[str, Any]:
    """The ``checkpoints`` figures: the ledger's counts (this run's saves) and the newest checkpoint.

    A run whose ledger names no save (resumed with nothing left to train, stopped before its first save, every
    save failed) has the directory's newest at its end (``newest``; else ``resumed``) as its newest: the
    checkpoint it restored, or one it wrote that the ledger never counted (its chief died as the save
    completed). ``last_saved_by_this_run`` says which: True (the ledger's own, or not the one restored: the
    run held the directory), False (the one restored, saved by an earlier run), None (no checkpoint at all);
    ``saved`` stays the ledger's count either way.
    """
    view = {k: ledger.get(k) for k in ("saved", "failed", "failed_in_a_row", "last_saved_step", "last_saved_path")}
    found = newest if newest is not None else resumed
    if view["last_saved_path"] is not None:
        view["last_saved_by_this_run"] = True
    elif found is not None:
        view.update(last_saved_step=found.global_step, last_saved_path=found.path,
                    last_saved_by_this_run=resumed is None or found.path != resumed.path)
    else:
        view["last_saved_by_this_run"] = None
    return view


def newest_if_unnamed(ledger: Mapping[str, Any] | None, checkpoint_dir: str | None, *,
                      timeout: float = NEWEST_READ_TIMEOUT) -> Resumed | None:
    """:func:`final_snapshot`'s ``newest``: the directory's newest complete checkpoint, read at the run's end,
    where the ledger names no save (None where it names one: nothing is read).

    Blocks ``timeout`` s at most: the read runs in a daemon thread (:func:`~psflow.checkpoint.daemon_calls.in_daemon_threads`;
    what it raises is raised here), and one that has not ended by then (an object store that stopped answering
    never ends it) is left behind, logged as a warning, and None returned. Before, a
    failed run whose launcher never read a ledger naming a save (none made yet, or every reading of it failed)
    waited here for ever once its store stopped, after every task had ended.

    The wait is made of short ones (:func:`psflow.waits.wait_woken`): the launcher's stop signal, handed by the
    kernel to another thread while the main thread waits here, raises within
    :data:`~psflow.waits.WAKE_EVERY` s, not once the whole ``timeout`` has passed."""
    if ledger is None or ledger.get("last_saved_path") or not checkpoint_dir:
        return None
    read = in_daemon_threads({"read": functools.partial(resumed_from, checkpoint_dir)}, name="psflow-newest")["read"]
    done = threading.Event()
    read.add_done_callback(lambda _: done.set())
    if not wait_woken(done.wait, timeout):
        log.warning("the newest checkpoint in %s was not read within %g s (the store stopped answering?): the "
                    "final snapshot names none", checkpoint_dir, timeout)
        return None
    return read.result()


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _finite(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None
