"""The dedup table of a replicated shard: exactly-once pushes across a failover.

Per (worker, incarnation) -- one client process -- the table keeps the last ``push_id`` applied and its
reply, and the sequence number of the entry that made it durable. It is part of the replicated state (every
entry carries it), so a promoted backup holds it too. Guarantees:

* a push whose ``push_id`` equals the recorded one gets the recorded reply again, without being applied
  (a client resending a push to a new primary after the old one died);
* an older ``push_id`` is refused (FAILED_PRECONDITION naming the worker and both ids);
* a push without ``push_id`` (an unreplicated client, a tool) is never checked.

The same key holds the largest ``acked`` count that process reported (its pushes this shard acknowledged,
sent with each push and, final, with its ``Leave``): :meth:`DedupTable.acknowledged` sums them, the shard's
``pushes_acknowledged``. Counted from the workers' own replies, so a push resent after a failover and
answered from this table counts once, and nothing is lost with a primary that dies before its next entry.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from psflow.rpc.api import PreconditionFailed

__all__ = ["DedupTable", "Recorded"]


@dataclass(frozen=True)
class Recorded:
    """The last push applied for one client process: its id, its reply (the reply frame's meta), its entry."""

    push_id: int
    reply: dict[str, Any]
    seq: int


class DedupTable:
    """(worker, incarnation) -> :class:`Recorded`. Thread-safe."""

    def __init__(self, task_name: str) -> None:
        self.task_name = task_name
        self._lock = threading.Lock()
        self._last: dict[tuple[str, int], Recorded] = {}
        self._acked: dict[tuple[str, int], int] = {}

    def check(self, worker: str | None, incarnation: int | None, push_id: int | None) -> Recorded | None:
        """The recorded reply when this push was applied already; None when it is new.

        Raises:
            PreconditionFailed: ``push_id`` is older than the last one applied for that process.
        """
        if push_id is None or worker is None:
            return None
        with self._lock:
            last = self._last.get((worker, incarnation or 0))
        if last is None or push_id > last.push_id:
            return None
        if push_id == last.push_id:
            return last
        raise PreconditionFailed(f"{self.task_name}: push {push_id} of {worker} (incarnation {incarnation}) is older "
                                 f"than push {last.push_id}, applied already: refused")

    def get(self, worker: str | None, incarnation: int | None, push_id: int | None) -> Recorded | None:
        """The record of exactly this push, if it is the last one recorded for its process (never raises)."""
        if push_id is None or worker is None:
            return None
        with self._lock:
            last = self._last.get((worker, incarnation or 0))
        return last if last is not None and last.push_id == push_id else None

    def record(self, worker: str | None, incarnation: int | None, push_id: int | None, reply: dict[str, Any],
               seq: int) -> None:
        """Push ``push_id`` of that process was applied with ``reply``, durable with entry ``seq``."""
        if push_id is None or worker is None:
            return
        key = (worker, incarnation or 0)
        with self._lock:
            last = self._last.get(key)
            if last is None or push_id > last.push_id:
                self._last[key] = Recorded(push_id, dict(reply), seq)

    def report_acked(self, worker: str | None, incarnation: int | None, acked: int | None) -> None:
        """That process says this shard acknowledged ``acked`` of its pushes (None: not sent); the largest
        count reported is kept."""
        if acked is None or worker is None:
            return
        key = (worker, incarnation or 0)
        with self._lock:
            if acked > self._acked.get(key, 0):
                self._acked[key] = acked

    def acknowledged(self) -> int:
        """The pushes the client processes say this shard acknowledged: the sum of their largest reports."""
        with self._lock:
            return sum(self._acked.values())

    def export(self) -> list[list[Any]]:
        """The table as JSON: ``[[worker, incarnation, push_id, reply, seq, acked], ...]`` (``push_id``,
        ``reply`` and ``seq`` null for a process that reported a count but has no push recorded)."""
        with self._lock:
            out = []
            for key in sorted(set(self._last) | set(self._acked)):
                last = self._last.get(key)
                out.append([key[0], key[1], last.push_id if last else None, last.reply if last else None,
                            last.seq if last else None, self._acked.get(key, 0)])
            return out

    def load(self, rows: object) -> None:
        """Replaces the table with an :meth:`export` of the primary's."""
        table: dict[tuple[str, int], Recorded] = {}
        acked: dict[tuple[str, int], int] = {}
        if isinstance(rows, list):
            for row in rows:
                if not (isinstance(row, list) and len(row) == 6):
                    continue
                key = (str(row[0]), int(row[1]))
                if isinstance(row[3], dict):
                    table[key] = Recorded(int(row[2]), dict(row[3]), int(row[4]))
                if row[5]:
                    acked[key] = int(row[5])
        with self._lock:
            self._last, self._acked = table, acked

    def __len__(self) -> int:
        with self._lock:
            return len(self._last)
