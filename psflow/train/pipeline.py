"""More than one push in flight per worker (``--steps-in-flight K``, K >= 3): a round trip hidden behind
K-1 steps of the worker's work.

With K <= 2 (:class:`psflow.train.step.TrainStep`) a step waits for its own
push's reply before it returns, so a step never takes less than a round trip to
the ps tasks. :class:`PipelinedStep` keeps up to K-1 pushes in flight and
returns each push's result later, once it is the oldest: a call for batch i

1. computes batch i's gradients from its rows (pulled with push i-K's reply,
   or by a plain pull for the first batches);
2. when K-1 pushes are in flight, waits for the oldest (batch i-K+1's) and
   keeps the rows its reply carries (batch i+1's);
3. sends batch i's push with the pull of batch i+K's rows (``ahead[K-1]``);
4. returns the result of batch i-K+1's push, or None while the first K-1
   pushes fill the pipeline; :meth:`PipelinedStep.drain` collects the rest.

Guarantees:

* **Order.** Each ps task applies one worker's pushes in the order made: they
  are numbered and the ps task holds a push until its predecessor was handled
  (:mod:`psflow.ps.push_order`); after one is refused, none of the later ones
  is applied. So the reader position recorded with the last applied push is
  that of the last batch applied, and a restarted worker resumes after it.
* **Exactly once.** Each push is sent once and its result returned once, in
  the order of the batches (:meth:`~PipelinedStep.step`, then
  :meth:`~PipelinedStep.drain`); each returns the global_step its own update
  produced (unique in the cluster). A batch whose gradients were computed but
  whose push was never sent is never counted.
* **Staleness.** Batch i's gradients are computed from rows that lack this
  worker's own updates i-K+1 .. i-1 (K-1 of them; with 1 in flight, none).
  Another worker's updates are as stale as in async mode anyway.
* **Bounded.** At most K-1 calls per ps task in flight; the ps task holds at
  most K-2 of them waiting for their turn (each a handler thread).
* Between calls, pushes are in flight: other calls on the client (hooks,
  stats) run concurrently with them, which needs a carrier whose channels
  carry concurrent calls (gRPC; the TCP carrier serves one call per
  connection, so K >= 3 is refused there). Asynchronous mode only, an
  unreplicated cluster only (the configuration checks both).

Not thread-safe: one per training thread.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from psflow.data import Batch
from psflow.models.api import Model
from psflow.ps.client import ParameterClient, PendingPushPull
from psflow.rpc.api import RpcError
from psflow.train.config import MAX_STEPS_IN_FLIGHT
from psflow.train.step import ComputedBatch, PulledRows, StepResult, TrainStep

__all__ = ["PipelinedStep"]


@dataclass(frozen=True)
class _Sent:
    """A push in flight: its batch's gradients, the call, and the batch whose rows its reply carries."""

    computed: ComputedBatch
    pending: PendingPushPull
    rows_for: Batch | None        # as given (identity: a later call's batch)
    rows_prepared: Batch | None


