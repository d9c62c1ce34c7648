"""psflow.launch: a run's processes -- started, watched, restarted and ended; and a whole run in one process.

``psflow train`` runs a cluster of real processes on 127.0.0.1 (:func:`~psflow.launch.local.run_local`), or
everything in one process (:func:`~psflow.launch.in_process.run_in_process`); each task process, here or
under ``psflow server``, enters through :mod:`psflow.launch.task` (``python -m psflow.launch.task``).

Classes and functions, by file:

* ``local.py`` -- :func:`~psflow.launch.local.run_local`: a local run from its lock to its final snapshot
  (start, watch, evaluate, end); :func:`~psflow.launch.local.exactly_once_examples`.
* ``processes.py`` -- :class:`~psflow.launch.processes.LocalCluster` (the task processes, each in its own
  process group, ended by pid), :class:`~psflow.launch.processes.TaskProcess`,
  :class:`~psflow.launch.processes.TaskHosts`, :class:`~psflow.launch.processes.LaunchError`,
  :func:`~psflow.launch.processes.failure_report`.
* ``exits.py`` -- :func:`~psflow.launch.exits.wait_for_exit`: the watch loop's wait, woken by a task's exit; a task's
  :class:`~psflow.launch.exits.ProcessDescriptor`, through which other threads signal it and ask its exit and stop.
* ``eval_set.py`` -- :class:`~psflow.launch.eval_set.EvalSet`: the eval set, read while the tasks train.
* ``final_model.py`` -- :func:`~psflow.launch.final_model.evaluate_final`: a finished run evaluates its live ps tasks,
  or its final checkpoint where a ps task lost its state after training.
* ``restore_loss.py`` -- :func:`~psflow.launch.restore_loss.restore_loss`: what a restore within a run took from
  its final model (``metrics.json`` ``restore_loss``, a line at the end); ``idle_ps.py`` -- the lines naming the ps
  tasks that hold none of the model's variables (at the start) and those of them restarted (at the end).
* ``in_process.py`` -- :func:`~psflow.launch.in_process.run_in_process`: the fast path with no RPC.
* ``task.py`` -- the entry point of one task process (:func:`~psflow.launch.task.run_task`: a ps task
  serves, a worker trains), its logging and its one-line errors.
* ``log_format.py`` -- the format of psflow's log lines, and a formatter and record settings that make a
  line cheap to write (a worker at ``--log-every 1`` writes two a step).
* ``lifeline.py`` -- tasks never outlive their launcher (a pipe and a parent-death signal); signals stop a
  task in order (:class:`~psflow.launch.lifeline.StopRequest`).
* ``launcher_signals.py`` -- signals stop the launcher in order
  (:class:`~psflow.launch.launcher_signals.LaunchInterrupted`; both re-exported by ``lifeline``).
* ``stop_signals.py`` -- the stop signals (SIGTERM, SIGHUP, SIGINT); one inherited ignored (``nohup``) stays so.
* ``supervisor.py`` -- the restart policy (``never``, ``on-failure``, ``always``, with backoff) and
  :func:`~psflow.launch.supervisor.describe_exit`.
* ``resilience.py`` -- what the watch loop does about failures: restarts, hang detection, chaos.
* ``resilience_flags.py`` -- ``psflow train``'s ``failures`` flags and the config they build.
* ``health.py`` -- :class:`~psflow.launch.health.HealthMonitor`: pings every task, reports the silent ones.
* ``hang_kill.py`` -- :func:`~psflow.launch.hang_kill.kill_hung`: the process a hang was decided for is killed,
  never a replacement started since.
* ``chaos.py`` -- ``--chaos``: faults injected on a schedule (:class:`~psflow.launch.chaos.ChaosInjector`).
* ``chaos_plan.py`` -- a ``--chaos`` spec's grammar, its target, and the checks made before anything starts.
* ``shard_targets.py`` -- which member a fault on a replicated ps shard hits (``ps:N``: its current primary,
  ``ps-backup:N``: one of its backups), asked of the members when it fires.
* ``fault_recovery.py`` -- when an injected fault recovered (``recovery_seconds``, ``recovered_at_step``), or why
  not by the run's end (``why``); the chaos thread's global_step readings.
* ``run_end.py`` -- :class:`~psflow.launch.run_end.RunEnd`: how one local run ends, its final snapshot taken once.
* ``run_status.py`` -- who serves the status page and writes ``metrics.json``, ``status.json`` and
  ``metrics.prom``: the local launcher (:class:`~psflow.launch.run_status.LauncherStatus`), the in-process
  run, or the chief under ``psflow server`` (:func:`~psflow.launch.run_status.chief_status_page`).
* ``evaluator.py`` -- TensorFlow's evaluator task: evaluates each new checkpoint on held-out data.
* ``console.py`` -- one line per expected error, gRPC's C-core quiet (the command's and every task's).
* ``token.py`` -- the cluster token from ``PSFLOW_TOKEN``, read at the edge (the command and each task).
* ``ports.py`` -- free ports on this machine.
* ``port_retry.py`` -- a port another process took before its task bound it, before training started: the
  cluster starts again on new ports (at most 3 starts).

Guarantees: every process started here is ended here, by pid, whatever happens (KeyboardInterrupt and
signals included), and none outlives the launcher; a failed task is reported by name, the first one as the
root cause. What a run looks like is :mod:`psflow.status`; the command line is :mod:`psflow.cli`.
"""
