"""psflow.cluster: who is in the cluster and where to reach them.

Files:

* ``spec.py``: :class:`ClusterSpec` (jobs -> task addresses), :class:`TaskId`
  (``/job:ps/task:0``), the input types :data:`JobTasks` and
  :data:`ClusterMapping`, and the errors :class:`ClusterError`,
  :class:`UnknownJobError`, :class:`UnknownTaskError`.
* ``resolver.py``: :func:`parse_tf_config` and :class:`TFConfig`, reading
  TensorFlow's ``TF_CONFIG`` JSON unchanged.
* ``replicas.py``: replicated ps shards (issue 28): the ``ps_backup`` job's
  tasks as backups of shard ``j % S`` -- :func:`~psflow.cluster.replicas.ps_replicas`,
  :func:`~psflow.cluster.replicas.shard_members` (a shard's members in the
  order every process agrees on), :func:`~psflow.cluster.replicas.shard_of`,
  :func:`~psflow.cluster.replicas.member_address`.

Guarantees:

* A :class:`ClusterSpec` is immutable and valid once built: every job has at
  least one task, every address is ``host:port`` (``[ipv6]:port``) with a port
  in 0-65535, and no two tasks share an address. Equality and hashing are by
  content, so dense and sparse forms of the same cluster compare equal.
* Lookups of a missing job or task raise :class:`UnknownJobError` /
  :class:`UnknownTaskError` naming the job, the index and what exists, e.g.
  ``no task 3 in job 'ps' (tasks 0-1)``.
* ``ClusterSpec.from_json(spec.to_json()) == spec``.
* Nothing here reads environment variables; callers pass ``TF_CONFIG`` text.

Non-guarantees: addresses are checked for form only; nothing here resolves
host names or checks that a port is reachable.
"""

from psflow.cluster.resolver import TFConfig, parse_tf_config
from psflow.cluster.spec import (
    ClusterError,
    ClusterMapping,
    ClusterSpec,
    JobTasks,
    TaskId,
    UnknownJobError,
    UnknownTaskError,
)

__all__ = [
    "ClusterError",
    "ClusterMapping",
    "ClusterSpec",
    "JobTasks",
    "TFConfig",
    "TaskId",
    "UnknownJobError",
    "UnknownTaskError",
    "parse_tf_config",
]
