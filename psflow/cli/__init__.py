"""psflow.cli: the ``psflow`` command line, one file per subcommand group.

Every setting is parsed here, once, into a :class:`~psflow.train.config.TrainConfig` (or a command's own
config); ``TF_CONFIG`` is read here and nowhere else, ``PSFLOW_TOKEN`` through
:func:`psflow.launch.token.cluster_token`. A user's mistake prints one line naming the flag, file, record or
port (every :class:`~psflow.errors.PsflowError`, :data:`psflow.launch.console.ONE_LINE_ERRORS`); a bug keeps
its traceback. Nothing imported by ``psflow.cli.main`` at module level imports ``grpc``: :func:`main` sets
gRPC's logging first, so the modules that import it are imported in the functions that use them.

Classes and functions, by file:

* ``main.py`` -- :func:`~psflow.cli.main.main` (the ``psflow`` console script: dispatch, one-line errors,
  exit status) and :func:`~psflow.cli.main.build_parser`.
* ``parser.py`` -- :class:`~psflow.cli.parser.CommandParser`: usage errors as one line, exit status 1.
* ``training.py`` -- the training flags (data, model, optimizer, cluster, sync, devices; the chief's
  checkpoint, summary, evaluation and election flags) read into a checked ``TrainConfig``
  (:func:`~psflow.cli.training.config_from_args`, :func:`~psflow.cli.training.train_config`).
* ``train.py`` -- ``psflow train`` (:func:`~psflow.cli.train.run_train`): a local cluster or ``--in-process``.
* ``server.py`` -- ``psflow server`` (:func:`~psflow.cli.server.run_server`): one task of a cluster that
  spans machines, the evaluator task included; its security and TCP flags.
* ``tls_flags.py`` -- the ``--tls-*`` flags of ``psflow server``, ``psflow shutdown`` and ``psflow status``.
* ``shutdown.py`` -- ``psflow shutdown`` (:func:`~psflow.cli.shutdown.shutdown_cluster`).
* ``status.py`` -- ``psflow status RUN_DIR_OR_URL`` (the status page's picture in a terminal) and the
  status page's flags (:func:`~psflow.cli.status.status_config`).
* ``tools.py`` -- ``psflow export``, ``psflow predict``, ``psflow report``.
* ``k8s.py`` -- ``psflow k8s render``'s flags and command (the manifests: :mod:`psflow.deploy`).

``psflow convert`` and ``psflow schema`` are the input pipeline's own (:mod:`psflow.data.convert`,
:mod:`psflow.data.infer`). This package is the top layer: nothing in psflow imports it.
"""
