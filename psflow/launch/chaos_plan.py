"""A ``--chaos`` plan: the grammar of a spec, the task each fault names, and the checks made before anything starts.

Grammar (one fault per spec)::

    SPEC   := ACTION ":" TARGET "@step=" N
    ACTION := "kill"          SIGKILL the task
            | "stop"          SIGSTOP the task (it hangs; it is not resumed)
    TARGET := JOB ":" INDEX   e.g. ps:1, worker:0; client:0 (an in-graph run's client)
            | "chief"         the task holding the chief duties when the fault fires
            | "ps-backup:" N  (--ps-replicas) one of ps shard N's backups

e.g. ``kill:ps:1@step=200``, ``kill:chief@step=50``, ``stop:worker:1@step=30``.

With replicated ps shards (``--ps-replicas``), ``ps:N`` is shard N's *current* primary and
``ps-backup:N`` one of its backups, asked of the shard's members when the fault fires
(:mod:`psflow.launch.shard_targets`; the fault waits while a failover leaves none); without them
``ps-backup`` is refused, naming the flag. Every target of a round is read before any of its faults is
signalled, so ``kill:ps:0@step=S,kill:ps-backup:0@step=S`` kills every replica of shard 0 at once.

An in-graph run's client (``/job:client/task:0``) is no task of the cluster,
yet a fault may name it (``kill:client:0``): it is the run's chief, so
``chief`` names it too. A ``stop`` of it is refused: it has no hang detection
(it serves no liveness check), so nothing would end the stop.

``chief`` is whoever holds the chief duties at the moment the fault fires:
in a run whose workers elect their chief (checkpoints, summaries or
evaluation: :func:`psflow.train.duties.elects_chief`), the holder of the
``chief`` lease, asked from the coordination backend (the launcher passes
``holder``); the fault waits while no worker holds it (a dead holder's lease
lapses within the lease time). Without election, the configured chief
(task 0 of job 'chief', else worker 0). The fault records the lease epoch it
saw (``lease_epoch``), so it can be matched with the victim's
``elected chief (epoch E)`` log line.

A ``stop`` fault takes no duration: its task stays stopped until hang detection (``--liveness-timeout``) kills it
(the restart policy or the failure report then takes over) or someone resumes it (``kill -CONT PID``). With
``--liveness-timeout 0`` nothing ends it: the run waits for it (the launcher says so in one line at the start:
:func:`stop_without_liveness`). A spec with anything after its step (a duration) is refused, naming the spec.

One process, one fault at a time: two specs of the same round (the same ``N``) that name the
same task -- also through ``chief``, counted as the configured chief (worker 0
when the cluster has no ``chief`` job) -- are refused before anything starts,
with an error naming both specs (one signal would be lost, or a SIGKILL would
hit a process just SIGSTOPped). The same task in different rounds is allowed
(:mod:`psflow.launch.chaos`: the later fault hits the replacement process).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from psflow.cluster import ClusterError, ClusterSpec
from psflow.cluster.replicas import ps_replicas
from psflow.launch.shard_targets import BACKUP_TARGET, SHARD_TARGETS, check_shard_fault
from psflow.train.config import ConfigError

__all__ = ["ChaosError", "ChaosPlan", "DutyHolder", "Fault", "IN_GRAPH_CLIENT", "chief_task", "stop_without_liveness"]

_SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}
_SPEC = re.compile(r"^(?P<action>[a-z]+):(?P<target>chief|(?P<job>[A-Za-z_][A-Za-z0-9_-]*):(?P<index>\d+))"
                   r"@step=(?P<step>\d+)$")

_SPEC_HEAD = re.compile(_SPEC.pattern.rstrip("$"))  # a spec's valid start, followed by more: a duration, say


class ChaosError(ConfigError):
    """A --chaos spec is malformed or names a task that is not in the cluster."""


@dataclass(frozen=True)
class Fault:
    """One fault to inject: ``action`` on a task once global_step reaches ``step``.

    ``job`` is ``None`` for the chief (resolved against the cluster).
    """

    spec: str
    action: str
    job: str | None
    index: int | None
    step: int

    @classmethod
    def parse(cls, spec: str) -> Fault:
        """Parses one spec.

        Raises:
            ChaosError: names the spec and what is wrong, with an example.
        """
        text = spec.strip()
        m = _SPEC.match(text)
        if m is None and (head := _SPEC_HEAD.match(text)) is not None:
            raise ChaosError(f"bad --chaos {spec!r}: nothing may follow @step={head['step']} (got "
                             f"{text[head.end():]!r}); a fault takes no duration: a stop holds its task until "
                             "--liveness-timeout kills it or it is resumed (kill -CONT PID)")
        if m is None:
            raise ChaosError(f"bad --chaos {spec!r}: expected ACTION:JOB:INDEX@step=N or ACTION:chief@step=N "
                             f"with ACTION in {{{', '.join(_SIGNALS)}}}, e.g. kill:ps:1@step=200")
        if m["action"] not in _SIGNALS:
            raise ChaosError(f"bad --chaos {spec!r}: unknown action {m['action']!r} (known: {', '.join(_SIGNALS)})")
        step = int(m["step"])
        if step < 1:
            raise ChaosError(f"bad --chaos {spec!r}: step must be >= 1")
        index = int(m["index"]) if m["index"] is not None else None
        return cls(text, m["action"], m["job"], index, step)

    @property
    def signal(self) -> signal.Signals:
        return _SIGNALS[self.action]


#: An in-graph run's client as a fault names it (``kill:client:0``): outside the cluster, the run's chief.
IN_GRAPH_CLIENT = ("client", 0)


def chief_task(cluster: ClusterSpec) -> tuple[str, int]:
    """(job, index) of the chief: task 0 of job 'chief' if there is one, else worker 0 (TF1 convention)."""
    if "chief" in cluster.jobs:
        return "chief", min(cluster.task_indices("chief"))
    return "worker", 0


@dataclass(frozen=True)
class DutyHolder:
    """The task holding the chief duties now: the ``chief`` lease's holder, with its lease ``epoch``,
    or (``epoch`` None) the configured chief of a run without election."""

    job: str
    index: int
    epoch: int | None = None


@dataclass(frozen=True)
class ChaosPlan:
    """The faults of one run, in the order given."""

    faults: tuple[Fault, ...] = ()

    @classmethod
    def parse(cls, specs: Sequence[str]) -> ChaosPlan:
        """Parses every spec (see the module docstring).

        Raises:
            ChaosError: the first bad spec.
        """
        return cls(tuple(Fault.parse(s) for s in specs))

    def resolve(self, cluster: ClusterSpec, *, client: bool = False) -> list[tuple[Fault, str, int]]:
        """Each fault with the (job, index) it targets in ``cluster``, in the order given.

        ``client``: the run has an in-graph client, ``("client", 0)``: faults may name it, and it is the chief.

        Raises:
            ChaosError: a fault names a job or task that is not in the cluster, or stops an in-graph client; or two faults of
                the same step (one round, see the module docstring) name the same task (names both
                specs and the task).
        """
        out = []
        seen: dict[tuple[int, str, int], Fault] = {}
        chief = IN_GRAPH_CLIENT if client else chief_task(cluster)
        replicated = ps_replicas(cluster) > 0
        for f in self.faults:
            job, index = chief if f.job is None else (f.job, f.index if f.index is not None else 0)
            if job == BACKUP_TARGET or (replicated and job in SHARD_TARGETS):  # a shard, not a task
                wrong = check_shard_fault(f.spec, job, index, cluster)
                if wrong is not None:
                    raise ChaosError(wrong)
            else:
                if client and (job, index) == IN_GRAPH_CLIENT and f.action == "stop":
                    raise ChaosError(f"--chaos {f.spec!r}: an in-graph run's client (/job:client/task:0) has no hang "
                                     "detection (it serves no liveness check), so a stopped client would hold the "
                                     "run for good; use kill:client:0")
                try:
                    if not (client and (job, index) == IN_GRAPH_CLIENT):
                        cluster.task_address(job, index)
                except ClusterError as e:
                    raise ChaosError(f"--chaos {f.spec!r}: {e}") from e
            other = seen.setdefault((f.step, job, index), f)
            if other is not f:
                alias = " (the chief is worker 0 in a cluster without a 'chief' job)" if (other.job is None) != (f.job is None) else ""
                raise ChaosError(f"--chaos {other.spec!r} and --chaos {f.spec!r} both name /job:{job}/task:{index} at "
                                 f"step {f.step}{alias}: one process takes one fault at a time; drop one, or give it "
                                 f"a later step (it then hits the task's replacement, after the first fault recovered)")
            out.append((f, job, index))
        return out

    def __bool__(self) -> bool:
        return bool(self.faults)


def stop_without_liveness(plan: ChaosPlan, *, hang_detection: bool) -> str | None:
    """The one line the launcher says at the start where ``plan`` has ``stop`` faults and hang detection is off
    (``--liveness-timeout 0``): nothing ends a stopped task then, the run waits until it is resumed by hand. None
    otherwise. (Not refused: a drill or a test may resume the task itself.)"""
    stops = [f.spec for f in plan.faults if f.action == "stop"]
    if not stops or hang_detection:
        return None
    return (f"psflow: --chaos {', '.join(stops)} with --liveness-timeout 0: a stopped task is not resumed and no hang "
            "detection kills it; the run waits until it is resumed (kill -CONT PID)")
