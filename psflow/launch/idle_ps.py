"""What a local run says of its ps tasks that hold none of the model's variables (:mod:`psflow.train.idle_tasks`).

With more ps tasks than the placement uses (``--ps 4`` for the two variables of ``logistic``) some hold nothing:
the launcher says so once the model is built (:func:`idle_line`: they only cost processes), and at the end which of
them were restarted (:func:`readmitted_lines`): such a task lost nothing, and the chief made it ready again at the
cluster's generation without a restore (nothing was restored, where the run's ``restore_loss`` says no restore
happened within the run; another task's loss may have caused one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TextIO

from psflow.ps.client import ParameterClient
from psflow.ps.idle import idle_tasks
from psflow.train.idle_tasks import tasks_named

__all__ = ["announce_idle", "idle_line", "idle_names", "readmitted_lines"]


def idle_names(client: ParameterClient, *, sync: bool) -> frozenset[str]:
    """The names of the ps tasks ``client``'s placement leaves idle (none: a sync run's tasks all take part in each
    step, a replicated or dynamic-table run's too)."""
    return frozenset() if sync else frozenset(f"/job:ps/task:{t}" for t in idle_tasks(client))


def idle_line(client: ParameterClient, *, sync: bool) -> str | None:
    """The line naming the ps tasks ``client``'s placement leaves idle (None: none does, :func:`idle_names`)."""
    idle = set() if sync else idle_tasks(client)
    if not idle:
        return None
    return (f"psflow: --ps {len(client.channels)} for {len(client.layout)} variable(s): {tasks_named(idle)} hold none "
            f"of them (idle: fewer ps tasks would do; one restarted comes back without a restore)")


def announce_idle(client: ParameterClient, *, sync: bool, out: TextIO | None, resilience: Any) -> None:
    """Once the model's placement is known: prints :func:`idle_line` (to ``out``, else stdout) where a task is idle,
    and tells ``resilience`` (:class:`~psflow.launch.resilience.Resilience`, or None) which tasks hold nothing: one
    that is not restarted stops the run, saying so (:meth:`~psflow.launch.supervisor.Supervisor.on_exit`)."""
    if (line := idle_line(client, sync=sync)) is not None:
        print(line, file=out, flush=True)
    if resilience is not None:
        resilience.idle_ps = idle_names(client, sync=sync)


def readmitted_lines(client: ParameterClient, restarts: Iterable[Mapping[str, Any]], *, sync: bool,
                     restored: bool, ps_stats: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per idle ps task restarted in the run (``restarts``: the supervisor's events, as metrics.json's
    ``restarts``); ``restored``: a restore within the run happened (``restore_loss`` is not None); ``ps_stats``: each
    ps task's ``Stats`` at the end (``task``, ``ready``): a task not ready then is not said to be made ready."""
    idle = idle_names(client, sync=sync)
    ready = {str(s.get("task")) for s in ps_stats if s.get("ready")}
    counts: dict[str, int] = {}
    for event in restarts:
        if event.get("restarted") and event.get("task") in idle:
            counts[event["task"]] = counts.get(event["task"], 0) + 1
    lines = []
    for task, n in sorted(counts.items()):
        then = ("it lost nothing and was made ready again" if task in ready else
                "it lost nothing (not ready again by the run's end: the model is whole without it)")
        lines.append(f"psflow: {task} restarted {n} time{'s' if n > 1 else ''} holding no variables: {then}"
                     + ("" if restored else "; nothing was restored"))
    return lines
