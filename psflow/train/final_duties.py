"""A worker's chief duties once its data ended: hand them on, or write the run's final checkpoint.

A worker whose data ended while others still train resigns its lease (:func:`resign`), so the chief
duties go to a worker that still trains (it takes them back once none is left: :mod:`psflow.train.take_over`).
The last to finish (it did not hand its duties on) makes sure,
before its session ends, that it holds the lease confirmed by the service (:func:`end_duties`),
campaigning until elected if not (:func:`take_final_duties`, bounded by the lease's ttl and the connect
timeout), so its session's end writes the run's final checkpoint. Not elected in time while the directory
holds no final checkpoint fails the worker (nobody would write it); with one there, the holder's stands.
:func:`final_checkpoint` names the directory's final checkpoint for the worker's ``Done`` to the ps
tasks; it never raises (a read error is logged).

Called by :func:`psflow.train.worker.run_worker` (and :func:`final_checkpoint` by the in-graph client);
only :func:`take_final_duties` blocks.
"""

from __future__ import annotations

import logging
import os

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.errors import CheckpointError, TrainingError
from psflow.train.recovery import Leadership

__all__ = ["resign", "end_duties", "take_final_duties", "final_checkpoint"]

#: The worker's logger: these lines read as they did in the loop.
log = logging.getLogger("psflow.worker")


def resign(leadership: Leadership, task_index: int, reason: str) -> None:
    """(Its data ended, other workers still train) hands the chief duties on: resigns the lease, logged."""
    log.info("worker %d: finished its data (%s); waiting for the other workers", task_index, reason)
    leadership.resign()


def end_duties(leadership: Leadership, lease_ttl: float, connect_timeout: float, checkpoint_dir: str | None) -> None:
    """(Before its session ends) A worker that did not hand its duties on (the last to finish) makes sure it holds
    the lease, so its session's end writes the final checkpoint (:func:`take_final_duties` if not). Held means
    confirmed by the service (one renewal): a restarted ps task 0 forgets every embedded lease while the holder's
    own view of it lasts up to ``lease_ttl`` more, and another worker it elected meanwhile fenced the ps tasks
    at a newer epoch, so a save under the forgotten lease would be refused. (With replicated ps shards the table
    is replicated with shard 0 and the renewal finds the lease at its primary: it is forgotten only when every
    replica of shard 0 was lost at once.)"""
    if not leadership.resigned and leadership.confirmed_lease() is None:
        take_final_duties(leadership, lease_ttl, connect_timeout, checkpoint_dir)


def take_final_duties(leadership: Leadership, lease_ttl: float, connect_timeout: float,
                      checkpoint_dir: str | None) -> None:
    """(The last worker to finish, without the lease) campaigns until it holds it, so its session's end
    writes the final checkpoint. Blocks until elected: a dead holder's lease lapses within ``lease_ttl``,
    and a coordination service that is down serves again once its task is back (the embedded one lives
    on ps task 0; with replicated shards on shard 0's primary, a promoted backup serving the same leases),
    waited for as long as a worker waits for any ps task to come up (``connect_timeout``; at least
    ``lease_ttl`` + 2 s).

    Raises:
        TrainingError: not elected within that time while ``checkpoint_dir`` holds no final checkpoint:
            nobody would write this run's final model, and exiting 0 would leave an older checkpoint
            (the initial one, if no periodic save came) as the newest, which export and restore read.
    """
    limit = max(lease_ttl + max(2.0, lease_ttl / 2), connect_timeout)
    if leadership.campaign(timeout=limit) is not None:
        return
    if checkpoint_dir and final_checkpoint(checkpoint_dir) is None:
        newest = latest_checkpoint(checkpoint_dir)
        raise TrainingError(f"{leadership.candidate}: not elected chief within {limit:.1f} s after its data ended "
                            f"(the last worker to finish): no final checkpoint was written in {checkpoint_dir} "
                            f"(its newest: {os.path.basename(newest) if newest else 'none'})")
    log.warning("%s: not elected chief within %.1f s after its data ended; the final checkpoint is left to the "
                "holder", leadership.candidate, limit)


def final_checkpoint(directory: str | None) -> str | None:
    """The name of the newest checkpoint in ``directory`` if it is the run's final one (else None)."""
    final = newest_final(directory)
    return final[0] if final is not None else None


def newest_final(directory: str | None) -> tuple[str, int] | None:
    """(name, global_step) of the newest checkpoint in ``directory`` if it is marked final (else None; a read error
    is logged, never raised: what asks only reports it or decides whether to write again)."""
    if not directory:
        return None
    try:
        latest = latest_checkpoint(directory)
        manifest = read_manifest(latest) if latest is not None else None
    except (CheckpointError, OSError) as e:
        log.warning("could not read the final checkpoint in %s: %s", directory, e)
        return None
    if latest is None or manifest is None or not manifest.final:
        return None
    return os.path.basename(latest), manifest.global_step
