"""What the command line shows when something is wrong: one line per expected error, gRPC's C-core quiet.

* **Expected errors** (:func:`expected_errors`: bad flags, inputs, records, schemas, checkpoints, a port
  in use) are the user's to fix: the ``psflow`` command and each task process print them as one line
  naming the flag, file, record or port, with no traceback (``--verbose`` adds it). Anything else is a
  bug and keeps its traceback.
* **gRPC's C-core log lines** (``E0000 ... GOAWAY received``) go to stderr from C, past Python's
  logging, and gRPC reads its settings once, when ``grpc`` is imported. :func:`quiet_grpc` sets them in
  an environment: in the ``psflow`` command's own (:func:`psflow.launch.cli.main`, before anything
  imports ``grpc``) and in every task's (:meth:`psflow.launch.local.LocalCluster.start_task`).

This module imports nothing that imports ``grpc``.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence

__all__ = ["GRPC_VERBOSITY_ENV", "expected_errors", "quiet_grpc", "wants_verbose"]

#: gRPC's minimum log severity (its C-core: DEBUG, INFO, ERROR, NONE), read when ``grpc`` is imported.
GRPC_VERBOSITY_ENV = "GRPC_VERBOSITY"


def quiet_grpc(env: MutableMapping[str, str], *, verbose: bool) -> None:
    """Unless ``verbose``: sets ``GRPC_VERBOSITY=NONE`` in ``env`` (gRPC's C-core prints nothing; every
    failure still reaches psflow as an :class:`~psflow.rpc.api.RpcError`). A value already in ``env``
    wins, and with ``verbose`` gRPC keeps its own defaults; ``GRPC_TRACE`` passes through either way
    (its lines print only at a verbosity other than NONE).

    Takes effect for a process that imports ``grpc`` after it (its own, or a child started with ``env``).
    """
    if not verbose:
        env.setdefault(GRPC_VERBOSITY_ENV, "NONE")


def wants_verbose(argv: Sequence[str]) -> bool:
    """Whether ``argv`` asks for ``--verbose``: read before the parser exists, because building it
    imports ``grpc`` (after which :func:`quiet_grpc` is too late for this process)."""
    args = list(argv)
    if "--" in args:
        args = args[: args.index("--")]
    return any(len(arg) >= 6 and "--verbose".startswith(arg) for arg in args)  # argparse takes "--verb" too


def expected_errors() -> tuple[type[Exception], ...]:
    """The errors a user causes and fixes (flags, inputs, records, schemas, models, checkpoints, storage URLs, a run
    directory or a port in use, a loss that is no longer finite): each carries a message that names what is wrong (a NaN
    loss: the worker, the step and the batch's files and records), so it is shown as that one line. Also a ps
    task's variables lost with no checkpoint to restore them from (the fix: a checkpoint directory).

    Not here: :class:`~psflow.rpc.api.RpcError` in general (a lost task is reported by the launcher as
    that task's exit), ``OSError`` (the ``psflow`` command adds both for its own, short-lived calls).
    """
    from psflow.cluster import ClusterError
    from psflow.data import DataError
    from psflow.models.api import ModelError
    from psflow.ps.global_step import StepJournalError
    from psflow.ps.optimizers import OptimizerError
    from psflow.rpc.api import ListenError
    from psflow.storage import StorageError
    from psflow.train.checkpoint import CheckpointError, CheckpointSavesFailedError
    from psflow.train.checkpoint_lock import DirectoryLockError
    from psflow.train.config import ConfigError
    from psflow.train.hooks import NanLossError
    from psflow.train.state_loss import StateLostError

    return (ConfigError, ClusterError, OptimizerError, DataError, ModelError, CheckpointError,
            CheckpointSavesFailedError, DirectoryLockError, StepJournalError, ListenError, NanLossError,
            StateLostError, StorageError)
