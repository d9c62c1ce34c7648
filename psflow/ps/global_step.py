"""The cluster's one global_step counter (it lives on ps task 0), and its durable bound.

Guarantee: :meth:`GlobalStep.increment` is atomic; every value it returns is
returned exactly once, so across all workers each step value belongs to
exactly one push. Values start at 1 for the first push (the counter starts at
0, or at the value restored from a checkpoint).

Across a restart of ps task 0 (with a :class:`StepJournal`): before the
counter hands out a value above the bound recorded in the journal file, it
records a new bound one block higher (temp file, fsync, rename). A restarted
process reads that bound as its :attr:`GlobalStep.floor`: every value any
earlier process handed out is at most the floor, so a restore that sets the
counter to ``max(checkpoint step, floor)`` never hands out a value twice. The
cost is one small synchronous file write per ``block`` steps; the price is a
gap of up to ``block`` step values that no push takes after a crash. A
replicated shard 0's backups keep one too (:meth:`GlobalStep.follow`: their
primary's values, a block at a time, and the run its journal names), so a
restore after the whole shard was lost finds that floor, and that run, on
whichever member it promoted; where none was promoted (every member restarted
empty), member 0, primary of the fresh shard, takes the highest floor of its
run from the others' journals first (:meth:`GlobalStep.adopt`).

Beside the bound, the journal keeps the exact last value (:attr:`StepJournal.live_path`): each value is
written there (8 bytes, no fsync) before it is handed out, with the id of the machine's boot. A killed
process's writes stay in the kernel's page cache, so a process restarted on the same boot takes that value as
its floor: a restore goes on right after the kill's step, and a learning-rate schedule or ``--max-steps``
loses no steps to the gap. After a reboot (the machine crashed: unsynced writes may be lost), or where the
file is missing or damaged, the floor is the fsync'd bound, as above.

The journal also names the run whose values it bounds (:meth:`GlobalStep.claim`: the chief's ``Register`` says its
run id; :attr:`GlobalStep.floor_run` is the one a restarted process read, ``StatsReply.step_run``). A chief
restarted with every ps task tells by it that the values were its own run's even before that run wrote a checkpoint
(:mod:`psflow.train.within_run`); a journal of another run (a ``--state-dir`` reused by a new run), or one written
before this field (no run), never says so. When a new run claims a journal of another run, its bound and the floor
restart at the counter's value: another run's values are not this run's to go past (neither by a restarted chief
nor by a restore at a new generation, whose global_step starts at the floor ``BeginRestore`` replies).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from functools import cache

from psflow import storage
from psflow.errors import PsError

__all__ = ["GlobalStep", "StepJournal", "StepJournalError", "DEFAULT_JOURNAL_BLOCK"]

#: Step values reserved per journal write. Larger: fewer fsyncs (one per block of pushes);
#: smaller: fewer step values skipped after ps task 0 is killed (at most one block).
DEFAULT_JOURNAL_BLOCK = 1000


class StepJournalError(PsError, RuntimeError):
    """The journal file cannot be read or written; names the file."""


class StepJournal:
    """A file holding an upper bound on every global_step value handed out.

    Not thread-safe by itself; :class:`GlobalStep` calls it under its lock.
    """

    def __init__(self, path: str, *, block: int = DEFAULT_JOURNAL_BLOCK) -> None:
        """Args:
            path: the journal file (its directory is created on the first write).
            block: step values reserved per write (> 0).

        Raises:
            ValueError: ``block`` is not positive.
        """
        if block <= 0:
            raise ValueError(f"journal block must be a positive number of steps, got {block}")
        self.path = path
        self.block = block
        #: the run named in the file, read by :meth:`load` (None: none, or a journal written before runs were named)
        self.run: str | None = None
        #: the open file of the exact last value (written by this process); -1: a write failed, no more notes
        self._live: int | None = None

    def load(self) -> int:
        """The recorded bound (0 when the file does not exist yet); sets :attr:`run` to the run the file names.

        Raises:
            StepJournalError: the file exists but is not a journal (it is left as it is).
        """
        try:
            with open(self.path, "rb") as f:
                text = f.read()
        except FileNotFoundError:
            return 0
        except OSError as e:
            raise StepJournalError(f"cannot read the global_step journal {self.path}: {e}") from e
        try:
            record = json.loads(text)
            bound, run = record["bound"], record.get("run")
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise StepJournalError(f"the global_step journal {self.path} is damaged ({text[:60]!r}); "
                                   f"move it away to start over (step values may then repeat)") from e
        if isinstance(bound, bool) or not isinstance(bound, int) or bound < 0:
            raise StepJournalError(f"the global_step journal {self.path} holds bound {bound!r:.40}, "
                                   f"not a non-negative integer")
        if run is not None and not isinstance(run, str):
            raise StepJournalError(f"the global_step journal {self.path} names run {run!r:.40}, not a string")
        self.run = run
        return bound

    @property
    def live_path(self) -> str:
        """The file of the exact last value (see the module docstring)."""
        return self.path + ".live"

    def last_value(self, bound: int) -> int | None:
        """The last value an earlier process wrote with :meth:`note` on this boot, if the file holds one of this
        boot at most ``bound`` (the durable bound); else None (no file, another boot, damaged: the bound counts)."""
        boot = _boot_id()
        if boot is None:
            return None
        try:
            with open(self.live_path, "rb") as f:
                data = f.read(_LIVE_SIZE + 1)
        except OSError:
            return None
        if len(data) != _LIVE_SIZE or data[:_LIVE_VALUE] != _live_header(boot):
            return None
        value = int.from_bytes(data[_LIVE_VALUE:], "little", signed=True)
        return value if 0 <= value <= bound else None

    def note(self, value: int) -> None:
        """Writes ``value`` as the exact last value (no fsync: it must outlive the process, not the machine).
        Best effort: where the file cannot be written, a restart falls back to the durable bound. The file never
        keeps a value below one handed out: the first write carries the value itself (no zero in between), and a
        failed write makes the file unreadable as a last value (truncated, else removed) and ends the notes.

        Raises:
            StepJournalError: a write failed and the file still holds an older value (it could be neither
                truncated nor removed): the value must not be handed out.
        """
        if self._live is None:
            boot = _boot_id()
            if boot is None:
                return
            record = _live_header(boot) + value.to_bytes(8, "little", signed=True)
            fd = -1
            try:
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
                fd = os.open(self.live_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                if os.write(fd, record) != len(record):
                    raise OSError(f"short write to {self.live_path}")
            except OSError:
                self._give_up(fd)  # empty or partial: not a last value
                return
            self._live = fd
            return
        if self._live < 0:
            return  # an earlier write failed: the bound counts
        try:
            if os.pwrite(self._live, value.to_bytes(8, "little", signed=True), _LIVE_VALUE) != 8:
                raise OSError(f"short write to {self.live_path}")
        except OSError:
            self._give_up(self._live)

    def _give_up(self, fd: int) -> None:
        """After a failed write of the last value: no further notes, and no value left in the file to read."""
        self._live = -1
        try:
            if fd >= 0:
                os.ftruncate(fd, 0)
                return
        except OSError:
            pass
        finally:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        try:
            os.unlink(self.live_path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StepJournalError(f"cannot write the exact global_step value to {self.live_path}, nor remove the "
                                   f"older value it holds: {e}") from e

    def record(self, bound: int, run: str | None = None) -> None:
        """Records ``bound`` durably (complete file or the previous one, never a partial one), for run ``run``
        (None: none named).

        Raises:
            StepJournalError: the file cannot be written.
        """
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            named = {} if run is None else {"run": run}
            storage.write_atomically(self.path, json.dumps({"bound": bound, **named}).encode())
        except OSError as e:
            raise StepJournalError(f"cannot write the global_step journal {self.path}: {e}") from e


_LIVE_MAGIC = b"psflow-global-step-live\n"
_LIVE_VALUE = 64  # the header (magic, boot id, padding), then the value: int64, little-endian
_LIVE_SIZE = _LIVE_VALUE + 8


@cache
def _boot_id() -> bytes | None:
    """This boot's id (Linux: ``/proc/sys/kernel/random/boot_id``); None where there is none."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return f.read().strip()[:_LIVE_VALUE - len(_LIVE_MAGIC)] or None
    except OSError:
        return None