class PipelinedStep:
    """K-1 pushes in flight per worker (see the module docstring).

    Args:
        model: the model.
        client: a connected, registered client whose layout is the model's (unreplicated, asynchronous).
        prepared: the input pipeline runs ``model.prepare``; otherwise this step runs it.
        steps_in_flight: K, 3 .. :data:`MAX_STEPS_IN_FLIGHT`.

    Raises:
        ValueError: ``steps_in_flight`` out of range, or the client is replicated or not asynchronous.
    """

    def __init__(self, model: Model, client: ParameterClient, *, prepared: bool = False,
                 steps_in_flight: int) -> None:
        if not (isinstance(steps_in_flight, int) and 3 <= steps_in_flight <= MAX_STEPS_IN_FLIGHT):
            raise ValueError(f"{client.client_name}: a pipelined step keeps 3 to {MAX_STEPS_IN_FLIGHT} steps in "
                             f"flight, got {steps_in_flight!r}")
        if client.router is not None or client.sync.mode != "async":
            raise ValueError(f"{client.client_name}: {steps_in_flight} steps in flight need an unreplicated cluster "
                             f"in async mode (this one: {client.sync.mode}"
                             f"{', replicated' if client.router is not None else ''})")
        self.parts = TrainStep(model, client, prepared=prepared)  # prepare, compute, results: as one step's
        self.client = client
        self.steps_in_flight = steps_in_flight
        self._in_flight: deque[_Sent] = deque()
        self._sent = 0
        client.start_ordered()

    @property
    def sent(self) -> int:
        """Pushes sent so far."""
        return self._sent

    @property
    def in_flight(self) -> int:
        """Pushes sent and not collected yet."""
        return len(self._in_flight)

    @property
    def full(self) -> bool:
        """Whether the next :meth:`step` returns a result (K-1 pushes in flight: it collects the oldest)."""
        return len(self._in_flight) >= self.steps_in_flight - 1

    def step(self, batch: Batch, *, ahead: Sequence[Batch] = (), clock: int | None = None,
             position: str | None = None, generation: int | None = None, pause: float = 0.0,
             lag: int = 0) -> StepResult | None:
        """Computes ``batch``'s gradients and sends its push; returns the oldest push's result once
        K-1 were in flight (:attr:`full`), else None.

        Args:
            batch: this call's batch (the one after the previous call's).
            ahead: the batches after it, as many as known (up to K): the K-th one's rows travel with
                this push.
            clock: this worker's iteration count, including this batch.
            position: the reader position just after ``batch`` (recorded with its push).
            generation: the restore generation (a ps task refuses the push if the cluster was restored).
            pause, lag: fault injection, as :class:`~psflow.train.step.TrainStep` has them.

        Raises:
            ModelError: the model asked for a variable it did not declare.
            RpcError: a ps task refused or failed a push (the pushes still in flight are collected
                first, their own errors noted).
        """
        client, parts, k = self.client, self.parts, self.steps_in_flight
        try:
            prepared, values, read_step = parts.rows_of(batch)  # (carried with push i-K's reply, or pulled)
            computed = parts.compute_batch(batch, prepared, values, read_step)
            if pause:
                time.sleep(pause)
            if lag and read_step is not None:
                parts.wait_for_step(read_step + lag)
            done = self._collect() if self.full else None
            target = ahead[k - 1] if len(ahead) >= k else None
            later = parts.prepare_lookups(target) if target is not None else None
            output = computed.output
            pending = client.send_push_pull(output.gradients, later[1] if later is not None else None,
                                            examples=computed.batch.num_examples, loss=output.loss, clock=clock,
                                            read_step=read_step, position=position, generation=generation,
                                            ordered=True)
        except BaseException as e:
            self.discard(e)
            raise
        self._in_flight.append(_Sent(computed, pending, target, later[0] if later is not None else None))
        self._sent += 1
        return done

    def drain(self) -> list[StepResult]:
        """Waits for every push in flight, oldest first; returns their results (blocks; raises as :meth:`step`)."""
        out = []
        try:
            while self._in_flight:
                out.append(self._collect())
        except BaseException as e:
            self.discard(e)
            raise
        self.parts.carried = None
        return out

    def _collect(self) -> StepResult:
        sent = self._in_flight.popleft()
        r, values = sent.pending.result()
        if sent.rows_for is not None and sent.rows_prepared is not None and values is not None:
            self.parts.carried = PulledRows(sent.rows_for, sent.rows_prepared, values, self.client.last_pull_step)
        return self.parts.result_of(sent.computed, r)

    def discard(self, cause: BaseException) -> None:
        """After ``cause`` (an error of this step or of its caller): waits for the pushes still in flight
        (their calls finished; each one's error noted on ``cause``) without returning their results, and
        forgets them; nothing is carried over."""
        while self._in_flight:
            try:
                self._in_flight.popleft().pending.result()
            except RpcError as e:
                cause.add_note(f"a push in flight failed too: {e}")
        self.parts.carried = None
