"""One training step of any model: pull, compute, push. Every path runs this step.

:class:`TrainStep` drives a :class:`~psflow.models.Model` through one batch, in
this order:

1. ``model.prepare(batch)``, unless the input pipeline already ran it
   (``prepared=True``: the reader process ran it);
2. ``model.lookups(batch)``, checked against the declared variables;
3. the pull of those rows (one RPC per ps task) -- skipped when the previous
   step already pulled them (the lookahead below);
4. ``model.compute(batch, values)``: loss, gradients, outputs; with a clip
   norm (``model.clip_gradient_norm``, the run's ``--clip-gradient-norm``),
   the gradients clipped by their global norm (:mod:`psflow.train.clipping`),
   which the step's metrics then report as ``grad_norm``;
5. the push of the gradients (one RPC per ps task). With ``next_batch``, the
   push and the next batch's pull travel together (``PushPull``): the ps
   tasks apply the push first and then read the rows, so the values are
   exactly those of a push followed by a pull, with half the round trips.

Steps in flight (``steps_in_flight=2``, asynchronous and ssp modes): the
push of batch t is sent, with the pull of batch t+2's rows, and batch t+1's
gradients are computed while it travels; the call for batch t returns once
that push replied, with batch t's result. So a round trip to the ps tasks
overlaps a step's compute instead of adding to it. Guarantees kept: one call
per ps task in flight per worker, the push of batch t+1 sent only after the
reply to batch t's (a ps task applies one worker's pushes in the order they
were made; the reader position recorded with the last applied push is that
of the last batch whose push was applied); each call returns the result of
its own batch's push; nothing is in flight between calls (hooks may use the
client). The price: batch t+1's gradients are computed from parameters
that lack this worker's own update of batch t (one own step staler than
with 1); another worker's updates are as stale as ever. A batch whose
gradients were computed but whose call never came (the loop stopped) is
never pushed: its examples are neither applied nor counted. Replicated ps
shards keep all of this: a push whose shard's primary dies while batch t+1
computes is resent, alone, to the promoted backup when its reply is
collected (:mod:`psflow.ps.failover`), and applied once (its ``push_id``).

One step in flight on replicated ps shards, asynchronous mode (:attr:`ParameterClient.acks_later
<psflow.ps.client.ParameterClient.acks_later>`): the push of batch t travels with batch t+1's pull, as above,
and the shards reply with the rows (read after the push was applied) before their backups acknowledged the
push; batch t+1's gradients are computed while the acknowledgement comes, and the call returns batch t's
result only once every shard acknowledged the push (``Acked``, :mod:`psflow.ps.replication.data_calls`). The
gradients are exactly those of one step in flight; what the backup's round trip costs overlaps the compute.
Kept as with two in flight: one call per shard in flight, push t+1 sent only after push t was acknowledged,
nothing in flight between calls, a batch computed whose call never came is never pushed, and a push whose
primary dies before its acknowledgement is resent alone to the promoted backup (applied once).

Three or more steps in flight (pushes in flight between calls, each result
returned later): :mod:`psflow.train.pipeline`, which uses this class's
per-batch parts (:meth:`TrainStep.prepare_lookups`,
:meth:`TrainStep.compute_batch`, :meth:`TrainStep.result_of`).

The push returns the global_step its own update produced (async and ssp: one
value per push, unique in the cluster; sync: the aggregated step, owned by
the one push that completed it). Used by between-graph workers, the
in-process fast path, in-graph workers (:func:`compute_gradients` when the
client averages) and sync and ssp modes.

Not thread-safe: one TrainStep per training thread (it keeps the lookahead).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from psflow.data import Batch
from psflow.gradients import Gradients, SparseGradient
from psflow.models.api import Lookups, Model, ModelError, ModelOutput
from psflow.placement import VariablePlacement
from psflow.ps.client import ParameterClient, PendingPushPull, PushResult
from psflow.rpc.api import RpcError
from psflow.train.clipping import clip_by_global_norm, valid_clip_norm

__all__ = ["TrainStep", "StepResult", "ComputedBatch", "PulledRows", "LazyMetrics", "compute_gradients",
           "check_lookups", "check_gradients"]

#: Seconds a ``lag`` straggler (fault injection) waits at most for global_step to move on.
LAG_WAIT_LIMIT = 5.0


class LazyMetrics(Mapping[str, float]):
    """A metrics dict computed on first access (AUC sorts the batch: a step whose metrics nobody reads skips it)."""

    def __init__(self, compute: Callable[[], Mapping[str, float]]) -> None:
        self._compute = compute
        self._values: Mapping[str, float] | None = None

    def _get(self) -> Mapping[str, float]:
        if self._values is None:
            self._values = dict(self._compute())
        return self._values

    def __getitem__(self, key: str) -> float:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


@dataclass(frozen=True)
class StepResult:
    """What one training step produced.

    Attributes:
        step: the global_step this push produced (see :class:`~psflow.ps.client.PushResult`).
        loss: the batch's mean loss (before the update).
        examples: examples in the batch.
        labels: the batch's labels.
        outputs: the model's per-example outputs (metric inputs) for the batch.
        metrics: the model's metrics of this batch, computed on first access.
        completed: this push owns ``step`` (sync: it completed the aggregation).
        accepted: False when the gradient was stale and dropped (sync).
        min_clock: ssp: the slowest live worker's clock when this one was let go.
    """

    step: int
    loss: float
    examples: int
    labels: np.ndarray
    outputs: Mapping[str, np.ndarray]
    metrics: Mapping[str, float]
    completed: bool = True
    accepted: bool = True
    min_clock: int | None = None


def check_lookups(model: Model, layout: Mapping[str, VariablePlacement], lookups: Lookups) -> None:
    """Raises ModelError if ``lookups`` names a variable the model did not declare."""
    unknown = [name for name in lookups if name not in layout]
    if unknown:
        raise ModelError(f"model {model.name!r} looks up variable {unknown[0]!r}, which it did not declare "
                         f"(declared: {', '.join(layout)})")


def check_gradients(model: Model, layout: Mapping[str, VariablePlacement], gradients: Gradients) -> None:
    """Raises ModelError if a gradient is for an undeclared or non-trainable variable, or has the wrong width."""
    for name, grad in gradients.items():
        placement = layout.get(name)
        if placement is None:
            raise ModelError(f"model {model.name!r} returned a gradient for variable {name!r}, which it did not declare "
                             f"(declared: {', '.join(layout)})")
        if not placement.var.trainable:
            raise ModelError(f"model {model.name!r} returned a gradient for variable {name!r}, which is not trainable")
        if isinstance(grad, SparseGradient) and grad.values.shape[1:] != tuple(placement.var.shape[1:]):
            raise ModelError(f"model {model.name!r}: sparse gradient of {name!r} has rows of shape {grad.values.shape[1:]}; "
                             f"the variable's rows have {tuple(placement.var.shape[1:])}")


def compute_gradients(model: Model, client: ParameterClient, batch: Batch) -> tuple[ModelOutput, int | None]:
    """Prepares ``batch``, pulls its rows and computes its gradients without pushing them.

    Returns the model's output and the global_step the values were read at
    (for a sync push of averaged gradients). Used by in-graph workers.
    """
    batch = model.prepare(batch)
    lookups = model.lookups(batch)
    check_lookups(model, client.layout, lookups)
    values = client.pull(lookups, create=True)
    output = model.compute(batch, values)
    check_gradients(model, client.layout, output.gradients)
    clip = _clip_norm(model)
    if clip is not None:
        output = ModelOutput(output.loss, clip_by_global_norm(output.gradients, clip)[0], output.outputs)
    return output, client.last_pull_step


def _clip_norm(model: Model) -> float | None:
    """The model's clip norm (see :attr:`Model.clip_gradient_norm`); raises ModelError unless None or finite > 0."""
    clip = model.clip_gradient_norm
    if clip is not None and not valid_clip_norm(clip):
        raise ModelError(f"model {model.name!r}: clip_gradient_norm must be a finite number > 0 (or None), got {clip!r}")
    return None if clip is None else float(clip)


