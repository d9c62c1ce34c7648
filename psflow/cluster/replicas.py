"""Replicated ps shards: which tasks hold each shard, in member order.

A cluster with a ``ps_backup`` job replicates every ps shard (issue 28). Job
``ps`` keeps S tasks, one per shard: task k is shard k's first primary, and
variables are placed on these S tasks as in an unreplicated cluster. Job
``ps_backup`` has S*N tasks (N = :func:`ps_replicas`): ``ps_backup`` task j
is a member of shard ``j % S``. Shard k's members, in member order, are
``/job:ps/task:k``, ``/job:ps_backup/task:k``, ``/job:ps_backup/task:k+S``, ...

Guarantees:

* A cluster without a ``ps_backup`` job is unreplicated: :func:`ps_replicas`
  is 0 and each shard has one member, its ps task.
* A ``ps_backup`` job whose size is not a multiple of ``ps``'s, or which is
  sparse, is refused with a :class:`~psflow.cluster.spec.ClusterError` (a
  ``ValueError``) naming both counts.
* Member order is fixed by the cluster alone, so every process that reads the
  same cluster agrees on it.

Example:
    >>> from psflow.cluster.spec import ClusterSpec
    >>> spec = ClusterSpec({"ps": ["a:1", "b:1"], "ps_backup": ["c:1", "d:1"]})
    >>> shard_members(spec, 1)
    ('/job:ps/task:1', '/job:ps_backup/task:1')
"""

from __future__ import annotations

from psflow.cluster.spec import ClusterError, ClusterSpec, TaskId, UnknownTaskError

__all__ = ["BACKUP_JOB", "PS_JOB", "member_address", "ps_replicas", "shard_members", "shard_of"]

#: The job whose tasks are the shards' first primaries.
PS_JOB = "ps"
#: The job of the shards' backup members.
BACKUP_JOB = "ps_backup"


def ps_replicas(cluster: ClusterSpec) -> int:
    """Returns N, the number of backups of every shard (0 when unreplicated).

    Raises:
        ClusterError: If the cluster has a ``ps_backup`` job but no ``ps`` job,
            or ``ps_backup`` is sparse, or its size is not a multiple of
            ``ps``'s (the message names both counts).
    """
    if BACKUP_JOB not in cluster.jobs:
        return 0
    num_ps = cluster.num_ps
    num_backups = cluster.num_tasks(BACKUP_JOB)
    if num_ps == 0:
        raise ClusterError(f"cluster has {num_backups} {BACKUP_JOB} task(s) but no {PS_JOB} job")
    if cluster.task_indices(BACKUP_JOB) != tuple(range(num_backups)):
        raise ClusterError(f"job {BACKUP_JOB!r} must be dense (tasks 0-{num_backups - 1}), got tasks {cluster.task_indices(BACKUP_JOB)}")
    if num_backups % num_ps != 0:
        raise ClusterError(
            f"job {BACKUP_JOB!r} has {num_backups} task(s), not a multiple of job {PS_JOB!r}'s {num_ps}: "
            "every shard needs the same number of backups"
        )
    return num_backups // num_ps


def shard_members(cluster: ClusterSpec, shard: int) -> tuple[str, ...]:
    """Returns shard ``shard``'s task names in member order.

    Raises:
        UnknownTaskError: If the cluster has no ps task ``shard``.
        ClusterError: As :func:`ps_replicas`.
    """
    replicas = ps_replicas(cluster)
    num_ps = cluster.num_ps
    if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < num_ps:
        raise UnknownTaskError(f"no shard {shard!r}: the cluster has {num_ps} ps task(s)")
    backups = tuple(TaskId(BACKUP_JOB, shard + i * num_ps).name for i in range(replicas))
    return (TaskId(PS_JOB, shard).name, *backups)


def shard_of(job: str, index: int, cluster: ClusterSpec) -> int:
    """Returns the shard that task ``index`` of ``job`` is a member of.

    Raises:
        ClusterError: If ``job`` is neither ``ps`` nor ``ps_backup``, or the
            task is not in the cluster.
    """
    if job not in (PS_JOB, BACKUP_JOB):
        raise ClusterError(f"/job:{job}/task:{index} is not a ps shard member (only jobs {PS_JOB!r} and {BACKUP_JOB!r} are)")
    cluster.task_address(job, index)  # raises naming the job and index
    if job == PS_JOB:
        return index
    ps_replicas(cluster)  # validates the ps_backup job's shape
    return index % cluster.num_ps


def member_address(cluster: ClusterSpec, task_name: str) -> str:
    """Returns the ``host:port`` of a member named ``/job:J/task:I``.

    Raises:
        ClusterError: If the name does not parse or the task is not in the cluster.
    """
    task = TaskId.parse(task_name)
    return cluster.task_address(task.job, task.index)
