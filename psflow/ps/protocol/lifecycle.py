"""A client's calls around the data path: Stats (a task's state and counters), Leave (a worker finished its
data), Done (its session ended), FinalEval (the final model's evaluation), SaveNotice (the chief is saving a
checkpoint), and Ack, the reply of a call that only acknowledges (see
:mod:`psflow.ps.protocol`; their semantics: :mod:`psflow.ps.service`, :mod:`psflow.ps.run_end`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any, ClassVar

from psflow.ps.protocol.fields import acked_counts, message, optional_int, optional_str, refuse, strict_bool
from psflow.rpc.framing import Frame

__all__ = ["Ack", "DoneReply", "DoneRequest", "FinalEvalReply", "FinalEvalRequest", "LeaveRequest", "SaveNoticeReply",
           "SaveNoticeRequest", "StatsReply", "restore_record"]


# ---- Stats / Leave / Done --------------------------------------------------------------------------
@message
class StatsReply:
    """A ps task's state (typed: what clients act on) and its counters (for progress lines and status pages).

    ``global_step``, ``step_floor`` and ``finished`` only on the task holding global_step (else None);
    ``step_run``: the run whose values ``step_floor`` bounds, as the global_step journal names it (None: none named);
    ``generation``: the restore generation; ``learning_rate``: the run optimizer's rate at the step the
    next update is applied at (None before registration); ``counters``: every other field, by name.
    ``restored_from`` and ``restored_from_step``: the checkpoint the restore of ``generation`` loaded on this task
    (``LoadShard``'s, every task's: a restore at start is generation 0's) and that checkpoint's own global_step,
    which global_step goes on past after a restore within the run; None where none did (yet: a ``BeginRestore``
    moved the generation on, its loads not come), a warm start (not a restore), or a task too old to say.
    """

    task: str
    global_step: int | None = None
    step_floor: int | None = None
    init_count: int = 0
    registered: bool = False
    ready: bool = False
    generation: int = 0
    mode: str = "async"
    finished: tuple[str, ...] | None = None
    learning_rate: float | None = None
    counters: Mapping[str, Any] = field(default_factory=dict)
    step_run: str | None = None
    restored_from: str | None = None
    restored_from_step: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """Every field by its wire name, counters included (what ``Stats`` replies)."""
        return {**self.counters, "task": self.task, "global_step": self.global_step, "step_floor": self.step_floor,
                "init_count": self.init_count, "registered": self.registered, "ready": self.ready,
                "generation": self.generation, "mode": self.mode,
                "finished": list(self.finished) if self.finished is not None else None,
                "learning_rate": self.learning_rate, "step_run": self.step_run,
                "restored_from": self.restored_from, "restored_from_step": self.restored_from_step}

    def to_frame(self) -> Frame:
        return Frame(self.as_dict())

    @classmethod
    def from_frame(cls, frame: Frame) -> StatsReply:
        meta = dict(frame.meta)
        finished, rate = meta.pop("finished", None), meta.pop("learning_rate", None)
        step_run = optional_str(meta, "step_run", max_length=200)
        restored = restore_record(meta)  # (None from an older task)
        for key in ("step_run", "restored_from", "restored_from_step"):
            meta.pop(key, None)
        if finished is not None and not (isinstance(finished, list) and all(isinstance(w, str) for w in finished)):
            raise refuse("finished", "a list of task names", finished)
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))):
            raise refuse("learning_rate", "a number", rate)
        reply = cls(str(meta.get("task", "")), optional_int(meta, "global_step"), optional_int(meta, "step_floor"),
                    optional_int(meta, "init_count") or 0, strict_bool(meta, "registered"), strict_bool(meta, "ready"),
                    optional_int(meta, "generation") or 0, str(meta.get("mode", "async")),
                    tuple(finished) if finished is not None else None, None if rate is None else float(rate))
        for key in ("task", "global_step", "step_floor", "init_count", "registered", "ready", "generation", "mode"):
            meta.pop(key, None)
        return cls(reply.task, reply.global_step, reply.step_floor, reply.init_count, reply.registered, reply.ready,
                   reply.generation, reply.mode, reply.finished, reply.learning_rate, meta, step_run,
                   *(restored or (None, None)))


def restore_record(stats: Mapping[str, Any]) -> tuple[str | None, int] | None:
    """(checkpoint, its global_step) the restore of a ps task's generation loaded there, from its ``Stats`` by wire
    name (:meth:`StatsReply.as_dict`, e.g. the launcher's figures of every task), or None where the task names none
    (:class:`StatsReply`'s ``restored_from``; an older task's reply).

    Raises:
        InvalidRequest: a field of another type (names it).
    """
    step = optional_int(stats, "restored_from_step", minimum=0)
    checkpoint = optional_str(stats, "restored_from", max_length=4096)
    return None if step is None else (checkpoint, step)


@message
class LeaveRequest:
    """A worker finished its data: sync and ssp stop waiting for it. ``acked``: (a replicated shard) how many
    of the client process's pushes this shard acknowledged, the final count (``acked_all``: every shard's, in
    shard order); ``incarnation``: that process (the count is its own, not a newer process's of the same
    worker; None: the worker's newest)."""

    METHOD: ClassVar[str] = "Leave"
    worker: str
    acked: int | None = None
    incarnation: int | None = None
    acked_all: tuple[int, ...] | None = None

    def to_frame(self) -> Frame:
        meta: dict[str, Any] = {"worker": self.worker}
        if self.acked is not None:
            meta["acked"] = self.acked
        if self.incarnation is not None:
            meta["incarnation"] = self.incarnation
        if self.acked_all is not None:
            meta["acked_all"] = list(self.acked_all)
        return Frame(meta)

    @classmethod
    def from_frame(cls, frame: Frame) -> LeaveRequest:
        worker = frame.meta.get("worker")
        if not isinstance(worker, str):
            raise refuse("worker", "the task name of the worker", worker)
        return cls(worker, optional_int(frame.meta, "acked", minimum=0), optional_int(frame.meta, "incarnation"),
                   acked_counts(frame.meta, "acked_all"))


@message
class Ack:
    """The reply of a call that only acknowledges (``Leave``, ``Shutdown``)."""

    def to_frame(self) -> Frame:
        return Frame({"ok": True})


@message
class DoneRequest:
    """A training worker's session ended normally (see :mod:`psflow.ps.run_end`)."""

    METHOD: ClassVar[str] = "Done"
    worker: str
    incarnation: int
    checkpoint_dir: bool = False
    final_checkpoint: str | None = None

    def to_frame(self) -> Frame:
        return Frame({"worker": self.worker, "incarnation": self.incarnation, "checkpoint_dir": self.checkpoint_dir,
                      "final_checkpoint": self.final_checkpoint})

    @classmethod
    def from_frame(cls, frame: Frame) -> DoneRequest:
        meta = frame.meta
        worker, incarnation = meta.get("worker"), meta.get("incarnation")
        if not isinstance(worker, str):
            raise refuse("worker", "a training worker's task name", worker)
        if type(incarnation) is not int or incarnation < 0:
            raise refuse("incarnation", "a non-negative integer", incarnation)
        return cls(worker, incarnation, strict_bool(meta, "checkpoint_dir"),
                   optional_str(meta, "final_checkpoint", max_length=200))


@message
class DoneReply:
    run_over: bool

    def to_frame(self) -> Frame:
        return Frame({"ok": True, "run_over": self.run_over})

    @classmethod
    def from_frame(cls, frame: Frame) -> DoneReply:
        return cls(strict_bool(frame.meta, "run_over"))


@message
class FinalEvalRequest:
    """(A worker holding the chief duties at its session's end) asks ps task 0 whether the final model at
    global_step ``step`` was evaluated already (``evaluated`` False), or records that ``worker`` evaluated it
    (True); see :mod:`psflow.ps.run_end` and :mod:`psflow.train.final_eval`."""

    METHOD: ClassVar[str] = "FinalEval"
    worker: str
    step: int
    evaluated: bool = False

    def to_frame(self) -> Frame:
        return Frame({"worker": self.worker, "step": self.step, "evaluated": self.evaluated})

    @classmethod
    def from_frame(cls, frame: Frame) -> FinalEvalRequest:
        meta = frame.meta
        worker, step = optional_str(meta, "worker", max_length=200), optional_int(meta, "step", minimum=0)
        if not worker:
            raise refuse("worker", "a task name", meta.get("worker"))
        if step is None:
            raise refuse("step", "a non-negative integer", None)
        return cls(worker, step, strict_bool(meta, "evaluated"))


@message
class FinalEvalReply:
    """The newest final evaluation the task recorded: its global_step and the worker that made it (None: none)."""

    step: int | None = None
    worker: str | None = None

    def to_frame(self) -> Frame:
        return Frame({"step": self.step, "worker": self.worker})

    @classmethod
    def from_frame(cls, frame: Frame) -> FinalEvalReply:
        return cls(optional_int(frame.meta, "step", minimum=0), optional_str(frame.meta, "worker", max_length=200))


# ---- SaveNotice ----------------------------------------------------------------------------------------
@message
class SaveNoticeRequest:
    """Worker ``writer`` (the chief) is saving a checkpoint into ``directory`` at global_step ``step``
    (``active``), sent at the save's start and again every ``renew_every`` seconds of the reply while it lasts;
    ``active`` False: the save is over (:mod:`psflow.ps.save_hold`). ``bound``: the save's ``--save-timeout``
    (seconds after its start past which it holds no step); ``incarnation``: the writer's process (a notice or a
    registration of a later one ends this one's save); ``save_id``: which save of that process (a counter, greater
    for each later save), so a notice of a save whose end was heard changes nothing (None: a client older than
    the field)."""

    METHOD: ClassVar[str] = "SaveNotice"
    writer: str
    directory: str
    step: int | None
    active: bool
    bound: float | None = None
    incarnation: int | None = None
    save_id: int | None = None

    def to_frame(self) -> Frame:
        return Frame({"writer": self.writer, "saving_into": self.directory, "step": self.step, "active": self.active,
                      "save_timeout": self.bound, "incarnation": self.incarnation, "save_id": self.save_id})

    @classmethod
    def from_frame(cls, frame: Frame) -> SaveNoticeRequest:
        meta = frame.meta
        writer = optional_str(meta, "writer", max_length=200)
        if not writer:
            raise refuse("writer", "a task name", meta.get("writer"))
        bound = meta.get("save_timeout")
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0):
            raise refuse("save_timeout", "a number > 0", bound)
        return cls(writer, optional_str(meta, "saving_into", max_length=2000) or "", optional_int(meta, "step", minimum=0),
                   strict_bool(meta, "active"), None if bound is None else float(bound),
                   optional_int(meta, "incarnation", minimum=0), optional_int(meta, "save_id", minimum=0))


@message
class SaveNoticeReply:
    """``renew_every``: seconds within which the notice is to be sent again while the save lasts (None: this
    task holds nothing for a save: no sync step; send no more)."""

    renew_every: float | None = None

    def to_frame(self) -> Frame:
        return Frame({"renew_every": self.renew_every})

    @classmethod
    def from_frame(cls, frame: Frame) -> SaveNoticeReply:
        value = frame.meta.get("renew_every")
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise refuse("renew_every", "a number > 0", value)
        return cls(None if value is None else float(value))
