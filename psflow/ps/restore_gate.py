"""Whether a ps task takes pushes: its readiness and restore generation, and the pushes in flight.

States: *not ready* (fresh, or being restored) and *ready* (the chief
initialized or restored the task). Transitions: the chief's registration
creates the variables (ready unless the chief restores a checkpoint first);
``SetReady`` opens the gate (at a new generation after a restore);
``BeginRestore`` closes it at the restore's generation and waits for the
pushes in flight (:meth:`RestoreGate.drain`).

A push that carries a generation is refused (FAILED_PRECONDITION, before
anything is applied) when the task is not ready or holds another generation:
the worker's data position belongs to a model state that was rewound, so it
must re-read it first (:mod:`psflow.train.recovery`). A push without one (a
tool's) is not checked. Every admitted push is counted until it is released,
so a restore can wait for them.
"""

from __future__ import annotations

import threading

from psflow.rpc.api import PreconditionFailed

__all__ = ["RestoreGate"]


class RestoreGate:
    """Readiness, generation and pushes in flight of one ps task. Thread-safe."""

    def __init__(self, task_name: str) -> None:
        self.task_name = task_name
        # Entered as the plain lock (cheap: every push takes it twice); waited on through the condition.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._ready = False
        # 0 until a restore after a ps death; pushes naming another one are refused.
        self._generation = 0
        self._inflight = 0

    @property
    def ready(self) -> bool:
        """Whether the chief has initialized or restored this task."""
        return self._ready

    @property
    def generation(self) -> int:
        """The restore generation this task holds."""
        return self._generation

    def admit(self, generation: int | None) -> None:
        """Counts a push in (until :meth:`release`).

        Raises:
            PreconditionFailed: the push carries a generation and the task is not ready, or holds another.
        """
        with self._lock:
            if generation is not None:
                if not self._ready:
                    raise PreconditionFailed(f"{self.task_name} is not ready (being restored from a checkpoint)")
                if generation != self._generation:
                    raise PreconditionFailed(f"{self.task_name}: push of generation {generation!r:.20} refused: "
                                             f"the cluster was restored (generation {self._generation})")
            self._inflight += 1

    def release(self) -> None:
        """A push admitted by :meth:`admit` is done (applied or refused)."""
        with self._lock:
            self._inflight -= 1
            if not self._inflight:
                self._cond.notify_all()

    def initialized(self, *, ready: bool) -> None:
        """The chief created the variables here; ``ready``: not deferred to a restore (:meth:`open` later)."""
        with self._lock:
            self._ready = ready

    def open(self, generation: int | None = None) -> None:
        """``SetReady``: the chief finished initializing or restoring; after a restore, at ``generation``."""
        with self._lock:
            if generation is not None:
                self._generation = generation
            self._ready = True

    def close(self, generation: int) -> None:
        """``BeginRestore``: not ready at ``generation``; pushes of any other generation are refused from now on."""
        with self._lock:
            self._ready = False
            self._generation = generation

    def drain(self, timeout: float) -> bool:
        """Waits up to ``timeout`` s for the pushes in flight; True if they all finished."""
        with self._lock:
            return self._cond.wait_for(lambda: self._inflight == 0, timeout=timeout)

    def replica_state(self) -> dict[str, object]:
        """Readiness and generation (:mod:`psflow.ps.replication`)."""
        with self._lock:
            return {"ready": self._ready, "generation": self._generation}

    def load_replica_state(self, state: dict[str, object]) -> None:
        """Sets readiness and generation to ``state`` (a :meth:`replica_state` of the shard's primary)."""
        ready, generation = state.get("ready"), state.get("generation")
        with self._lock:
            if isinstance(ready, bool):
                self._ready = ready
            if isinstance(generation, int):
                self._generation = generation
