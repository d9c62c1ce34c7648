"""psflow.checkpoint: sharded, atomic checkpoints -- saved by the chief, restored onto any layout.

On disk (``checkpoint_dir``)::

    checkpoint.lock                   the run writing here (psflow.checkpoint.lock)
    checkpoint                        pointer: {"latest": "ckpt-000000120", "all": [...], "global_step": 120,
                                                "lineage": L, "run_id": R, "epoch": E, "holder": H}
    checkpoint.e<E>                   the same, written (before ``checkpoint``) only by the chief of lease epoch E
    ckpt-000000120/
        writer.json                        written first: run id, lineage, epoch of the writer
        shard-00000-of-00002.safetensors   ps task 0's partitions and optimizer slots
        shard-00001-of-00002.safetensors   ps task 1's (none of a ps task holding nothing: shard_files.py)
        manifest.json                      written last (see :class:`Manifest`)

*Lineage*: the model state a checkpoint belongs to. A freshly initialized
cluster starts one at its first save (the saving run's id); a cluster
restored from a checkpoint continues the checkpoint's (``LoadShard`` carries
it to the ps task holding global_step, whose ``CheckpointStatus`` ledger
every chief of the run reads). Rotation only ever deletes checkpoints of the
saving cluster's own lineage.

Save (:meth:`CheckpointManager.save`, run by the chief), in order (with an
``epoch``, the chief's lease epoch, steps 2, 4 and 6 are fenced: a ps task
that has seen a newer chief's epoch refuses, and the save fails with
:class:`CheckpointFencedError`):
    1. the run lock is confirmed (:class:`~psflow.checkpoint.lock.CheckpointDirLock`:
       another live run holding the directory fails the save); the lineage is
       read from the ledger; leftovers of crashed saves of this lineage are
       deleted; ``ckpt-<step>/writer.json`` is written;
    2. every ps task snapshots its partitions (each under its own lock) and
       writes its shard, all tasks in parallel (``SaveShard``). With
       ``transport="rpc"`` the tasks stream their shard bytes back and the
       chief writes them, so the ps tasks need no shared filesystem;
    3. the chief writes ``manifest.json`` (variables, shapes, dtypes,
       partitioning, slots, global_step, each worker's reader position, the
       cluster, the model, the lineage and the writing run, the psflow
       version, each shard's size and sha256, and a replicated shard's count
       of the pushes it holds; none where the shards' restore generations
       or readiness differ: the save straddled a restore or met a task
       awaiting one; nor where a task is not ready, but in the initial save),
       then renames the directory after the
       global_step the manifest holds (under the directory's ``flock``; the
       workers pushed since the chief read the step it was first named after);
    4. every ps task confirms the chief's epoch (``Fence``);
    5. the chief switches the pointer ``checkpoint`` by atomic rename, as a
       compare-and-swap under the directory's ``flock``: a pointer written by
       a newer epoch of the same run is never replaced (the save fails), and
       the checkpoint must still be complete; just before, still under the
       ``flock``, every ps task must stand where its shard was taken: a
       restore since (its generation moved) or a restart (ready then, not
       now) fails the save, which would make a model the restore discarded
       current (:func:`~psflow.checkpoint.publish_checks.check_no_restore_since`);
    6. the fence is checked again: refused (a successor was elected
       meanwhile), the previous pointer is put back if the pointer is still
       this save's (not taken over by the successor's ``mark_final`` or by
       its restore, :func:`~psflow.checkpoint.adopt.adopt_latest`), the
       directory is removed unless the pointer names it (under the same
       ``flock``), and the save fails;
    7. only then are checkpoints of this lineage beyond ``max_to_keep`` (and
       leftovers of crashed saves) deleted, under the same ``flock``; a save
       in progress of a newer epoch is never touched.
What rotation keeps (step 5 decides it, step 7 deletes the rest) is read
from the directory, never from the pointer: the new checkpoint and the
newest ``max_to_keep - 1`` other complete checkpoints of this lineage (their
manifests' ``lineage``; newest by ``global_step``, then ``created``). So a
pointer that is missing, damaged or names something outside the directory
cannot make a save delete a checkpoint it should keep, and ``max_to_keep``
holds whatever the pointer said. The pointer's ``all`` lists what was kept.
Every file is written to a temp name, fsynced and renamed, so a crash at any
moment leaves the previous checkpoint (the one the pointer names) intact and
restorable; a checkpoint directory without a manifest is never restored.

In an object store (``s3://bucket/ckpt``, ``gs://bucket/ckpt``; see
:mod:`psflow.storage`) there is no rename and no directory: every file is
one put (the object appears whole or not at all), in the same order (the
writer file, the shards, the manifest, the pointer last), and a checkpoint
directory is a prefix. So a crash at any moment still leaves the pointer on
a complete checkpoint, and a prefix without its manifest is an incomplete
save: never restored, deleted by a later save of its lineage as on disk.
The directory's ``flock`` becomes a lock object created by a conditional put
(:mod:`psflow.checkpoint.lock`). With ``transport="local"`` every ps
task puts its own shard (with its own credentials); ``"rpc"`` streams them
to the chief, which puts them. Readers fetch each shard once into a local
temp directory and check its sha256 there.

A failed save (a full or read-only disk, a ps task that cannot write, the
lock lost to another run) removes its partial directory, is logged as an
error, counted in the ledger (``checkpoints_failed``; the launcher prints a
line for each) and raises :class:`CheckpointError`; the chief duties go on.
The ``max_failed_saves``-th failure in a row raises
:class:`CheckpointSavesFailedError`, which ends the run: training on without
a checkpoint is not silently allowed. The final save has no next one: its
failure ends the run too (:class:`FinalCheckpointError`, raised by the
chief's :class:`~psflow.train.hooks.CheckpointSaverHook`), so a run never
ends with an older checkpoint as its newest; one whose check at the switch
could not ask a replicated shard's primary is made once more once that
shard's routing settled (:func:`~psflow.checkpoint.publish_checks.await_routes`),
within its ``--save-timeout``. A save refused by a newer
chief's epoch (:class:`CheckpointFencedError`) is not a failure: the newer
chief saves. A chief stopped inside the directory's ``flock`` (steps 1, 3,
5-7) holds it while stopped; a chief of a newer lease epoch goes on past it
after 30 s (:mod:`psflow.checkpoint.lock`), so its save, the final one
included, is still written and made current. It publishes the pointer through
its own epoch's file ``checkpoint.e<E>``, which no other chief writes, and
readers follow the newest epoch file of the pointer's run
(:func:`~psflow.checkpoint.pointer.effective_pointer`): the stopped chief,
resumed, writes only its older epoch's file, finds the newer one deciding and
is fenced off. Past the mutex a save still rotates, deleting less: only
complete checkpoints of its own run and lineage, of its epoch or an older one,
that no pointer file names (:mod:`psflow.checkpoint.rotation`), and leftovers
whose writer is certainly gone, or is another run or an older epoch of this one
that the run is past (:mod:`psflow.checkpoint.leftovers`); the next
save holding it deletes the rest, shard files a ps task wrote after its save's
directory was removed included (:func:`~psflow.checkpoint.rotation.late_shards_only`). A
chief that finds a checkpoint of the last step current marks it final
(:meth:`CheckpointManager.mark_final`) under its own epoch: the
pointer is rewritten with that epoch, so the chief that wrote it, fenced
off on its re-check (step 6), leaves the pointer and the checkpoint as they
are.

Readers (:func:`latest_checkpoint`: the launcher and the chief before a
restore, a restore after a ps task died, the evaluator, ``psflow export``,
warm start from a directory) follow the pointer only to a complete
``ckpt-*`` directory directly inside the checkpoint directory. A pointer
that names one that is gone or incomplete falls back to the newest complete
checkpoint the pointer lists. A pointer that is missing (beside
checkpoints), unreadable, not a JSON object, or names anything else (an
absolute path, ``..``, a symlink) is reported (a WARNING naming the pointer
file and what was wrong, once per process) and ignored: the newest complete
checkpoint inside the directory is used (by ``global_step``, then
``created``). The next save writes a good pointer. A directory that cannot be
listed raises :class:`~psflow.checkpoint.pointer.CheckpointListingError` (a
``CheckpointError`` and an ``OSError``) naming it.

Restore (:func:`restore`) reads the manifest and, for each partition of the
*current* layout, assembles its rows (and its optimizer slots' rows) from the
saved partitions that overlap it, re-slicing along axis 0, and sends them to
the ps task holding it (``LoadShard``). So a checkpoint restores onto a
different number of ps tasks, placement strategy or partition count. 0-d
optimizer state (Adam's beta powers) is taken from the saved partition that
held the new partition's first row. A dynamic table (:mod:`psflow.ps.dynamic`)
is saved as each share's id-sorted snapshot (ids, rows, slots, last use,
frequency) and restored re-split by :func:`~psflow.ps.dynamic.owner_of` onto
the current ps tasks (:func:`~psflow.ps.dynamic.resplit_snapshots`): every row
and slot lands, unchanged, on the task that owns its id now. Restoring a
dynamic table onto a static variable (or back) is refused, naming it.

A variable's moving average (:mod:`psflow.ps.averages`) is saved as its slot
``ExponentialMovingAverage`` and re-sliced like the optimizer's slots. Restored
into a run that averages the variable, a checkpoint without one starts the
average at the restored value; into a run that does not, the saved one is
left out. :func:`read_variables` reads the averages in place of the variables
when asked (``psflow export --moving-averages``, evaluation with averages).

Incremental checkpoints (``full_every``, ``psflow train --full-checkpoint-every K``, default 10): every
K-th save of a chief is full, the ones between are increments holding only the rows each ps task changed
since the previous complete checkpoint (the increment's ``base``), plus everything small whole; dynamic
tables, averaged variables and partitions of optimizers whose sparse update moves every row are saved whole
in every increment. Restore, export and evaluation read an increment through its chain (the newest full
checkpoint and every increment after it, :mod:`psflow.checkpoint.chain`), onto any number of ps tasks. A
chief's first save is full (after a failover, a resume). Rotation keeps what kept increments need. See
:mod:`psflow.checkpoint.save` and :mod:`psflow.ps.row_marks`.

A lazy table's partition (:mod:`psflow.ps.lazy_rows`: rows built on first touch) is saved, in a full
checkpoint, as its built rows only (``"built": n`` and its ``"initializer"`` in its record; the tensors
``<key>@built_rows`` and ``<key>@initial/<slot>``, :mod:`psflow.ps.built_rows`): W&D's initial checkpoint is
O(built rows), not O(table). Every reader gives the eager table's values bit for bit, and a restore sends only
the saved rows, so the restored partition stays lazy (docs/checkpoints.md, "A lazy table's shard").

Tensors are stored with safetensors; nothing is ever pickled.

Classes and functions, by file:

* ``manifest.py`` -- the file names (:data:`MANIFEST_NAME`, :data:`POINTER_NAME`, :data:`WRITER_NAME`),
  :class:`Manifest` (``manifest.json``), :class:`SavedCheckpoint`, :func:`read_manifest`.
* ``pointer.py`` -- :func:`latest_checkpoint` (the pointer and its fallbacks),
  :func:`incomplete_checkpoints`, the complete checkpoints of a directory; the per-epoch pointer files
  (:func:`~psflow.checkpoint.pointer.effective_pointer`, :func:`~psflow.checkpoint.pointer.publish`);
  :func:`write_pointer`.
* ``save.py`` -- :class:`CheckpointManager` (the save and its fence), :class:`CheckpointSavesFailedError`,
  :class:`FinalCheckpointError`; ``switch.py`` -- the pointer's compare-and-swap and its undo,
  :func:`refuse_newer_epoch` (the pointer's fence, for every writer), :class:`CheckpointFencedError`;
  ``save_manifest.py`` -- :func:`build_manifest`: the manifest a save writes, from the ps tasks' shard replies
  (refused where they straddle a restore or mix ready and not ready tasks, or, but the initial save, a task is not
  ready); ``publish_checks.py`` -- what a save asks the ps tasks around its pointer switch: the chief's fence
  (:func:`~psflow.checkpoint.publish_checks.check_fence`) and no restore or restart since its shards were taken
  (:func:`~psflow.checkpoint.publish_checks.check_no_restore_since`; a task it could not ask:
  :class:`~psflow.checkpoint.publish_checks.UnaskedTasksError`, and the final save's wait for that shard's
  failover, :func:`~psflow.checkpoint.publish_checks.await_routes`);
  ``save_notice.py`` -- :func:`~psflow.checkpoint.save_notice.notify_save`: the ps tasks hear of a save while it
  lasts (a sync step waiting for the chief does not time out meanwhile); ``bounded_save.py`` --
  :class:`~psflow.checkpoint.bounded_save.BoundedSaves`: the chief's save given up (a failed save) past
  ``--save-timeout``, the store stuck; ``daemon_calls.py`` -- :func:`~psflow.checkpoint.daemon_calls.in_daemon_threads`:
  a save's shard writes side by side, none of them waited for at the process's exit; ``shard_files.py`` --
  :func:`~psflow.checkpoint.shard_files.shard_files`: the ps tasks a save asks for a shard (not one holding
  nothing, :func:`~psflow.ps.idle.idle_tasks`: it may be down, having lost nothing) and their files' names.
* ``naming.py`` -- a checkpoint's directory name, the global_step it holds (:func:`rename_after_step`).
* ``rotation.py`` -- what a save keeps and deletes (:func:`kept_after`, :func:`deletable`; past the mutex
  :func:`~psflow.checkpoint.rotation.deletable_unheld`); ``leftovers.py`` -- whether a save's writer is
  certainly gone (:func:`~psflow.checkpoint.leftovers.writer_gone`), the ``.creating-*`` leftovers.
* ``adopt.py`` -- :func:`adopt_latest`: a restoring chief takes the checkpoint it reads over with its epoch
  (:func:`checkpoint_to_restore`: when it has a lease and the run id).
* ``ledger.py`` -- :func:`checkpoint_status` (the cluster's ledger), :class:`SaveStatusWatcher`
  (the launcher's console lines and counts from it).
* ``shards.py`` -- :class:`ShardFiles` (a checkpoint's shard files, checked against the manifest),
  :func:`saved_rows`, :func:`saved_table` (rows and dynamic tables re-sliced from them; a lazy table's
  partition saved as its built rows read as the eager one, :mod:`psflow.ps.built_rows`).
* ``chain.py`` -- incremental checkpoints read back: :func:`checkpoint_chain` (a full checkpoint and the
  increments after it), :class:`ChainReader` (rows of a variable through the chain; the rows saved alone,
  for a restore that keeps a lazy partition lazy).
* ``restore.py`` -- :func:`restore` (a checkpoint onto the current layout), :func:`load_shards`,
  :class:`RestoreRefusedError` (every load refused by the restore fence: another restore began since).
* ``variables.py`` -- :func:`read_variables`, :func:`averaged_variables`, :data:`DYNAMIC_IDS`,
  :func:`read_safetensors`: variables read whole (export, evaluation).
* ``warm_start.py`` -- :func:`warm_start`, :func:`read_warm_start`, :func:`load_values`; ``export_files.py`` --
  an exported model's files checked against its model.json (size and sha256), for ``psflow predict`` and a warm
  start from an export (:func:`~psflow.checkpoint.export_files.read_exported_variables`).
* ``lock.py`` -- one run per directory: :class:`CheckpointDirLock`, :class:`RunDirLock`
  (``run.lock`` of a run directory), :func:`directory_mutex`, the run's id (:func:`new_run_id`,
  :func:`cluster_run_id`); ``holder.py`` -- who holds a lock and whether it is alive (:func:`holder_alive`:
  host, boot, pid namespace, pid and its start time; :func:`describe_holder`); ``lock_release.py`` -- a
  launcher's release of the checkpoint lock within a bounded time (a store that stopped answering).

:class:`~psflow.errors.CheckpointError` is the error of every refused or failed checkpoint operation.
This package imports the ps client and protocol, never the worker loop or the launcher.

"""
