"""Replicated ps shards as a run reports them: which member is each shard's primary, each backup's lag, and
the acknowledged, applied and lost pushes (issue 28; the shards: :mod:`psflow.cluster.replicas`).

Every ps member (a ``ps`` or ``ps_backup`` task) answers ``Stats`` with a ``replication`` entry: ``shard``,
``role`` (``primary``, ``backup``, ``joining``, ``deposed``, ``unreplicated``), ``epoch``, ``primary``,
``backups``, ``lag`` (per backup: entries sent and not acknowledged, and the seconds of the oldest),
``pushes_applied`` and ``pushes_acknowledged``. From the replies of whichever members answered:

* :func:`shard_primaries` keeps one reply per shard, its primary's (the member saying ``primary`` at the
  highest epoch; while none does, mid-failover, the member at the highest epoch), so a shard's counters are
  counted once and never from a backup's copy that lags; a reply without the entry (a ps task of a psflow
  from before replication) is kept as it is.
* :func:`replication_view` adds the run's figures:

  ``pushes_acknowledged``  the pushes the workers were told were applied (each client process counts its
                           acknowledged pushes per shard and reports the count to the shard, which sums them)
  ``pushes_applied``       the pushes held in the shards' state now (a restore from a checkpoint sets the
                           count back to the checkpoint's)
  ``updates_lost``         per shard ``max(0, acknowledged - applied)``, summed: 0 while a shard keeps a member
                           holding every acknowledged push; only when every replica of a shard was lost at once
                           (or an unreplicated shard died) and its state came back from a checkpoint is it the
                           acknowledged pushes the checkpoint lacks. Never negative: a push applied and not yet
                           acknowledged is not a lost one
  ``shards``               per shard: ``primary``, ``epoch``, ``backups`` (each ``task``, ``lag_entries``,
                           ``lag_seconds``), its own three counters

Pure: reads nothing, changes nothing; tests feed it recorded replies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psflow.cluster import ClusterSpec
from psflow.cluster.replicas import BACKUP_JOB, PS_JOB

__all__ = ["REPLICATION_FIGURES", "ps_members", "replication_entry", "replication_view", "shard_primaries"]

#: The run's replication figures, at the top of metrics.json and the status snapshot.
REPLICATION_FIGURES = ("pushes_acknowledged", "pushes_applied", "updates_lost")


def ps_members(cluster: ClusterSpec) -> list[tuple[str, str]]:
    """(name, address) of every ps shard member: the ps tasks in order, then the ``ps_backup`` tasks (none in
    an unreplicated cluster)."""
    return [(f"/job:{job}/task:{i}", cluster.task_address(job, i))
            for job in (PS_JOB, BACKUP_JOB) if job in cluster.jobs for i in cluster.task_indices(job)]


def replication_entry(stats: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ``replication`` entry of one member's ``Stats`` reply, or None where it has none."""
    entry = stats.get("replication")
    return entry if isinstance(entry, Mapping) else None


def shard_primaries(stats: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One ``Stats`` reply per shard, its primary's, in shard order; replies without a ``replication`` entry
    (or without a shard) follow, as given. See the module docstring."""
    best: dict[int, tuple[tuple[int, int], Mapping[str, Any]]] = {}
    plain: list[dict[str, Any]] = []
    for reply in stats:
        entry = replication_entry(reply)
        shard = _int(entry.get("shard")) if entry is not None else None
        if entry is None or shard is None:
            plain.append(dict(reply))
            continue
        rank = (1 if entry.get("role") in ("primary", "unreplicated") else 0, _int(entry.get("epoch")) or 0)
        if shard not in best or rank > best[shard][0]:
            best[shard] = (rank, reply)
    return [dict(best[k][1]) for k in sorted(best)] + plain


def replication_view(stats: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The run's replication figures from the members' ``Stats`` replies (any order, any subset of the members;
    see the module docstring); None when no reply has a ``replication`` entry."""
    shards = []
    totals = dict.fromkeys(REPLICATION_FIGURES, 0)
    for reply in shard_primaries(stats):
        entry = replication_entry(reply)
        if entry is None or _int(entry.get("shard")) is None:
            continue
        acknowledged = _int(entry.get("pushes_acknowledged")) or 0
        applied = _int(entry.get("pushes_applied")) or 0
        lost = max(0, acknowledged - applied)
        totals["pushes_acknowledged"] += acknowledged
        totals["pushes_applied"] += applied
        totals["updates_lost"] += lost
        shards.append({
            "shard": _int(entry.get("shard")), "primary": entry.get("primary") or reply.get("task"),
            "role": entry.get("role"), "epoch": _int(entry.get("epoch")),
            "backups": [_backup(name, entry) for name in _names(entry.get("backups"))],
            "pushes_acknowledged": acknowledged, "pushes_applied": applied, "updates_lost": lost,
        })
    if not shards:
        return None
    return {**totals, "shards": shards}


def _backup(name: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """One backup's lag as its primary reports it: ``lag[name]`` is the entries not acknowledged, a pair
    (entries, seconds of the oldest), or a mapping with ``entries`` and ``seconds``; ``lag_seconds[name]``
    where given beside it."""
    lag = entry.get("lag")
    value = lag.get(name) if isinstance(lag, Mapping) else None
    if isinstance(value, Mapping):
        entries, seconds = value.get("entries"), value.get("seconds")
    elif isinstance(value, (list, tuple)) and len(value) == 2:
        entries, seconds = value
    else:
        entries, seconds = value, None
    if seconds is None and isinstance(entry.get("lag_seconds"), Mapping):
        seconds = entry["lag_seconds"].get(name)
    return {"task": name, "lag_entries": _int(entries), "lag_seconds": _float(seconds)}


def _names(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
