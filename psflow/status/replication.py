"""Replicated ps shards as a run reports them: which member is each shard's primary, each backup's lag, and
the acknowledged, applied and lost pushes (issue 28; the shards: :mod:`psflow.cluster.replicas`).

A ps member holding its shard's state (the primary, a backup of its view) answers ``Stats`` with a
``replication`` entry: ``shard``, ``role`` (``primary``, ``backup``, ``unreplicated``), ``epoch``, ``primary``,
``backups``, ``lag`` (per member the primary sends to, its backups and the members joining it: entries sent and
not acknowledged, and the seconds of the oldest), ``pushes_applied`` and ``pushes_acknowledged``, and per client
process ``acked_by_process`` (every shard's count of its acknowledged pushes it reported), ``applied_by_process``
(its pushes the state holds) and ``counts_exact``. A member without the state (restarted and rebuilding, or
deposed) refuses ``Stats`` (:mod:`psflow.ps.replication.control_calls`): a member joining shows in its primary's
``lag``, outside the view. From the replies of whichever members answered:

* :func:`shard_primaries` keeps one reply per shard, its primary's (the member saying ``primary`` at the
  highest epoch; while none does, mid-failover, the member at the highest epoch), so a shard's counters are
  counted once and never from a backup's copy that lags; a reply without the entry (a ps task of a psflow
  from before replication) is kept as it is.
* :func:`replication_view` adds the run's figures:

  ``pushes_acknowledged``  the pushes the workers were told were applied (each client process counts its
                           acknowledged pushes per shard and reports every shard's count to each shard it pushes
                           to: per process and shard the largest count any member heard, summed; so a shard whose
                           every replica was lost, and a worker process that ended meanwhile, are still counted)
  ``pushes_applied``       the pushes held in the shards' state now (a restore from a checkpoint sets the
                           count back to the checkpoint's)
  ``updates_lost``         per shard and client process ``max(0, acknowledged - applied)`` (the primary's
                           ``applied_by_process``; after a restore from a checkpoint without them, the same over
                           the shard's totals), summed: 0 while a shard keeps a member holding every acknowledged
                           push; only when every replica of a shard was lost at once and its state came back from
                           a checkpoint is it the acknowledged pushes the checkpoint lacks. Never negative: a push
                           applied and not yet acknowledged is not a lost one, nor does it hide another process's
                           lost push. A worker process that died with its shard may have had its last push
                           acknowledged without any other shard hearing of it: at most one per such process
  ``shards``               per shard: ``primary``, ``epoch``, ``backups`` (each ``task``, ``lag_entries``,
                           ``lag_seconds``), ``joining`` (the members rebuilding from the primary, not in its
                           view yet, likewise: ``lag_entries`` is what is queued for the member behind its
                           snapshot), its own three counters

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
    known = _acked_by_process(stats)
    for reply in shard_primaries(stats):
        entry = replication_entry(reply)
        shard = _int(entry.get("shard")) if entry is not None else None
        if entry is None or shard is None:
            continue
        applied = _int(entry.get("pushes_applied")) or 0
        acked = {process: counts[shard] for process, counts in known.items() if len(counts) > shard}
        # A member without the per-process figures (a psflow from before them): its own sum.
        acknowledged = sum(acked.values()) if known else _int(entry.get("pushes_acknowledged")) or 0
        by_process = _process_counts(entry.get("applied_by_process"))
        if known and by_process is not None and entry.get("counts_exact") is True:
            lost = sum(max(0, n - by_process.get(process, 0)) for process, n in acked.items())
        else:  # a restore from a checkpoint without per-process counts: the shard's totals
            lost = max(0, acknowledged - applied)
        totals["pushes_acknowledged"] += acknowledged
        totals["pushes_applied"] += applied
        totals["updates_lost"] += lost
        shards.append({
            "shard": shard, "primary": entry.get("primary") or reply.get("task"),
            "role": entry.get("role"), "epoch": _int(entry.get("epoch")),
            "backups": [_backup(name, entry) for name in _names(entry.get("backups"))],
            "joining": [_backup(name, entry) for name in _joining(entry)],
            "pushes_acknowledged": acknowledged, "pushes_applied": applied, "updates_lost": lost,
        })
    if not shards:
        return None
    return {**totals, "shards": shards}


def _acked_by_process(stats: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int], list[int]]:
    """(worker, incarnation) -> the largest count of its acknowledged pushes any member heard, per shard: every
    member's ``acked_by_process`` (a member of another shard knows a lost shard's counts)."""
    known: dict[tuple[str, int], list[int]] = {}
    for reply in stats:
        entry = replication_entry(reply)
        rows = entry.get("acked_by_process") if entry is not None else None
        for row in rows if isinstance(rows, list) else ():
            if not (isinstance(row, list) and len(row) == 3 and isinstance(row[2], list)):
                continue
            key = (str(row[0]), _int(row[1]) or 0)
            kept = known.setdefault(key, [])
            counts = [_int(n) or 0 for n in row[2]]
            kept.extend([0] * (len(counts) - len(kept)))
            for shard, n in enumerate(counts):
                kept[shard] = max(kept[shard], n)
    return known


def _process_counts(rows: Any) -> dict[tuple[str, int], int] | None:
    """``[[worker, incarnation, n], ...]`` as a mapping (None: not a list)."""
    if not isinstance(rows, list):
        return None
    return {(str(r[0]), _int(r[1]) or 0): _int(r[2]) or 0 for r in rows if isinstance(r, list) and len(r) == 3}


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


def _joining(entry: Mapping[str, Any]) -> list[str]:
    """The members a primary sends to outside its view (its ``lag`` names them: each a Join's sender), in order."""
    lag = entry.get("lag")
    if entry.get("role") != "primary" or not isinstance(lag, Mapping):
        return []
    view = {*_names(entry.get("backups")), str(entry.get("primary"))}
    return sorted(str(name) for name in lag if str(name) not in view)


def _names(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
