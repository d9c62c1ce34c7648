"""A push's messages: ``Push`` (:class:`PushRequest`, with who pushes, :class:`WorkerTag`, and which step,
:class:`StepTag`) and its reply (:class:`PushReply`); and named gradients as a push's arrays, which the in-graph
``RunStep`` shares (:func:`gradient_arrays`). See :mod:`psflow.ps.protocol`; ``PushPull``, a push then a pull in
one call, is :mod:`psflow.ps.protocol.data`'s (with ``Register`` and ``Pull``).

As every message of the package: ``to_frame`` shares the gradients' arrays, no copy (except several sparse ones of
int64 rows sent stacked when asked, :attr:`PushRequest.stack`: one copy, :mod:`~psflow.ps.protocol.stacking`), and
``from_frame`` checks every field, raising :class:`~psflow.rpc.api.InvalidRequest` naming the first one wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from psflow.ps.protocol.fields import acked_counts, list_field, message, optional_int, optional_str, refuse
from psflow.ps.protocol.stacking import Stacker, blocks_of, cut, stack_grads
from psflow.rpc.api import InvalidRequest
from psflow.rpc.framing import Frame

__all__ = ["GradPart", "PushReply", "PushRequest", "StepTag", "WorkerTag", "gradient_arrays", "gradients_of", "held_push"]

# Array names: a gradient's values and its rows (a pull's: data.py; a PushPull frame holds both, so they differ).
_GRAD, _GRAD_ROWS = "g/", "i/"
# Stacked (psflow.ps.protocol.stacking): a push's gradients' values (one array per block) and rows; a push entry's kind.
_STACKED_GRADS, _STACKED_GRAD_ROWS = "gs/", "is/0"
_STACKED = "stacked"


# ---- tags ------------------------------------------------------------------------------------------------
@message
class WorkerTag:
    """Who pushes: the worker's task, its process (incarnation), the restore generation it trains in,
    and its reader position after the pushed batch (ReaderPosition JSON; recorded for checkpoints).

    Replicated shards (:mod:`psflow.ps.replication`): ``push_id`` numbers the client process's push calls
    (one more per call; a resend to a new primary keeps it: applied once), ``acked`` how many of this
    process's pushes this shard acknowledged before this one, ``acked_all`` the same count for every shard,
    in shard order (each shard keeps them: when every replica of one shard is lost, the others still know
    what it acknowledged). None: not sent (an unreplicated cluster).

    ``seq``: with more than one push in flight per ps task (``--steps-in-flight`` 3 or more), the push's
    number in its sequence to this ps task (0, 1, ...), ``stream`` that sequence (a process starts a new,
    higher one, e.g. after a recovery; both sent with ``incarnation``): the ps task applies them in that
    order (:mod:`psflow.ps.push_order`). None: applied on arrival."""

    worker: str | None = None
    incarnation: int | None = None
    generation: int | None = None
    position: str | None = None
    push_id: int | None = None
    acked: int | None = None
    acked_all: tuple[int, ...] | None = None
    stream: int | None = None
    seq: int | None = None


@message
class StepTag:
    """Which step a push belongs to: the step its parameters were read at, the worker's clock (ssp),
    the sync step it contributes to (``sync_tag``), and the newest global_step the worker heard of."""

    read_step: int | None = None
    clock: int | None = None
    sync_tag: int | None = None
    step_hint: int | None = None


#: One partition's gradient: ``(key, values, rows)``, rows the partition-local ones of a sparse gradient, else
#: None. A plain tuple: a step of a wide model pushes hundreds of them.
GradPart = tuple[str, np.ndarray, np.ndarray | None]


# ---- Push --------------------------------------------------------------------------------------------------
@message
class PushRequest:
    """Gradients for the partitions of one ps task, with who pushes (``worker``) and which step
    (``steps``). ``step``: increment global_step (only to the task holding it); ``examples`` and
    ``loss`` count the batch (sent with ``step``); ``shard_epoch``: (a replicated shard) the epoch of the
    view the client routes by; ``stack``: send several sparse gradients stacked (see :attr:`PullRequest.stack`;
    a push read from a frame: whether it came so)."""

    METHOD: ClassVar[str] = "Push"
    grads: Sequence[GradPart]
    worker: WorkerTag = WorkerTag()
    steps: StepTag = StepTag()
    step: bool = False
    examples: int = 0
    loss: float | None = None
    shard_epoch: int | None = None
    stack: bool = False

    def meta(self, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        """The push's meta fields; its gradient arrays are added to ``arrays``. A dense gradient is one array
        (``[key, "dense"]``). Several sparse ones of int64 rows are stacked (:mod:`~psflow.ps.protocol.stacking`):
        ``[key, "stacked", block, start, rows_start, count]``, the values ``count`` rows of block ``block`` from
        ``start``, the rows ``count`` ids of the stacked rows from ``rows_start``; otherwise each is two arrays
        (``[key, "sparse"]``)."""
        entries: list[list[Any]] = []
        stack = Stacker() if self.stack and stack_grads(self.grads) else None
        for key, values, rows in self.grads:
            if rows is None:
                arrays[_GRAD + key] = values
                entries.append([key, "dense"])
            elif stack is not None:
                block, start = stack.values(values)
                entries.append([key, _STACKED, block, start, stack.rows(rows), rows.shape[0]])
            else:
                arrays[_GRAD + key] = values
                arrays[_GRAD_ROWS + key] = rows
                entries.append([key, "sparse"])
        if stack is not None:
            stacked = stack.stacked_rows()
            if stacked is not None:
                arrays[_STACKED_GRAD_ROWS] = stacked
            arrays.update((f"{_STACKED_GRADS}{block}", v) for block, v in enumerate(stack.stacked_values()))
        tag, steps = self.worker, self.steps
        meta: dict[str, Any] = {"grads": entries}
        if tag.worker is not None:
            meta["worker"] = tag.worker
        if tag.incarnation is not None:
            meta["incarnation"] = tag.incarnation
        meta["step_hint"] = steps.step_hint
        if tag.generation is not None:
            meta["generation"] = tag.generation
        if steps.sync_tag is not None:
            meta["tag"] = steps.sync_tag
        if self.step:
            meta.update(step=True, examples=self.examples, loss=self.loss, read_step=steps.read_step,
                        clock=steps.clock)
        if tag.position is not None:
            meta["position"] = tag.position
        if tag.push_id is not None:
            meta["push_id"] = tag.push_id
        if tag.acked is not None:
            meta["acked"] = tag.acked
        if tag.acked_all is not None:
            meta["acked_all"] = list(tag.acked_all)
        if tag.seq is not None:
            meta["seq"] = tag.seq
            meta["stream"] = tag.stream
        if self.shard_epoch is not None:
            meta["shard_epoch"] = self.shard_epoch
        return meta

    def to_frame(self) -> Frame:
        arrays: dict[str, np.ndarray] = {}
        return Frame(self.meta(arrays), arrays)

    @classmethod
    def from_frame(cls, frame: Frame) -> PushRequest:
        meta, arrays = frame.meta, frame.arrays
        grads: list[GradPart] = []
        blocks: dict[int, np.ndarray] | None = None
        for item in list_field(meta, "grads"):
            if type(item) is not list or not (len(item) == 2 and item[1] in ("dense", "sparse")
                                              or len(item) == 6 and item[1] == _STACKED):
                raise InvalidRequest(f"push entry {item!r:.60} must be [name, 'dense'|'sparse'] or "
                                     "[name, 'stacked', block, start, rows_start, count]")
            key, kind = item[0], item[1]
            if type(key) is not str:
                raise InvalidRequest(f"variable name must be a string, got {key!r:.40}")
            if kind == _STACKED:
                if blocks is None:
                    blocks = blocks_of(arrays, _STACKED_GRADS)
                grads.append(_stacked_grad(arrays, blocks, key, item))
                continue
            values = arrays.get(_GRAD + key)
            if values is None:
                raise InvalidRequest(f"partition {key!r:.80}: gradient array missing")
            if kind == "dense":
                grads.append((key, values, None))
                continue
            rows = arrays.get(_GRAD_ROWS + key)
            if rows is None:
                raise InvalidRequest(f"partition {key!r:.80}: sparse gradient without rows")
            grads.append((key, values, rows))
        get = meta.get
        worker, incarnation, generation, position = get("worker"), get("incarnation"), get("generation"), get("position")
        read_step, clock, sync_tag, hint = get("read_step"), get("clock"), get("tag"), get("step_hint")
        examples, loss = get("examples", 0), get("loss")
        push_id, acked, epoch, acked_all = get("push_id"), get("acked"), get("shard_epoch"), get("acked_all")
        seq, stream = get("seq"), get("stream")
        # One test on the hot path; the slow path names the first field that is wrong.
        if not ((push_id is None or (type(push_id) is int and push_id >= 0)) and (acked is None or (
                type(acked) is int and acked >= 0)) and (epoch is None or (type(epoch) is int and epoch >= 0))
                and (worker is None or type(worker) is str) and (generation is None or (type(generation) is int
                and generation >= 0)) and (position is None or type(position) is str)
                and (incarnation is None or (type(incarnation) is int and incarnation >= 0 and worker is not None))
                and (read_step is None or type(read_step) is int) and (clock is None or type(clock) is int)
                and (sync_tag is None or type(sync_tag) is int) and (hint is None or type(hint) is int)
                and type(examples) is int and examples >= 0
                and (acked_all is None or (type(acked_all) is list and all(type(n) is int and n >= 0
                                                                           for n in acked_all)))
                and (seq is None and stream is None or (type(seq) is int and seq >= 0 and type(stream) is int
                                                        and stream >= 0 and incarnation is not None))):
            _refuse_push(meta)
        # progress only: anything but a number (a diverged loss travels as null) counts as none
        loss = float(loss) if isinstance(loss, (int, float)) and not isinstance(loss, bool) else None
        return cls(grads, WorkerTag(worker, incarnation, generation, position, push_id, acked,
                                    tuple(acked_all) if acked_all is not None else None, stream, seq),
                   StepTag(read_step, clock, sync_tag, hint), bool(get("step", False)), examples, loss, epoch,
                   blocks is not None)


def _stacked_grad(arrays: Mapping[str, np.ndarray], blocks: Mapping[int, np.ndarray], key: str,
                  item: list[Any]) -> GradPart:
    """The gradient of a push entry ``[key, "stacked", block, start, rows_start, count]``: views of the stacked
    arrays (``blocks``: the values' blocks by number).

    Raises:
        InvalidRequest: a block that is not an integer or a range outside its array (names the partition).
    """
    _, _, block, start, rows_start, count = item
    values = blocks.get(block) if type(block) is int else None
    return (key, cut(values, start, count, key, "stacked gradient values"),
            cut(arrays.get(_STACKED_GRAD_ROWS), rows_start, count, key, "stacked gradient rows"))


def _refuse_push(meta: Mapping[str, Any]) -> None:
    """Raises InvalidRequest naming the first field of a push's tags or counts that is wrong."""
    worker, incarnation = meta.get("worker"), meta.get("incarnation")
    if worker is not None and not isinstance(worker, str):
        raise refuse("worker", "a task name", worker)
    if incarnation is not None and (type(incarnation) is not int or incarnation < 0 or worker is None):
        raise InvalidRequest(f"'incarnation' must be a non-negative integer sent with 'worker', got "
                             f"{incarnation!r:.40} for {worker!r:.100}")
    optional_int(meta, "generation", minimum=0)
    optional_str(meta, "position")
    for key in ("read_step", "clock", "tag", "step_hint"):
        optional_int(meta, key)
    for key in ("push_id", "acked", "shard_epoch"):
        optional_int(meta, key, minimum=0)
    examples = meta.get("examples", 0)
    if type(examples) is not int or examples < 0:
        raise refuse("examples", "a non-negative integer", examples)
    acked_counts(meta, "acked_all")
    seq, stream = meta.get("seq"), meta.get("stream")
    if (seq, stream) != (None, None) and (type(seq) is not int or seq < 0 or type(stream) is not int or stream < 0
                                          or incarnation is None):
        raise InvalidRequest(f"'seq' and 'stream' must be non-negative integers sent together with 'incarnation', "
                             f"got {seq!r:.40} and {stream!r:.40}")
    raise AssertionError(f"a push's fields were refused but none is wrong: {meta!r:.200}")  # pragma: no cover


@message
class PushReply:
    """What a push produced (see :class:`psflow.ps.client.PushResult`). ``aggregated``: a sync push's
    reply, which carries ``accepted`` and ``completed``; ``held``: the step waits for a saving chief, send the
    same push again (:mod:`psflow.ps.save_hold`)."""

    step: int | None
    accepted: bool = True
    completed: bool = True
    min_clock: int | None = None
    aggregated: bool = False
    held: bool = False

    def meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"step": self.step}
        if self.aggregated:
            meta.update(accepted=self.accepted, completed=self.completed)
        if self.min_clock is not None:
            meta["min_clock"] = self.min_clock
        if self.held:
            meta["held"] = True
        return meta

    def to_frame(self) -> Frame:
        return Frame(self.meta())

    @classmethod
    def from_frame(cls, frame: Frame) -> PushReply:
        meta = frame.meta
        step, min_clock = meta.get("step"), meta.get("min_clock")
        if not ((step is None or type(step) is int) and (min_clock is None or type(min_clock) is int)):
            optional_int(meta, "step")  # raises, naming the field
            optional_int(meta, "min_clock")
        return cls(step, meta.get("accepted", True) is True, meta.get("completed", True) is True, min_clock,
                   "accepted" in meta, meta.get("held") is True)


def held_push(frame: Frame) -> bool:
    """Whether ``frame``, a Push's or a PushPull's reply, says the push is held (:attr:`PushReply.held`)."""
    return frame.meta.get("held") is True


def gradient_arrays(grads: Mapping[str, tuple[np.ndarray, np.ndarray | None]]) -> dict[str, np.ndarray]:
    """Named gradients (values, rows or None) as a frame's arrays, as a push carries them (in-graph ``RunStep``)."""
    arrays: dict[str, np.ndarray] = {}
    for name, (values, rows) in grads.items():
        if rows is not None:
            arrays[_GRAD_ROWS + name] = rows
        arrays[_GRAD + name] = values
    return arrays


def gradients_of(frame: Frame) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """The named gradients of a frame written by :func:`gradient_arrays`."""
    return {key[len(_GRAD):]: (values, frame.arrays.get(_GRAD_ROWS + key[len(_GRAD):]))
            for key, values in frame.arrays.items() if key.startswith(_GRAD)}

