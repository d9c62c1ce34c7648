"""psflow.status: what a run looks like -- the live status page, ``/metrics``, the console's progress, the final figures.

A run is watched from outside: a :class:`~psflow.status.collector.StatusCollector` pings every task and asks
the ps tasks for ``Stats`` on its own thread and keeps the newest snapshot; the status server serves that
snapshot as a page, as JSON and as Prometheus text; the console shows progress; at the run's end one final
snapshot gives every figure that ``metrics.json``, ``status.json``, ``metrics.prom`` and the console's last
lines share. Who runs the collector and the server (the local launcher, the chief under ``psflow server``)
is the launcher's business (:mod:`psflow.launch.run_status`), not this package's.

Classes and functions, by file:

* ``collector.py`` -- :class:`~psflow.status.collector.StatusCollector` (samples a cluster, keeps the
  newest snapshot, writes ``status.json``), :class:`~psflow.status.collector.ProcessInfo` (what a launcher
  adds about a task's process), ``STATUS_FILE``, ``FINAL_FIGURES``.
* ``views.py`` -- the parts of a snapshot made from the tasks' answers: :func:`~psflow.status.views.busiest_ps`,
  :func:`~psflow.status.views.restored_at`, the ``sync``, ``ssp`` and ``checkpoints`` views.
* ``server.py`` -- :class:`~psflow.status.server.StatusServer` (the page, ``/api/status``, ``/metrics``;
  who may read them), :class:`~psflow.status.server.StatusConfig`, :func:`~psflow.status.server.prometheus_text`.
* ``page/`` -- the page itself (``index.html``, ``status.js``, ``status.css``), package data served as is.
* ``progress.py`` -- :class:`~psflow.status.progress.Progress`: the console's bar or lines, and the final line.
* ``final_snapshot.py`` -- :func:`~psflow.status.final_snapshot.final_snapshot`: the one set of numbers a
  run's end is reported from; :func:`~psflow.status.final_snapshot.resumed_from`.
* ``replication.py`` -- replicated ps shards (``--ps-replicas``) as a run reports them: each shard's primary's
  ``Stats`` (:func:`~psflow.status.replication.shard_primaries`), ``pushes_acknowledged``, ``pushes_applied``,
  ``updates_lost`` and each backup's lag (:func:`~psflow.status.replication.replication_view`).
* ``report.py`` -- ``psflow report``: PNG plots of a run from its TensorBoard summaries.

Guarantees: watching never changes the run (reads only: pings, ``Stats``, ``CheckpointStatus``, summary
files) and never blocks it (the collector samples on its own thread, each call with a short deadline); a
task that does not answer keeps its last numbers and shows as unreachable; after the run's end every figure
shown is the final snapshot's. This package imports the rpc carriers, the checkpoint ledger and the
summaries' reader, never the launcher or the worker loop.
"""
