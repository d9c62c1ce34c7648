"""psflow.train: the worker side of training -- the step, the loop, its session and hooks, the chief's duties.

Every path (a cluster worker, ``--in-process``, the in-graph client) runs one
:class:`~psflow.train.step.TrainStep` (pull, compute, push), the order and guarantees of
:mod:`psflow.models.api`. The ps client is :mod:`psflow.ps.client`; checkpoints are :mod:`psflow.checkpoint`.

Classes and functions, by file:

* ``config/`` -- :class:`~psflow.train.config.TrainConfig`: every setting of a run, parsed once at the edge, in
  groups by concern (data, model, optimizer, cluster, sync, checkpoint, report, chief, compute);
  ``faults.py`` -- :class:`~psflow.train.faults.FaultInjection`: the faults tests and drills inject, beside
  the settings (the task config file's ``"faults"``), never in them.
* ``build.py`` -- from a run's settings to its model, data schema and placed variables.
* ``inputs.py`` -- checks of a run's input files before any task starts; ``preflight.py`` -- settings
  checked before any task starts (memory, resume), each refused in one line.
* ``step.py`` -- :class:`~psflow.train.step.TrainStep`: one training step of any model.
* ``pipeline.py`` -- :class:`~psflow.train.pipeline.PipelinedStep`: K-1 pushes in flight per worker
  (``--steps-in-flight`` 3 to 8), results returned as their replies arrive.
* ``clipping.py`` -- gradient clipping by global norm.
* ``worker.py`` -- :func:`~psflow.train.worker.run_worker`: the between-graph training loop of one worker;
  ``worker_result.py`` -- what it (or the in-graph client) reports when it finishes, the evaluations its duties did
  not do among it (:class:`~psflow.train.worker_result.WorkerResult`, metrics.json's ``eval_not_done``);
  ``final_duties.py`` -- a worker's chief duties once its data ended: hand them on, or (the last to finish)
  hold the lease so its session writes the final checkpoint; ``take_over.py`` -- a finished worker takes the duties
  back when no worker that trains is left (the chief killed for good: :class:`~psflow.train.take_over.TakeOver`);
  ``taken_over.py`` -- a worker resumed after a take-over ended the run stops before its duties write
  (:class:`~psflow.train.taken_over.TakenOverHook`); ``final_eval.py`` -- the final model evaluated once
  when two workers hold the duties at their end in turn (:class:`~psflow.train.final_eval.FinalEvalOnce`, a record
  on ps task 0); ``read_ahead.py`` -- its reader started at the
  shard's beginning before it joins, kept only where its data starts there (:class:`~psflow.train.read_ahead.ReadAhead`).
* ``session.py`` -- :class:`~psflow.train.session.MonitoredTrainingSession`: a loop's session with hooks;
  ``hook_api.py`` -- the hook interface (:class:`~psflow.train.hook_api.SessionRunHook`, the order of its calls);
  ``hooks.py`` -- the built-in hooks (stop at a step, log, checkpoint, summaries, evaluation, NaN loss): they decide
  when a loop stops and what it logs; the loop reads the session's decision; ``summary_hook.py`` -- the summaries'
  hook (:class:`~psflow.train.summary_hook.SummarySaverHook`, exported from ``hooks.py``).
* ``duties.py`` -- a worker's session and hooks built from a TrainConfig; who takes the run and
  checkpoint locks when; ``deferred_end.py`` -- a chief duty's failed end() raised after every duty ran;
  ``lock_at_end.py`` -- the release of the checkpoint lock a session's duties took, once no save given up still runs.
  ``unsent_reports.py`` -- the checkpoint reports the ledger missed, sent by their worker whether or not it still
  holds the duties.
* ``chief.py`` -- who the chief is, and how a client joins the cluster (initialize, restore, warm start).
* ``recovery.py`` -- an elected chief (:class:`~psflow.train.recovery.Leadership`) and restores after a ps
  task died (:class:`~psflow.train.recovery.ClusterRecovery`); ``leader_hooks.py`` -- the chief duties' hooks
  that follow its lease (:class:`~psflow.train.leader_hooks.LeaderOnlyHook`); ``leadership.py`` -- the lease's
  campaign (:class:`~psflow.train.leadership.Leadership`, exported by ``recovery.py``); ``state_loss.py`` -- a ps task that lost
  its variables with no checkpoint to restore them from stops the run (:class:`~psflow.train.state_loss.StateLostError`);
  ``within_run.py`` -- every ps task empty: lost within this run (restored past global_step's journal bound) or a new run;
  ``generation_restore.py`` -- a restore within a run at a new generation (the lease holder's, a restarted chief's join);
  ``idle_tasks.py`` -- a ps task that holds nothing, restarted, made ready at the cluster's generation (no restore).
* ``evaluation.py`` -- evaluation and prediction of any model, the one implementation every caller uses.
* ``ready_eval.py`` -- the chief's evaluation of live ps tasks: metrics of one ready model, or not done (a restore).
* ``summary.py`` -- TensorBoard summaries: written by the chief, read back for reports and the status page.
* ``in_graph.py`` -- in-graph replication, the worker's side (:class:`~psflow.train.in_graph.StepService`);
  ``in_graph_client.py`` -- the in-graph client that drives every worker task and is the run's chief.

This package imports the ps client, the checkpoint package, the models and the input pipeline, never the
launcher, the status page or the command line.
"""
