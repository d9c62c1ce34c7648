"""The dedup table of a replicated shard: exactly-once pushes across a failover.

Per (worker, incarnation) -- one client process -- the table keeps the last ``push_id`` applied and its
reply, and the sequence number of the entry that made it durable. It is part of the replicated state (every
entry carries it), so a promoted backup holds it too. Guarantees:

* a push whose ``push_id`` equals the recorded one gets the recorded reply again, without being applied
  (a client resending a push to a new primary after the old one died);
* an older ``push_id`` is refused (FAILED_PRECONDITION naming the worker and both ids);
* a push without ``push_id`` (an unreplicated client, a tool) is never checked.
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

    def export(self) -> list[list[Any]]:
        """The table as JSON: ``[[worker, incarnation, push_id, reply, seq], ...]``."""
        with self._lock:
            return [[w, i, r.push_id, r.reply, r.seq] for (w, i), r in sorted(self._last.items())]

    def load(self, rows: object) -> None:
        """Replaces the table with an :meth:`export` of the primary's."""
        table: dict[tuple[str, int], Recorded] = {}
        if isinstance(rows, list):
            for row in rows:
                if isinstance(row, list) and len(row) == 5 and isinstance(row[3], dict):
                    table[(str(row[0]), int(row[1]))] = Recorded(int(row[2]), dict(row[3]), int(row[4]))
        with self._lock:
            self._last = table

    def __len__(self) -> int:
        with self._lock:
            return len(self._last)
