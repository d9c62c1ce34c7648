"""What a run's driver reports when it finishes, and what the launcher takes from it for metrics.json.

A between-graph worker reports a :class:`WorkerResult` (its result file, ``result-worker-I.json``, and in
metrics.json's ``workers``); the in-graph client reports a dict (``result-client-0.json``, metrics.json's ``client``).
Both list the evaluations their chief duties did not do (``eval_not_done``, :func:`evaluations_not_done`): each a
``{"step", "final", "why", "task"}`` of the :class:`~psflow.train.hooks.EvalHook`'s
:attr:`~psflow.train.hooks.EvalHook.not_done` (not done: no ready model read in its time, a ps task being restored;
or failed: a ps task unreachable), ``final`` the evaluation at the session's end, ``task`` the process that tried it.
metrics.json's ``eval_not_done`` is every driver's, in order of step (:func:`eval_not_done`).

Not guaranteed: a process that exits without its result (killed, restarted, a failed run) reports none of its
evaluations; only the life of each task that ended normally does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from psflow.train.hooks import EvalHook

if TYPE_CHECKING:
    from psflow.train.session import MonitoredTrainingSession

__all__ = ["WorkerResult", "eval_not_done", "evaluations_not_done"]


@dataclass
class WorkerResult:
    """What a worker reports when it finishes."""

    task: str
    local_steps: int
    examples: int
    first_step: int | None
    last_step: int | None
    wall_seconds: float
    stop_reason: str
    stale_dropped: int = 0
    bad_records_skipped: int = 0
    cpu_seconds: float = 0.0          # CPU time of the worker process (all its threads)
    train_cpu_seconds: float = 0.0    # the part of it spent after start-up (connect, training, leave)
    eval_not_done: list[dict[str, Any]] = field(default_factory=list)  # evaluations_not_done(its session)


def evaluations_not_done(session: MonitoredTrainingSession) -> list[dict[str, Any]]:
    """The evaluations not done by ``session``'s evaluation hook (found inside the hooks wrapping it, e.g.
    :class:`~psflow.train.final_eval.FinalEvalOnce`, :class:`~psflow.train.leader_hooks.LeaderOnlyHook`,
    :class:`~psflow.train.deferred_end.DeferredEnd`: each holds it as ``inner``), as the result file lists them
    (module docstring); ``[]`` where it has none."""
    records = []
    for hook in session.hooks:
        while not isinstance(hook, EvalHook) and getattr(hook, "inner", None) is not None:
            hook = hook.inner  # type: ignore[attr-defined]
        if isinstance(hook, EvalHook):
            records += [{"step": n.step, "final": n.final, "why": n.why, "task": session.client.client_name}
                        for n in hook.not_done]
    return records


def eval_not_done(results: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """metrics.json's ``eval_not_done``: every result's ``eval_not_done`` (``results``: the drivers' result files;
    one without the field lists none), in order of step."""
    return sorted((r for result in results for r in result.get("eval_not_done") or ()), key=lambda r: int(r["step"]))