def _live_header(boot: bytes) -> bytes:
    return (_LIVE_MAGIC + boot).ljust(_LIVE_VALUE, b"\0")


class GlobalStep:
    """A thread-safe monotonically increasing counter, optionally bounded by a :class:`StepJournal`."""

    def __init__(self, value: int = 0, *, journal: StepJournal | None = None) -> None:
        """Args:
            value: the starting value.
            journal: where the bound on handed-out values is kept across restarts.

        Raises:
            StepJournalError: the journal file is damaged.
        """
        self._value = value
        self._lock = threading.Lock()
        self._journal = journal
        self._bound = journal.load() if journal is not None else 0
        last = journal.last_value(self._bound) if journal is not None else None
        #: Every value an earlier process with this journal handed out is at most this (0: none): the last one,
        #: when it was killed on this boot, else the durable bound.
        self.floor = last if last is not None else self._bound
        #: The run whose values :attr:`floor` bounds, as the journal named it (None: not named); both restart at the
        #: counter where another run claims the journal (:meth:`claim`).
        self.floor_run = journal.run if journal is not None else None
        self._run = self.floor_run
        # run -> the highest floor other members' journals hold for it (:meth:`adopt` of another run): a claim of it
        self._heard: dict[str, int] = {}

    @property
    def value(self) -> int:
        """The current value (the step of the newest applied push)."""
        return self._value

    def increment(self) -> int:
        """Adds one and returns the new value; the caller owns that value alone.

        Raises:
            StepJournalError: the new bound could not be recorded (no value is handed out).
        """
        with self._lock:
            value = self._value + 1
            self._cover(value)
            if self._journal is not None:
                self._journal.note(value)
            self._value = value
            return value

    def reserve(self) -> None:
        """Records now the bound the next :meth:`increment` would record, unless the recorded one covers it
        already. The task holding global_step calls it when the cluster becomes ready (``SetReady``), so the
        first push's increment writes nothing: the journal's write (fsync included) happens before training,
        not in its first step. Idempotent; the guarantee, and the gap after a crash (up to one block), are the
        increments' (module docstring).

        Raises:
            StepJournalError: the bound could not be recorded.
        """
        with self._lock:
            self._cover(self._value + 1)

    @property
    def run(self) -> str | None:
        """The run the values handed out from now on are for (the newest :meth:`claim`'s; before any, the run the
        journal named; None: not named). What a replicated shard 0's backups record in their journals too."""
        return self._run

    def claim(self, run: str) -> None:
        """The values handed out from now on are run ``run``'s (the chief's ``Register`` names it): the journal
        says so from now on. Where it named another run, its bound restarts at the counter's value, which is noted
        first as the exact last value, and so does :attr:`floor` (:attr:`floor_run` is then ``run``): another run's
        values are not this run's to go past, not even by a restore at a new generation, which starts from the floor
        ``BeginRestore`` replies. Where it named none (a journal written before runs were named) its bound and floor
        are kept, as they may be this run's. Without a journal only :attr:`run` changes.

        Raises:
            StepJournalError: the journal could not be written.
        """
        with self._lock:
            self._claim(run)

    def _claim(self, run: str) -> None:
        """(Under the lock) :meth:`claim`; a floor another member's journal holds for ``run`` (:meth:`adopt`) is
        taken first: the counter's value or the bound then restarts at it where it is higher."""
        if run == self._run:
            return
        heard = self._heard.get(run, 0)  # dropped once claimed: a failed record keeps it for the next claim
        if self._journal is None:
            self.floor = max(self.floor, heard)
            self._run = run
            self._heard.pop(run, None)
            return
        bound = max(self._bound, self._value, heard)
        if self._run is not None:
            start = max(self._value, heard)
            self._journal.note(start)
            bound = start
            self.floor, self.floor_run = start, run
        elif heard > self.floor:
            self._journal.note(heard)
            self.floor, self.floor_run = heard, run
        self._journal.record(bound, run)
        self._bound, self._run = bound, run
        self._heard.pop(run, None)

    def _cover(self, value: int) -> None:
        """(Under the lock) records a bound one block past ``value`` if the recorded one is below it."""
        if self._journal is not None and value > self._bound:
            bound = value + self._journal.block - 1
            self._journal.record(bound, self._run)
            self._bound = bound

    def follow(self, value: int, *, run: str | None = None) -> None:
        """(A backup of a replicated shard 0, :mod:`psflow.ps.replication`) its primary's counter is at ``value``,
        each value of which the primary handed out for run ``run`` (its :attr:`run`; None: it names none). First the
        run is claimed as :meth:`claim` does (a journal naming another run, such as a ``--state-dir`` reused from an
        earlier run, restarts its bound and :attr:`floor` at this counter; one naming none keeps them; None claims
        nothing); then the recorded bound covers ``value``, one block at a time as :meth:`increment` records it (not
        a write and fsync per entry, as :meth:`set` would), and the last value is noted: ``value``, or :attr:`floor`
        where that is higher (a primary restarted empty after the whole shard was lost sends its counter, 0, before
        any restore set it past the floor: noted, a restart of this member on the same boot would read 0 as its
        floor, and a restore would hand the run's values out again). So a backup promoted hands values out for its
        primary's run, and, lost later with the rest of its shard, restarts with a floor past every value the shard
        handed out and names the run they were for.

        Raises:
            StepJournalError: the run or a higher bound could not be recorded.
        """
        with self._lock:
            if run is not None:
                self._claim(run)
            self._cover(value)
            if self._journal is not None:
                self._journal.note(max(value, self.floor))  # the floor is at most the bound: a last value
            self._value = value

    def handed_out(self) -> tuple[int, str | None]:
        """(A member of a replicated shard 0, its ``ReplicaStatus``) a bound on every value this process handed out
        or followed and every value its journal's earlier processes did (the higher of :attr:`floor` and the
        counter), and the run the journal names for them (:attr:`run`; None: none)."""
        with self._lock:
            return max(self.floor, self._value), self._run

    def adopt(self, floor: int, run: str | None) -> bool:
        """(The primary of a fresh replicated shard 0, :mod:`psflow.ps.replication.startup`) another member's
        journal bounds the values of run ``run`` at ``floor`` (its :meth:`handed_out`): where ``run`` is the run this
        journal names, :attr:`floor` rises to ``floor`` if that is higher, recorded first as the bound (fsync'd)
        and noted as the last value, so a restore at a new generation, or this process restarted, goes on past it.
        Where this journal holds nothing (no bound, no run: a lost ``--state-dir``), it takes ``floor`` and ``run``
        as its own. Another run's floor is not adopted (a ``--state-dir`` reused from an earlier run: that run's
        values are not this one's to go past) but kept: a later :meth:`claim` of that run starts at it (this
        journal named an earlier run than the one the others followed). The floor never goes down. Returns whether
        it rose.

        Raises:
            StepJournalError: the journal could not be written (the floor is raised in this process only).
        """
        with self._lock:
            empty = self._run is None and self._bound == 0 and self.floor == 0
            if run is not None and run != self._run and not empty:
                self._heard[run] = max(floor, self._heard.get(run, 0))
            if floor <= self.floor or run != self._run and not (empty and run is not None):
                return False
            self.floor, self.floor_run, self._run = floor, run, run  # first: raised in memory even if not recorded
            if self._journal is not None:
                self._journal.record(max(floor, self._bound), run)
                self._bound = max(floor, self._bound)
                self._journal.note(max(floor, self._value))
            return True

    def set(self, value: int) -> None:
        """Sets the counter (restore from a checkpoint); the recorded bound never goes down.

        Raises:
            StepJournalError: a higher bound could not be recorded.
        """
        with self._lock:
            if self._journal is not None:
                if value > self._bound:
                    self._journal.record(value, self._run)
                    self._bound = value
                self._journal.note(value)
            self._value = value
