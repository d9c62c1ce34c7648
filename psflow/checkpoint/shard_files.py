"""Which ps tasks a save asks for a shard, and each shard's file name: :func:`shard_files`.

Every ps task writes its own shard (``shard-<n>-of-<N>.safetensors``, ``n`` its position among the cluster's ``N``
ps tasks), but a task that holds nothing (:func:`psflow.ps.idle.idle_tasks`, by the placement: not the task holding
global_step, no partition of any variable; none in a replicated, synchronous or dynamic-table run). Its shard would
hold nothing a restore reads (a restore re-slices each variable from the shards its partitions name, onto any number
of ps tasks: :mod:`psflow.checkpoint.restore`), and the task may be down: killed, restarting, or restarted and not yet
made ready again (:mod:`psflow.train.idle_tasks`), when nothing of the model was lost. A save that asked it would fail
for nothing, and ``--max-failed-saves`` such saves in a row would stop the run. So it is neither asked for a shard nor
asked, before the pointer's switch, whether it was restored since (:func:`~psflow.checkpoint.publish_checks.
check_no_restore_since` asks the tasks that wrote a shard); its fence is still asked, its silence forgiven
(:func:`~psflow.checkpoint.publish_checks.check_fence`). The manifest lists the shards written; their names keep
the cluster's ``N``, so the checkpoint of one cluster never reads as another's.
"""

from __future__ import annotations

from psflow.ps.client import ParameterClient
from psflow.ps.idle import idle_tasks

__all__ = ["shard_files"]


def shard_files(client: ParameterClient) -> dict[int, tuple[int, str]]:
    """ps task -> (its shard's number, its file name), for every task of ``client`` but the idle ones, by task. Pure."""
    tasks, idle = sorted(client.channels), idle_tasks(client)
    return {t: (n, f"shard-{n:05d}-of-{len(tasks):05d}.safetensors") for n, t in enumerate(tasks) if t not in idle}
