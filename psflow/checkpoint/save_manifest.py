"""What a save records: the :class:`~psflow.checkpoint.manifest.Manifest` built from the ps tasks' shard replies.

:func:`build_manifest` turns what every ps task said it saved (its shard's file, size, sha256 and partitions;
a replicated shard's push counts; the snapshot's marks, an increment's base) and the client's layout into
the manifest :class:`~psflow.checkpoint.save.CheckpointManager` writes last. Every partition of the layout
must be in a shard, the task holding global_step dates the checkpoint, and every shard was snapshotted at one
restore generation (:func:`check_one_generation`), by tasks all ready, or all not ready in the chief's initial
save only (:func:`check_readiness`); otherwise nothing is written (the save fails). Writes nothing itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from psflow.checkpoint.manifest import Manifest, psflow_version
from psflow.errors import CheckpointError
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import SaveShardReply
from psflow.ps.store import partition_key

__all__ = ["build_manifest", "check_one_generation", "check_readiness"]


def _shard_record(file: str, reply: SaveShardReply) -> dict[str, Any]:
    """A shard's entry in the manifest; a replicated shard's with the count of the pushes it holds (in all and
    per client process); with the
    snapshot's mark token and epoch (the base of a later increment)."""
    record: dict[str, Any] = {"file": file, "task": reply.task, "bytes": reply.size, "sha256": reply.sha256}
    if reply.pushes_applied is not None:
        record["pushes_applied"] = reply.pushes_applied
    if reply.pushes_applied_by is not None:
        record["pushes_applied_by"] = reply.pushes_applied_by
    if reply.marks is not None:
        record["marks"] = dict(reply.marks)
    return record


def check_one_generation(replies: Mapping[int, tuple[str, SaveShardReply]]) -> None:
    """Every shard of a save was snapshotted at one restore generation (a reply naming none, an older task's, is
    not compared).

    Each ps task refuses a SaveShard while a restore is in progress there or when one began during its snapshot
    (:meth:`psflow.ps.restore_gate.RestoreGate.check_save`), but not one that reaches it only after a whole restore
    within the run (a save given up at ``--save-timeout`` whose calls go on; with in-process ps tasks the shards are
    saved one after the other): its shard holds the restored checkpoint's state, the shards saved before the restore
    the model it discarded, and their checkpoint a model that never existed.

    Raises:
        CheckpointError: the shards' generations differ; names each task and its generation.
    """
    saved = {reply.task: reply.generation for _, reply in replies.values() if reply.generation is not None}
    if len(set(saved.values())) > 1:
        at = ", ".join(f"{task} at generation {generation}" for task, generation in sorted(saved.items()))
        raise CheckpointError(f"the checkpoint's shards were snapshotted on both sides of a restore within the run ({at}): "
                              "they would hold a model that never existed; not written (the checkpoints already saved "
                              "are kept, and the next save takes the restored state)")


def check_readiness(replies: Mapping[int, tuple[str, SaveShardReply]], *, initial: bool) -> None:
    """Every shard of a save was snapshotted by a ready task or, in the chief's initial save only (``initial``:
    before it makes the tasks ready), every one by a task not ready; a reply naming no readiness, an older
    task's, is not compared. Two ways a save would otherwise hold a model that never existed:

    * some tasks ready and some not: a restarted ps task that a restore within the run registered
      (:func:`psflow.train.generation_restore.restore_at_new_generation`, step 1) holds its initial values, not
      ready, at generation 0 until the restore's ``BeginRestore`` reaches it; where no restore happened before,
      the other tasks are at generation 0 too (:func:`check_one_generation` passes), and its shard beside theirs
      would be a model that never existed;
    * every task not ready, in a save that is not the initial one: where every ps task restarted and a restore
      within the run registered them but sent no ``BeginRestore`` yet, every task is not ready at generation 0
      with its initial values, as in the initial save (:func:`check_one_generation` passes, and they agree): a
      periodic or final save reaching them then (one given up at ``--save-timeout`` whose thread goes on) would
      make initial values the newest checkpoint.

    Raises:
        CheckpointError: some shards' tasks were ready and some not (names each task and whether it was), or,
            but in the initial save, some were not ready (names them).
    """
    ready = {reply.task: reply.ready for _, reply in replies.values() if reply.ready is not None}
    if len(set(ready.values())) > 1:
        at = ", ".join(f"{task} {'ready' if r else 'not ready'}" for task, r in sorted(ready.items()))
        raise CheckpointError(f"the checkpoint's shards were snapshotted by ready and not ready ps tasks ({at}): a task "
                              "not ready holds no model yet (restarted, awaiting the restore), so they would hold a "
                              "model that never existed; not written (the checkpoints already saved are kept)")
    waiting = sorted(task for task, r in ready.items() if r is False)
    if waiting and not initial:
        raise CheckpointError(f"the checkpoint's shards were snapshotted by ps tasks not ready (restarted, not yet "
                              f"restored): {', '.join(waiting)}: the save is not a model of the run (their initial "
                              "values); not written (the checkpoints already saved are kept, and the next save "
                              "takes the restored state)")