def _metrics(model: Model, labels: np.ndarray, outputs: Mapping[str, np.ndarray], grad_norm: float | None) -> dict[str, float]:
    """The model's metrics of the batch, and ``grad_norm`` (the global norm before clipping) when the step clipped."""
    metrics = dict(model.metrics(labels, outputs))
    if grad_norm is not None:
        metrics["grad_norm"] = grad_norm
    return metrics


class PulledRows(NamedTuple):
    """A batch's rows, pulled with an earlier push (``PushPull``) and kept for the call that computes it."""

    given: Batch                     # the batch as the caller gave it (identity: the later call's)
    batch: Batch                     # prepared
    values: dict[str, np.ndarray]
    read_step: int | None            # the global_step they were read at


@dataclass(frozen=True)
class ComputedBatch:
    """A batch's gradients, computed and not pushed yet (steps in flight, :mod:`psflow.train.pipeline`)."""

    given: Batch                 # the batch as the caller gave it (identity: the next call's)
    batch: Batch                 # prepared
    output: ModelOutput          # gradients clipped
    grad_norm: float | None
    read_step: int | None


class TrainStep:
    """The step of ``model`` on the ps tasks ``client`` reaches (see the module docstring).

    Args:
        model: the model.
        client: a connected, registered client whose layout is the model's.
        prepared: the input pipeline runs ``model.prepare`` (the reader
            process); otherwise this step runs it.
        steps_in_flight: 1 (a step's push returns before the next step computes) or 2 (the next
            step computes while this one's push travels; see the module docstring).

    Raises:
        ValueError: ``steps_in_flight`` is not 1 or 2.
    """

    def __init__(self, model: Model, client: ParameterClient, *, prepared: bool = False,
                 steps_in_flight: int = 1) -> None:
        if steps_in_flight not in (1, 2):
            raise ValueError(f"{client.client_name}: steps_in_flight must be 1 or 2, got {steps_in_flight!r}")
        self.model = model
        self.client = client
        self.prepared = prepared
        self.steps_in_flight = steps_in_flight
        self.clip_norm = _clip_norm(model)
        #: The next batch's rows, pulled with a push (:meth:`rows_of` takes them); set by this step's push_pull,
        #: or by a :class:`~psflow.train.pipeline.PipelinedStep` that uses this step's parts.
        self.carried: PulledRows | None = None
        self._computed: ComputedBatch | None = None  # steps in flight: the next call's batch, its gradients computed

    def prepare_lookups(self, batch: Batch) -> tuple[Batch, Lookups]:
        """``batch`` prepared (unless the input pipeline did) and the rows it looks up, checked."""
        if not self.prepared:
            batch = self.model.prepare(batch)
        lookups = self.model.lookups(batch)
        check_lookups(self.model, self.client.layout, lookups)
        return batch, lookups

    def wait_for_step(self, step: int) -> None:
        """Polls global_step until it reaches ``step`` (or :data:`LAG_WAIT_LIMIT` s passed: the run may
        have ended, and nobody advances it any more)."""
        deadline = time.monotonic() + LAG_WAIT_LIMIT
        while self.client.global_step() < step and time.monotonic() < deadline:
            time.sleep(0.005)

    def __call__(self, batch: Batch, *, clock: int | None = None, pause: float = 0.0, lag: int = 0,
                 next_batch: Batch | None = None, position: str | None = None,
                 generation: int | None = None, after_next: Batch | None = None) -> StepResult:
        """Runs one step on ``batch``; blocks until the push returns.

        With ``next_batch``, the push and the next batch's pull travel in one
        RPC per ps task; the next call must then be for ``next_batch``
        (otherwise the pulled rows are dropped and pulled again).

        Args:
            batch: the examples of this step.
            clock: this worker's iteration count, including this one (ssp).
            pause: fault injection: seconds between pull and push (a slow worker
                whose gradient is computed from older parameters).
            lag: fault injection: before its push, wait until global_step is ``lag``
                past the step its parameters were read at (a straggler whose gradient
                is stale however fast the machine is); at most :data:`LAG_WAIT_LIMIT` s.
            next_batch: the batch of the next step, if any.
            position: the reader position just after ``batch`` (ReaderPosition JSON), sent with
                the push: checkpoints resume after this batch (None: not sent).
            generation: the restore generation this worker trains in, sent with the push (a ps
                task refuses it if the cluster was restored since; None: not checked).
            after_next: (2 steps in flight) the batch after ``next_batch``, if any: its rows travel
                with this push. The next call must be for ``next_batch`` (otherwise its computed
                gradients are dropped, never pushed, and it is computed again).

        Raises:
            ModelError: the model asked for a variable it did not declare.
            RpcError: a ps task refused or failed (nothing is retried).
        """
        if self.steps_in_flight == 2:
            return self._overlapped(batch, clock=clock, pause=pause, lag=lag, next_batch=next_batch,
                                    position=position, generation=generation, after_next=after_next)
        client = self.client
        computed = self._computed_of(batch)
        read_step, output, n = computed.read_step, computed.output, computed.batch.num_examples
        if pause:
            time.sleep(pause)
        if lag and read_step is not None:
            self.wait_for_step(read_step + lag)
        if next_batch is None:
            r = client.push_detailed(output.gradients, examples=n, loss=output.loss, clock=clock, read_step=read_step,
                                     position=position, generation=generation)
        elif client.acks_later:
            return self._rows_first(computed, next_batch, clock=clock, position=position, generation=generation)
        else:
            prepared_next, next_lookups = self.prepare_lookups(next_batch)
            r, next_values = client.push_pull(output.gradients, next_lookups, examples=n, loss=output.loss,
                                              clock=clock, read_step=read_step, position=position,
                                              generation=generation)
            self.carried = PulledRows(next_batch, prepared_next, next_values, client.last_pull_step)
        return self.result_of(computed, r)

    def compute_batch(self, given: Batch, batch: Batch, values: Mapping[str, np.ndarray],
                      read_step: int | None) -> ComputedBatch:
        """``batch``'s (``given`` prepared) gradients from ``values`` (read at ``read_step``), checked and clipped."""
        output = self.model.compute(batch, values)
        check_gradients(self.model, self.client.layout, output.gradients)
        grad_norm = None
        if self.clip_norm is not None:
            gradients, grad_norm = clip_by_global_norm(output.gradients, self.clip_norm)
            output = ModelOutput(output.loss, gradients, output.outputs)
        return ComputedBatch(given, batch, output, grad_norm, read_step)

    def rows_of(self, given: Batch) -> tuple[Batch, dict[str, np.ndarray], int | None]:
        """``given`` prepared, its rows and the step they were read at: the :attr:`carried` ones when they
        are ``given``'s (taken; any others dropped), else pulled now (one RPC per ps task; blocks)."""
        carry, self.carried = self.carried, None
        if carry is not None and carry.given is given:
            return carry.batch, carry.values, carry.read_step
        batch, lookups = self.prepare_lookups(given)
        values = self.client.pull(lookups, create=True)
        return batch, values, self.client.last_pull_step

    def _computed_of(self, given: Batch) -> ComputedBatch:
        """``given``'s gradients: those the previous call computed, when they are ``given``'s (taken; any others
        dropped, never pushed), else computed now."""
        computed, self._computed = self._computed, None
        if computed is None or computed.given is not given:
            computed = self.compute_batch(given, *self.rows_of(given))
        return computed

    def _rows_first(self, computed: ComputedBatch, next_batch: Batch, *, clock: int | None, position: str | None,
                    generation: int | None) -> StepResult:
        """One step in flight on replicated shards, async: pushes ``computed``'s gradients with ``next_batch``'s
        pull, computes ``next_batch``'s gradients from those rows (read after this push was applied) while the
        shards' backups acknowledge the push, then collects that (module docstring)."""
        client = self.client
        prepared_next, next_lookups = self.prepare_lookups(next_batch)
        output = computed.output
        pending = client.send_push_pull(output.gradients, next_lookups, examples=computed.batch.num_examples,
                                        loss=output.loss, clock=clock, read_step=computed.read_step,
                                        position=position, generation=generation, ack_later=True)
        values = pending.rows()
        following = self._compute_while(pending, next_batch, (prepared_next, values or {}, client.last_pull_step))
        r, _ = pending.result()
        self._computed = following
        return self.result_of(computed, r)

    def _overlapped(self, given: Batch, *, clock: int | None, pause: float, lag: int, next_batch: Batch | None,
                    position: str | None, generation: int | None, after_next: Batch | None) -> StepResult:
        """Two steps in flight: pushes ``given``'s gradients, computes ``next_batch``'s meanwhile (module docstring)."""
        client = self.client
        computed = self._computed_of(given)
        # Every pull happens before the push is sent: one call per ps task in flight, never two.
        upcoming = self.rows_of(next_batch) if next_batch is not None else None
        if pause:
            time.sleep(pause)
        if lag and computed.read_step is not None:
            self.wait_for_step(computed.read_step + lag)
        later: tuple[Batch, Lookups] | None = self.prepare_lookups(after_next) if after_next is not None else None
        output, n = computed.output, computed.batch.num_examples
        pending = client.send_push_pull(output.gradients, later[1] if later is not None else None, examples=n,
                                        loss=output.loss, clock=clock, read_step=computed.read_step,
                                        position=position, generation=generation)
        following = self._compute_while(pending, next_batch, upcoming)
        r, later_values = pending.result()
        if later is not None and after_next is not None and later_values is not None:
            self.carried = PulledRows(after_next, later[0], later_values, client.last_pull_step)
        self._computed = following
        return self.result_of(computed, r)

    def result_of(self, computed: ComputedBatch, r: PushResult) -> StepResult:
        """The :class:`StepResult` of ``computed``'s batch, whose push produced ``r``."""
        output = computed.output
        metrics = LazyMetrics(functools.partial(_metrics, self.model, computed.batch.labels, output.outputs,
                                                computed.grad_norm))
        return StepResult(r.step, output.loss, computed.batch.num_examples, computed.batch.labels, output.outputs,
                          metrics, r.completed, r.accepted, r.min_clock)

    def _compute_while(self, pending: PendingPushPull, given: Batch | None,
                       upcoming: tuple[Batch, dict[str, np.ndarray], int | None] | None) -> ComputedBatch | None:
        """``given``'s gradients, computed while ``pending`` travels; if that fails, ``pending`` is still
        collected (its connection freed; a failed push's error is chained) before the error is raised."""
        if given is None or upcoming is None:
            return None
        try:
            return self.compute_batch(given, *upcoming)
        except BaseException as e:
            _collect_quietly(pending, e)
            raise


def _collect_quietly(pending: PendingPushPull, cause: BaseException) -> PushResult | None:
    """Waits for ``pending`` after ``cause`` was raised; its own error (if any) is noted on ``cause``."""
    try:
        return pending.result()[0]
    except RpcError as e:
        cause.add_note(f"the push in flight failed too: {e}")
        return None
