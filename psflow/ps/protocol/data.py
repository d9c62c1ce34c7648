"""The data path's messages: Register, Pull, PushPull (see :mod:`psflow.ps.protocol`; the push's own messages,
Push with its tags, are :mod:`psflow.ps.protocol.push`'s; a client's calls around them, Stats, Leave and Done,
:mod:`psflow.ps.protocol.lifecycle`'s)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

import numpy as np

from psflow.optim import OptimizerSpec
from psflow.placement import VariablePlacement
from psflow.ps.protocol.fields import flag, list_field, message, optional_int, optional_str
from psflow.ps.protocol.push import PushReply, PushRequest
from psflow.ps.protocol.stacking import Stacker, cut, stack_rows, stack_values, values_of
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import InvalidRequest
from psflow.rpc.framing import Frame

__all__ = ["Request", "PullReply", "PullRequest", "PushPullReply", "PushPullRequest", "RegisterReply", "RegisterRequest"]

# Array names: a pull's rows (a push's: push.py; a PushPull frame holds both, so they differ), and stacked
# (psflow.ps.protocol.stacking) a pull's rows (a pull reply's values: stacking.STACKED_VALUES).
_PULL_ROWS, _STACKED_PULL_ROWS = "r/", "rs/0"


class Request(Protocol):
    """A request message: its call's name and its frame."""

    METHOD: ClassVar[str]

    def to_frame(self) -> Frame: ...


# ---- Register ----------------------------------------------------------------------------------------------
@message
class RegisterRequest:
    """A client's layout, optimizer and update mode; only the chief's call initializes. ``incarnation``: the client's
    process (None: not said): its own save holds on through its registration, an earlier process's ends
    (:mod:`psflow.ps.save_hold`). ``run``: the chief's run id, for global_step's journal (``GlobalStep.claim``).
    ``attempt``: (a chief's) the registration call of that process it belongs to, growing with each call (every
    resend of one call carries the same): a late copy of a call whose creation was loaded on since creates nothing
    (:meth:`~psflow.ps.restore_gate.RestoreGate.superseded`)."""

    METHOD: ClassVar[str] = "Register"
    layout: tuple[VariablePlacement, ...]
    optimizer: OptimizerSpec
    sync: SyncConfig
    client: str
    chief: bool = False
    defer_ready: bool = False
    incarnation: int | None = None
    run: str | None = None
    attempt: int | None = None

    def to_frame(self) -> Frame:  # incarnation, run and attempt omitted where None: as before them
        process = {k: v for k, v in (("incarnation", self.incarnation), ("step_run", self.run),
                                     ("attempt", self.attempt)) if v is not None}
        return Frame({"layout": [p.to_json() for p in self.layout], "optimizer": self.optimizer.to_json(),
                      "sync": self.sync.to_json(), "client": self.client, "chief": self.chief,
                      "defer_ready": self.defer_ready, **process})

    @classmethod
    def from_frame(cls, frame: Frame) -> RegisterRequest:
        meta = frame.meta
        try:
            layout = tuple(VariablePlacement.from_json(v) for v in list_field(meta, "layout"))
            optimizer = OptimizerSpec.from_json(meta.get("optimizer") or {})
            sync = SyncConfig.from_json(meta.get("sync"))
        except (ValueError, TypeError, KeyError) as e:
            raise InvalidRequest(f"bad layout or optimizer: {e}") from e
        return cls(layout, optimizer, sync, str(meta.get("client", "a client")), flag(meta, "chief"),
                   flag(meta, "defer_ready"), optional_int(meta, "incarnation", minimum=0), optional_str(meta, "step_run"),
                   optional_int(meta, "attempt", minimum=0))


@message
class RegisterReply:
    created: bool
    ready: bool
    init_count: int

    def to_frame(self) -> Frame:
        return Frame({"created": self.created, "ready": self.ready, "init_count": self.init_count})

    @classmethod
    def from_frame(cls, frame: Frame) -> RegisterReply:
        meta = frame.meta
        return cls(flag(meta, "created"), meta.get("ready", True) is True, optional_int(meta, "init_count") or 0)


