"""psflow.ps: the parameter servers -- a ps task's state and handlers, the protocol, and the client.

A ps task holds its share of the variables (partitions, optimizer slots, dynamic tables), applies the
pushed gradients with TensorFlow's update formulas, and keeps the one global_step (ps task 0). Workers
reach it through :class:`~psflow.ps.client.ParameterClient`; every call is one typed message of
:mod:`psflow.ps.protocol`.

Files (the served side):

* ``service.py``: :class:`~psflow.ps.service.ParameterService`, the table of RPC handlers over the parts below.
* ``variable_store.py``: :class:`~psflow.ps.variable_store.VariableStore` (registered layout, optimizer,
  update mode; registration); ``store.py``: :class:`~psflow.ps.store.ParameterStore` (partitions, slots,
  locks), :func:`~psflow.ps.store.partition_key`, :class:`~psflow.errors.StoreError` re-exported.
* ``step_clock.py``: :class:`~psflow.ps.step_clock.StepClock`; ``global_step.py``:
  :class:`~psflow.ps.global_step.GlobalStep`, :class:`~psflow.ps.global_step.StepJournal` (its durable bound).
* ``worker_ledger.py``: :class:`~psflow.ps.worker_ledger.WorkerLedger` (incarnations, reader positions,
  finished workers); ``run_end.py``: :class:`~psflow.ps.run_end.RunLedger` (which workers are done, and the final evaluation).
* ``push_apply.py``: :class:`~psflow.ps.push_apply.PushApplier` (a push admitted, checked whole, applied or
  aggregated, counted).
* ``push_order.py``: :class:`~psflow.ps.push_order.PushOrder` (a worker process's numbered pushes applied in
  the order made, nothing after a gap).
* ``restore_gate.py``: :class:`~psflow.ps.restore_gate.RestoreGate` (readiness, restore generation).
* ``ready_read.py``: an evaluation's ``Pull`` (``require_ready``) refused by a task not ready through it.
* ``update_mode.py``: :class:`~psflow.ps.update_mode.UpdateMode` (async, sync or ssp, by
  :class:`~psflow.ps.sync.SyncConfig`); ``sync.py``: :class:`~psflow.ps.sync.SyncConfig`,
  :class:`~psflow.ps.sync.SyncAggregator` (SyncReplicas semantics; ``sync_sums.py``: a step's sparse sums);
  ``save_hold.py``:
  :class:`~psflow.ps.save_hold.SaveHold` (a chief's checkpoint save holds a sync step without timing out);
  ``staleness.py``: :class:`~psflow.ps.staleness.StalenessClock` (bounded staleness).
* ``optimizer_base.py``: :class:`~psflow.ps.optimizer_base.Optimizer` (checks, schedules, duplicate rows,
  gather/scatter); ``optimizers.py``: TF's formulas (``SgdOptimizer`` ... ``RmspropOptimizer``) and
  :func:`~psflow.ps.optimizers.make_optimizer`; ``_kernels.c``: their fused C updates.
* ``initializers.py``: :func:`~psflow.ps.initializers.initial_value`; ``averages.py``:
  :class:`~psflow.ps.averages.MovingAverages`; ``memory.py``: :func:`~psflow.ps.memory.exclude_from_fork`,
  :func:`~psflow.ps.memory.use_small_pages` (kernel memory advice for a ps task's large arrays).
* ``lazy_rows.py``: :class:`~psflow.ps.lazy_rows.LazyRows` (a large static partition's rows built on first
  touch, bit-equal to an eager one's; which partitions are lazy; their arrays in small pages).
* ``row_marks.py``: :class:`~psflow.ps.row_marks.MarkClock`, :class:`~psflow.ps.row_marks.RowMarks` (which
  rows of a partition changed since a checkpoint snapshot: incremental checkpoints).
* ``shard_snapshot.py``: :func:`~psflow.ps.shard_snapshot.shard_tensors` (a checkpoint shard's tensors, every
  row, a lazy partition's built ones or the changed ones), the shard's tensor names; ``built_rows.py``: a lazy
  partition in a checkpoint as its built rows (their names, :func:`~psflow.ps.built_rows.whole_rows` reading
  them as the eager partition, :func:`~psflow.ps.built_rows.load_built` restoring them and keeping it lazy);
  ``shard_load.py``: a ``LoadShard``'s partitions checked, nothing changed (:func:`~psflow.ps.shard_load.plan_load`),
  then written (:class:`~psflow.ps.shard_load.LoadPlan`).
* ``checkpointing.py``: :class:`~psflow.ps.checkpointing.CheckpointHandlers` (a task's shard save/load,
  readiness, restore calls); ``save_ledger.py``: :class:`~psflow.ps.save_ledger.SaveLedger` (the checkpoint
  ledger, ``CheckpointStatus``).
* ``counters.py``: :class:`~psflow.ps.counters.ServiceCounters` (``Stats``).
* ``replication/``: replicated shards (issue 28), a primary forwarding what it applied to its backups,
  promotion, the dedup table; its own map is in ``psflow.ps.replication``.
* ``dynamic/``: dynamic (hash) embedding tables; their own map is in ``psflow.ps.dynamic``.

Files (the calling side):

* ``protocol/``: one frozen message per call, the only module spelling a wire key (its own map).
* ``client.py``: :class:`~psflow.ps.client.ParameterClient` (``PushResult``, ``PendingPushPull`` re-exported);
  ``task_calls.py``: :class:`~psflow.ps.task_calls.TaskCalls` (a client's requests sent to each ps task, or
  a replicated shard's primary, and the replies waited for); ``push_calls.py``: a push as calls (each task's
  request, push and pull in one call, :class:`~psflow.ps.push_calls.OrderedPushes`,
  :class:`~psflow.ps.push_calls.PendingPushPull`, :class:`~psflow.ps.push_calls.PushResult`); ``rows_first.py``:
  :func:`~psflow.ps.rows_first.read_rows` (a ``PushPullAckLater``'s rows read before its push is acknowledged,
  every applied push's ``Acked`` sent also when its reply cannot be read);
  ``plans.py``: pull/push routing (:class:`~psflow.ps.plans.Planner`, :class:`~psflow.ps.plans.ClientError`);
  ``registration.py``: :func:`~psflow.ps.registration.register_layout` and the wait for the chief.
* ``failover.py``: (replicated shards) :class:`~psflow.ps.failover.ShardRouter`, routing each shard to its
  current primary and resending a push that failed over; ``primary_choice.py``: its rule
  (:func:`~psflow.ps.primary_choice.decide`); ``member_evidence.py``: what proves a member gone to it
  (:class:`~psflow.ps.member_evidence.MemberEvidence`); ``control_routes.py``: a router of its own for a worker's calls
  off its training thread (:class:`~psflow.ps.control_routes.ControlRouter`: the chief election's promotion
  of shard 0's backup, the new chief's fence); ``push_numbers.py``: each push call's ``push_id`` and each
  shard's ``acked`` (:class:`~psflow.ps.push_numbers.PushNumbers`); ``report_done.py``: ``Done``'s retry loop
  (:func:`~psflow.ps.report_done.send_done`).
* ``fencing.py``: :class:`~psflow.ps.fencing.FencedWriter` (the leader checks its epoch on every task).
* ``idle.py``: :func:`~psflow.ps.idle.idle_tasks` (the ps tasks that hold nothing, by the placement).

Guarantees (docs/architecture.md, DESIGN.md): a push increments global_step once and returns the value
after its own increment; a client whose layout differs from the registered one is refused
(:class:`~psflow.placement.api.LayoutMismatchError`); async pushes apply on arrival, sync ones once per
aggregated step, stale ones are dropped and counted. The ps imports nothing of
the input pipeline (``psflow.data``), the models, training or the launcher (``lint-imports`` checks).
"""
