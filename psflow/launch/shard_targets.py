"""Which process a chaos fault on a replicated ps shard hits (``--ps-replicas``; :mod:`psflow.launch.chaos`).

With replicated shards (:mod:`psflow.cluster.replicas`) a fault names a *shard*, not a task:

* ``kill:ps:N@step=S`` hits shard N's *current* primary: after a promotion that is a ``ps_backup`` task, and
  the restarted ``/job:ps/task:N`` is one of its backups;
* ``kill:ps-backup:N@step=S`` hits one of shard N's backups: the first in the primary's view (its member
  order), so a backup that has not joined the view again yet is never the one hit.

Who is which is asked when the fault fires: every member of the shard answers ``ReplicaStatus``
(:func:`ask_statuses`, in parallel, short deadline), and :func:`shard_target` reads the answers. While no
member says it is the primary with the variables (a failover under way), or the primary's view has no
backup, there is no target: the fault waits and is asked again at the next poll, as a ``chief`` fault waits
for a holder. Without replicas ``ps:N`` is ps task N, as always, and ``ps-backup`` is refused
(:func:`check_shard_fault`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from psflow.cluster import ClusterSpec, TaskId
from psflow.cluster.replicas import PS_JOB, member_address, ps_replicas, shard_members
from psflow.rpc.api import PARAMETER_SERVICE, ConnectConfig, RpcError

__all__ = ["BACKUP_TARGET", "SHARD_TARGETS", "ask_statuses", "check_shard_fault", "shard_target", "task_of"]

log = logging.getLogger("psflow.launch")

#: The job name a fault gives to hit one of a shard's backups (``kill:ps-backup:N``).
BACKUP_TARGET = "ps-backup"
#: The jobs a fault names as shards in a replicated cluster.
SHARD_TARGETS = (PS_JOB, BACKUP_TARGET)


def check_shard_fault(spec: str, job: str, index: int, cluster: ClusterSpec) -> str | None:
    """Checks a fault on ``job`` (``ps`` or ``ps-backup``) ``index`` against ``cluster``; returns what is wrong
    (the caller raises it naming the spec), or None. ``ps-backup`` needs ``--ps-replicas``; the index is a shard."""
    if job == BACKUP_TARGET and ps_replicas(cluster) == 0:
        return (f"--chaos {spec!r} names a backup of ps shard {index}, but the run has none: "
                "kill:ps-backup:N needs --ps-replicas 1 or more")
    if not 0 <= index < cluster.num_ps:
        return f"--chaos {spec!r}: no ps shard {index} (shards 0-{cluster.num_ps - 1})"
    return None


def shard_target(job: str, shard: int, statuses: Sequence[Mapping[str, Any]]) -> str | None:
    """The task a fault on shard ``shard`` hits now, from its members' ``ReplicaStatus`` answers (any order;
    members that did not answer are left out), or None (no target now: the fault waits).

    ``job`` ``ps``: the member that says ``primary``, holds the variables and has the highest epoch.
    ``ps-backup``: the first backup of that primary's view that answered.
    """
    primaries = [s for s in statuses if s.get("shard") == shard and s.get("role") == "primary"
                 and s.get("has_state") is True and isinstance(s.get("epoch"), int)]
    if not primaries:
        return None
    primary = max(primaries, key=lambda s: int(s["epoch"]))
    if job == PS_JOB:
        return str(primary.get("task"))
    answered = {str(s.get("task")) for s in statuses}
    backups = primary.get("backups")
    for name in backups if isinstance(backups, (list, tuple)) else ():
        if str(name) in answered:
            return str(name)
    return None


def ask_statuses(cluster: ClusterSpec, shard: int, token: str | None, *, timeout: float = 0.5) -> list[dict[str, Any]]:
    """Every member of ``shard`` asked its ``ReplicaStatus`` in parallel (``timeout`` s each); the answers
    (the reply's fields, with ``task``), members that did not answer left out. Blocks ``timeout`` s at most."""
    from psflow.rpc.grpc_client import TaskChannel  # imports grpc: only where a fault fires

    connect = ConnectConfig(connect_timeout=timeout, rpc_timeout=timeout, token=token)
    channels = [TaskChannel(name, member_address(cluster, name), PARAMETER_SERVICE, connect)
                for name in shard_members(cluster, shard)]
    try:
        calls = [(ch, ch.call_async("ReplicaStatus", {}, timeout=timeout)) for ch in channels]
        answers = []
        for ch, call in calls:
            try:
                answers.append({"task": ch.task, **dict(call.result().meta)})
            except RpcError as e:
                log.debug("chaos: %s: no ReplicaStatus: %s", ch.task, e)
        return answers
    finally:
        for ch in channels:
            ch.close()


def task_of(name: str) -> tuple[str, int]:
    """(job, index) of a task name ``/job:J/task:I``."""
    task = TaskId.parse(name)
    return task.job, task.index
