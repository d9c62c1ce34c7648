"""The views a status snapshot shows, made from the tasks' answers: pure functions, no I/O.

:func:`busiest_ps` picks the ps task that costs most (bytes moved and apply time, each as its share);
:func:`restored_at` reads a restore's time from a ps task's ``generation``; :func:`sync_view`,
:func:`ssp_view` and :func:`ledger_view` give the ``sync``, ``ssp`` and ``checkpoints`` parts of a
snapshot (:mod:`psflow.status.collector`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["busiest_ps", "restored_at", "mark_busiest", "ps_index", "sync_view", "ssp_view", "ledger_view"]


def restored_at(generation: Any) -> float | None:
    """When the chief last restored a ps task (wall-clock seconds), from its ``generation``: 0 until
    a restore, then the restore's wall-clock time in milliseconds (:mod:`psflow.train.recovery`).
    None where there was no restore, or the number is not such a time (before 2001)."""
    if isinstance(generation, int) and not isinstance(generation, bool) and generation >= 10**12:
        return generation / 1000.0
    return None


def busiest_ps(rows: Sequence[Mapping[str, Any]]) -> int | None:
    """The index of the busiest ps task among a snapshot's ``ps`` rows, or None (fewer than two tasks,
    nothing moving, or a tie).

    Busy is what costs a ps task: the bytes it moves (gradients in plus rows out) and the time it
    spends applying updates, each as its share of all ps tasks' (a task's score is its share of the
    bytes plus its share of the apply time). Request counts do not count: every step pushes to and
    pulls from every ps task, so a task holding a 12-byte bias answers as many requests as one
    holding the embedding table. Per second over the last sample; where nothing moved in it (an idle
    or finished run), over the whole run (the counters' totals).
    """
    if len(rows) < 2:
        return None

    def measures(row: Mapping[str, Any], rates: bool) -> tuple[float, float]:
        source = (row.get("rates") or {}) if rates else row
        suffix = "_per_sec" if rates else ""
        moved = sum(float(source.get(k + suffix) or 0.0) for k in ("bytes_in", "bytes_out"))
        return moved, float(source.get("apply_seconds" + suffix) or 0.0)

    for rates in (True, False):
        values = [measures(r, rates) for r in rows]
        total_bytes, total_apply = sum(v[0] for v in values), sum(v[1] for v in values)
        if total_bytes > 0 or total_apply > 0:
            break
    else:
        return None
    scores = [(b / total_bytes if total_bytes else 0.0) + (a / total_apply if total_apply else 0.0) for b, a in values]
    best = max(scores)
    if scores.count(best) > 1:
        return None
    return int(rows[scores.index(best)]["index"])


def mark_busiest(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    busiest = busiest_ps(rows)
    for row in rows:
        row["busiest"] = row["index"] == busiest
    return rows


def ps_index(stats: Mapping[str, Any]) -> int | None:
    task = stats.get("task")
    if isinstance(task, str) and task.startswith("/job:ps/task:"):
        return int(task.rsplit(":", 1)[1])
    return None


def sync_view(head: Mapping[str, Any], every_ps: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The step being collected, over every ps task: each aggregates its own part of a sync step, so a
    worker stopped between its pushes to two ps tasks holds up only the one it has not reached yet
    (``per_ps``); ``contributed`` and ``waiting_for`` are the unions, ``waiting_seconds`` the longest wait.
    ``failed``: ps task -> why its step failed (timed out under ``--on-timeout fail``, or abandoned for a restore;
    the words of the refusal every push to it meets until a restore): such a step waits for nobody."""
    if head.get("mode") != "sync":
        return None
    contributed: list[str] = []
    waiting: list[str] = []
    longest: float | None = None
    per_ps = {}
    failed: dict[str, str] = {}
    for stats in every_ps:
        mine, missing = stats.get("sync_contributed") or [], stats.get("sync_waiting_for") or []
        contributed += [w for w in mine if w not in contributed]
        waiting += [w for w in missing if w not in waiting]
        seconds = stats.get("sync_waiting_seconds")
        if isinstance(seconds, (int, float)) and missing:
            longest = max(longest or 0.0, float(seconds))
        per_ps[str(stats.get("task"))] = {"contributed": mine, "waiting_for": missing, "waiting_seconds": seconds,
                                          "failed": stats.get("sync_failed")}
        if stats.get("sync_failed"):
            failed[str(stats.get("task"))] = str(stats["sync_failed"])
    return {"contributed": contributed, "waiting_for": waiting, "waiting_seconds": longest, "per_ps": per_ps,
            "failed": failed,
            "live_replicas": head.get("live_replicas"), "steps_applied": head.get("sync_steps_applied"),
            "timeouts": head.get("sync_timeouts"), "stale_dropped": head.get("stale_dropped")}


def ssp_view(head: Mapping[str, Any]) -> dict[str, Any] | None:
    if "ssp_clocks" not in head:
        return None
    return {"clocks": head.get("ssp_clocks") or {}, "lost": head.get("ssp_lost") or [], "waits": head.get("ssp_waits")}


def ledger_view(ledger: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if ledger is None:
        return None
    return {k: ledger.get(k) for k in ("saved", "failed", "failed_in_a_row", "last_saved_step", "last_saved_path")}