# ---- Pull --------------------------------------------------------------------------------------------------
@message
class PullRequest:
    """Partitions to read: ``(key, partition-local rows)``, rows ``None`` for the whole partition.

    ``create``: a training lookup (dynamic tables count and admit ids); ``averages``: read moving
    averages instead of values (evaluation); ``step_hint``: the newest global_step the client heard of;
    ``shard_epoch``: (a replicated shard) the epoch of the view the client routes by; ``stack``: send the
    rows of several partitions stacked and ask for the reply's values stacked
    (:mod:`~psflow.ps.protocol.stacking`), which pays where the frames are encoded (a carrier), not where
    they are passed as they are (in-process); ``require_ready``: (an evaluation's read) refused unless the task is
    ready, and stays so at one generation through the read (:mod:`psflow.ps.ready_read`); sent only where set, so
    an older task reads as before and an older client's pull is not checked.
    """

    METHOD: ClassVar[str] = "Pull"
    parts: Sequence[tuple[str, np.ndarray | None]]
    create: bool = False
    averages: bool = False
    step_hint: int | None = None
    shard_epoch: int | None = None
    stack: bool = False
    require_ready: bool = False

    def meta(self, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        """The pull's meta fields; its rows arrays are added to ``arrays``: stacked into one (each entry
        ``[key, start, count]``) when several partitions are read by int64 rows, else one array each
        (``[key, name]``)."""
        entries: list[list[Any]] = []
        stack = Stacker() if self.stack and stack_rows(self.parts) else None
        for key, rows in self.parts:
            if rows is None:
                entries.append([key, None])
            elif stack is not None:
                entries.append([key, stack.rows(rows), rows.shape[0]])
            else:
                name = _PULL_ROWS + key
                arrays[name] = rows
                entries.append([key, name])
        stacked = stack.stacked_rows() if stack is not None else None
        if stacked is not None:
            arrays[_STACKED_PULL_ROWS] = stacked
        meta: dict[str, Any] = {"vars": entries, "create": self.create, "step_hint": self.step_hint}
        if self.averages:
            meta["averages"] = True
        if self.shard_epoch is not None:
            meta["shard_epoch"] = self.shard_epoch
        if self.stack:
            meta["stack"] = True
        if self.require_ready:
            meta["require_ready"] = True
        return meta

    def to_frame(self) -> Frame:
        arrays: dict[str, np.ndarray] = {}
        return Frame(self.meta(arrays), arrays)

    @classmethod
    def from_frame(cls, frame: Frame) -> PullRequest:
        meta, arrays = frame.meta, frame.arrays
        parts: list[tuple[str, np.ndarray | None]] = []
        stacked = arrays.get(_STACKED_PULL_ROWS)
        for item in list_field(meta, "vars"):
            if type(item) is not list or len(item) not in (2, 3):
                raise InvalidRequest(f"pull entry {item!r:.60} must be [name, rows] or [name, start, count]")
            key = item[0]
            if type(key) is not str:
                raise InvalidRequest(f"variable name must be a string, got {key!r:.40}")
            if len(item) == 3:
                parts.append((key, cut(stacked, item[1], item[2], key, "stacked rows")))
                continue
            name = item[1]
            if name is None:
                parts.append((key, None))
                continue
            rows = arrays.get(name) if type(name) is str else None
            if rows is None:
                raise InvalidRequest(f"partition {key!r:.80}: rows array {name!r:.40} missing")
            parts.append((key, rows))
        hint, epoch = meta.get("step_hint"), meta.get("shard_epoch")
        if hint is not None and type(hint) is not int:
            optional_int(meta, "step_hint")  # raises, naming it
        if epoch is not None and (type(epoch) is not int or epoch < 0):
            optional_int(meta, "shard_epoch", minimum=0)  # raises, naming it
        return cls(parts, meta.get("create") is True, meta.get("averages") is True, hint, epoch, meta.get("stack") is True,
                   meta.get("require_ready") is True)


@message
class PullReply:
    """The global_step the values belong to (on the task holding it), and each partition's values; ``stack``:
    several values travel stacked (the pull asked for it: :attr:`PullRequest.stack`)."""

    step: int | None
    values: Mapping[str, np.ndarray]
    stack: bool = False

    def to_frame(self) -> Frame:
        meta: dict[str, Any] = {"step": self.step}
        return Frame(meta, stack_values(self.values, meta) if self.stack else dict(self.values))

    @classmethod
    def from_frame(cls, frame: Frame) -> PullReply:
        return cls(optional_int(frame.meta, "step"), values_of(frame))


# ---- PushPull (a push, push.py, then a pull) ---------------------------------------------------------------
@message
class PushPullRequest:
    """A push, then a pull, in one call (the pull is a training lookup: ``create``)."""

    METHOD: ClassVar[str] = "PushPull"
    push: PushRequest
    pull: PullRequest

    def to_frame(self) -> Frame:
        arrays: dict[str, np.ndarray] = {}
        meta = self.pull.meta(arrays)
        meta.update(self.push.meta(arrays))  # the push's step_hint (the pull's is the same)
        return Frame(meta, arrays)

    @classmethod
    def from_frame(cls, frame: Frame) -> PushPullRequest:
        return cls(PushRequest.from_frame(frame), PullRequest.from_frame(frame))


@message
class PushPullReply:
    """The push's reply and the pulled values (``pull_step``: the step they belong to)."""

    push: PushReply
    pull: PullReply

    def to_frame(self) -> Frame:
        meta = self.push.meta()
        meta["pull_step"] = self.pull.step
        return Frame(meta, stack_values(self.pull.values, meta) if self.pull.stack else dict(self.pull.values))

    @classmethod
    def from_frame(cls, frame: Frame) -> PushPullReply:
        return cls(PushReply.from_frame(frame), PullReply(optional_int(frame.meta, "pull_step"), values_of(frame)))
