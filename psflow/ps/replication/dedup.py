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
And the count of that process's pushes the state holds (``applied``; a checkpoint restore sets it back to the
checkpoint's: :meth:`DedupTable.restore_applied`), and the counts of every shard that process reported
(``acked_all``: a shard all of whose replicas were lost still has them known here). A shard applies the pushes
of one process in order, so those its state holds are the process's first ``applied`` ones plus those since a
restore, and the acknowledged ones its first ``acked``: per process ``max(0, acked - applied)``, summed, is
exactly the acknowledged pushes the state lacks (a push applied and checkpointed whose reply never came back is
not lost and hides no other process's loss): :func:`psflow.status.replication.replication_view` adds it up over
the members' ``Stats``.
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
        self._applied: dict[tuple[str, int], int] = {}
        self._acked_all: dict[tuple[str, int], list[int]] = {}
        #: False after a restore from a checkpoint without per-process counts (an older one): the loss is then
        #: counted from the shard's totals.
        self.exact = True

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
                self._applied[key] = self._applied.get(key, 0) + 1

    def report_acked(self, worker: str | None, incarnation: int | None, acked: int | None,
                     acked_all: tuple[int, ...] | None = None) -> None:
        """That process says this shard acknowledged ``acked`` of its pushes (None: not sent), and each shard
        ``acked_all`` of them (in shard order; None: not sent); the largest count reported is kept, each."""
        if worker is None:
            return
        key = (worker, incarnation or 0)
        with self._lock:
            if acked is not None and acked > self._acked.get(key, 0):
                self._acked[key] = acked
            if acked_all:
                kept = self._acked_all.setdefault(key, [])
                kept.extend([0] * (len(acked_all) - len(kept)))
                for shard, n in enumerate(acked_all):
                    if n > kept[shard]:
                        kept[shard] = n

    def acknowledged(self) -> int:
        """The pushes the client processes say this shard acknowledged: the sum of their largest reports."""
        with self._lock:
            return sum(self._acked.values())

    def acked_by(self, shard: int) -> list[list[Any]]:
        """``[[worker, incarnation, [count per shard]], ...]``: each process's acknowledged pushes of every shard as
        reported here (``shard``: this table's shard, whose own count is merged in)."""
        with self._lock:
            out: list[list[Any]] = []
            for key in sorted(set(self._acked) | set(self._acked_all)):
                counts = list(self._acked_all.get(key, ()))
                counts.extend([0] * (shard + 1 - len(counts)))
                counts[shard] = max(counts[shard], self._acked.get(key, 0))
                out.append([key[0], key[1], counts])
            return out

    def applied_by(self) -> list[list[Any]]:
        """``[[worker, incarnation, applied], ...]``: each client process's pushes the state holds (what a
        checkpoint saves; call while no push is applied)."""
        with self._lock:
            return [[key[0], key[1], n] for key, n in sorted(self._applied.items())]

    def restore_applied(self, rows: list[list[Any]] | None) -> None:
        """The state was restored from a checkpoint holding ``rows`` (an :meth:`applied_by`; None: a checkpoint
        without per-process counts): each process's count set to the checkpoint's, 0 for the others. The
        ``acked`` counts stay (the processes go on)."""
        applied: dict[tuple[str, int], int] = {}
        for row in rows or ():
            applied[(str(row[0]), int(row[1]))] = int(row[2])
        with self._lock:
            self._applied, self.exact = applied, rows is not None

    def export(self) -> list[list[Any]]:
        """The table as JSON: ``[[worker, incarnation, push_id, reply, seq, acked, applied, acked_all], ...]``
        (``push_id``, ``reply`` and ``seq`` null for a process that reported a count but has no push recorded); a
        last row ``["", 0, null, null, null, 0, false, []]`` when the per-process counts are not exact."""
        with self._lock:
            out: list[list[Any]] = []
            for key in sorted(set(self._last) | set(self._acked) | set(self._applied) | set(self._acked_all)):
                last = self._last.get(key)
                out.append([key[0], key[1], last.push_id if last else None, last.reply if last else None,
                            last.seq if last else None, self._acked.get(key, 0), self._applied.get(key, 0),
                            list(self._acked_all.get(key, ()))])
            if not self.exact:
                out.append(["", 0, None, None, None, 0, False, []])
            return out

    def load(self, rows: object) -> None:
        """Replaces the table with an :meth:`export` of the primary's."""
        table: dict[tuple[str, int], Recorded] = {}
        acked: dict[tuple[str, int], int] = {}
        applied: dict[tuple[str, int], int] = {}
        acked_all: dict[tuple[str, int], list[int]] = {}
        exact = True
        if isinstance(rows, list):
            for row in rows:
                if not (isinstance(row, list) and len(row) in (6, 8)):
                    continue
                if row[0] == "" and len(row) == 8 and row[6] is False:
                    exact = False
                    continue
                key = (str(row[0]), int(row[1]))
                if isinstance(row[3], dict):
                    table[key] = Recorded(int(row[2]), dict(row[3]), int(row[4]))
                if row[5]:
                    acked[key] = int(row[5])
                if len(row) == 8:
                    if row[6]:
                        applied[key] = int(row[6])
                    if isinstance(row[7], list) and row[7]:
                        acked_all[key] = [int(n) for n in row[7]]
        with self._lock:
            self._last, self._acked, self._applied, self._acked_all = table, acked, applied, acked_all
            self.exact = exact

    def __len__(self) -> int:
        with self._lock:
            return len(self._last)
