"""ps tasks that hold nothing, by the placement: :func:`idle_tasks`.

With more ps tasks than the model has variables (``--ps 4`` for the two variables of ``logistic``) some tasks hold
no partition. Read from the client's layout (the placement every client computes alike), never from a reply: a task
restarted empty answers "no partitions" whatever it held before. Two consumers: a checkpoint save asks no such task
for a shard (it would hold nothing: :meth:`psflow.checkpoint.save.CheckpointManager.save`), and one restarted is made
ready again without a restore (:mod:`psflow.train.idle_tasks`).
"""

from __future__ import annotations

from psflow.ps.client import ParameterClient

__all__ = ["idle_tasks"]


def idle_tasks(client: ParameterClient) -> frozenset[int]:
    """The ps tasks that hold nothing a checkpoint saves or restores, by the placement ``client`` registered: not the
    task holding global_step (with the reader positions, the example count, the ledger), no partition of any
    variable (nor its optimizer slots, its moving average); none at all in a replicated run (a shard's members
    rebuild each other), a synchronous one (every task takes part in each sync step: its accumulators, its step
    count) or one with a dynamic table (its rows are spread over every ps task by id). Pure: no call. A stand-in of
    the client (tests) without a router or sync settings is read as unreplicated and asynchronous."""
    sync = getattr(client, "sync", None)
    if getattr(client, "router", None) is not None or (sync is not None and sync.mode == "sync"):
        return frozenset()
    if any(placed.var.dynamic is not None for placed in client.layout.values()):
        return frozenset()
    holding = {part.task for placed in client.layout.values() for part in placed.partitions}
    return frozenset(t for t in client.channels if t != client.step_task and t not in holding)