def build_manifest(client: ParameterClient, replies: dict[int, tuple[str, SaveShardReply]],
                   optimizer: Mapping[str, Any] | None, model: Mapping[str, Any] | None, lineage: str,
                   writer: Mapping[str, Any], final: bool, *, initial: bool = False) -> Manifest:
    """The manifest of a save whose shards every ps task wrote (``replies``: task -> its file name and reply);
    ``initial``: the chief's initial save of a fresh cluster, whose tasks are not ready yet.

    Pure: reads only its arguments (the client's layout and cluster, no RPC) and the clock (``created``).

    Raises:
        CheckpointError: a partition of the client's layout is in no shard, the shard of the task holding
            global_step dates nothing, or the shards straddle a restore (:func:`check_one_generation`), mix ready
            and not ready tasks or, but in the initial save, hold a task not ready (:func:`check_readiness`).
    """
    check_one_generation(replies)
    check_readiness(replies, initial=initial)
    located = {p["key"]: (file, p) for file, reply in replies.values() for p in reply.partitions}
    variables: dict[str, dict[str, Any]] = {}
    for name, placement in client.layout.items():
        parts = []
        for part in placement.partitions:
            key = partition_key(name, part.index)
            if key not in located:
                raise CheckpointError(f"variable {name!r} partition {part.index} was not saved by /job:ps/task:{part.task}")
            shard, saved = located[key]
            record = {"index": part.index, "task": part.task, "row_start": part.row_start,
                      "row_stop": part.row_stop, "shard": shard, "slots": saved["slots"]}
            if placement.is_dynamic:  # rows keyed by id: how many, and the snapshot's arrays
                record.update(rows=saved["rows"], dynamic=saved["dynamic"])
            if "changed" in saved:  # an increment's partition: only these rows
                record["changed"] = saved["changed"]
            if "built" in saved:  # a lazy partition: only its built rows, the others from the initializer
                record.update(built=saved["built"], initializer=saved["initializer"])
            parts.append(record)
        var = placement.var
        variables[name] = {"shape": list(var.shape), "dtype": var.dtype, "trainable": var.trainable, "partitions": parts}
        if var.dynamic is not None:
            variables[name]["dynamic"] = dict(var.dynamic)
    step_reply = replies[client.step_task][1]
    if step_reply.global_step is None:
        raise CheckpointError(f"{step_reply.task} holds no global_step: its shard cannot date the checkpoint")
    return Manifest(
        global_step=step_reply.global_step,
        variables=variables,
        shards=[_shard_record(file, r) for _, (file, r) in sorted(replies.items())],
        reader_positions=dict(step_reply.positions),
        examples=step_reply.examples,
        cluster=json.loads(client.cluster.to_json()),
        optimizer=dict(optimizer) if optimizer is not None else None,
        model=dict(model) if model is not None else None,
        psflow_version=psflow_version(),
        created=time.time(),
        lineage=lineage,
        run={k: writer[k] for k in ("run_id", "epoch", "holder", "writer", "host", "pid")},
        final=final,
    )
