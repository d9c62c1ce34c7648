"""The root of every error psflow raises on purpose, and the bases that several layers share.

``except psflow.PsflowError`` catches every error psflow raises on purpose: each names what is wrong
(the flag, file, record, task, variable or port) in its message. Anything else that escapes psflow
(a ``TypeError``, an ``AssertionError``, a ``KeyError``) is a bug, and the ``psflow`` command shows
its traceback. The built-in class a caller may already catch stays a base too: a
:class:`ConfigError` is a ``ValueError``, a :class:`~psflow.extras.MissingExtraError` an
``ImportError``, a :class:`~psflow.rpc.api.ListenError` a ``RuntimeError``.

The hierarchy (``(ValueError)``: also derives from that built-in class; module in brackets)::

    PsflowError
    ├── ConfigError (ValueError)                   a setting out of range or inconsistent
    │   ├── MissingExtraError (ImportError)        [extras] a feature's pip extra is not installed
    │   ├── RenderError                            [deploy.config] manifests cannot be written
    │   └── ChaosError                             [launch.chaos_plan] a chaos schedule is malformed
    ├── ClusterError (ValueError)                  [cluster.spec] a cluster spec or TF_CONFIG
    │   ├── UnknownJobError
    │   └── UnknownTaskError
    ├── PlacementError (ValueError)                [placement.api] partitioning, placement
    │   └── LayoutMismatchError                    another layout than the checkpoint's
    ├── ModelError (ValueError)                    [models.api] a model, its spec or its output
    ├── DataError                                  [data.api] an input file, record or schema
    │   ├── BadRecordError
    │   └── TooManyBadRecordsError
    ├── StorageError                               [storage] a storage URL or its client
    │   └── UnknownSchemeError (ValueError)
    ├── RpcError                                   [rpc.api] a remote call failed
    │   ├── TaskUnavailableError, InvalidArgumentError, DeadlineExceededError,
    │   │   UnauthenticatedError, RemoteError
    │   ├── FailedPreconditionError                the call conflicts with the task's state
    │   │   └── FencedOffError                     its fencing token was superseded (ABORTED)
    │   └── ListenError (RuntimeError)             a task cannot listen on its port
    ├── FrameError (ValueError)                    [rpc.framing] bytes that are not a frame
    ├── InvalidRequest (ValueError)                [rpc.api] a handler refuses a request
    ├── PreconditionFailed                         [rpc.api] a handler cannot serve it now
    │   └── FencedOff                              [rpc.api] the request's fencing token superseded
    ├── CoordinationError                          [coord.api] leases and elections
    │   ├── BackendUnavailableError, CampaignTimeoutError, LeaseLostError, FencedError
    ├── PsError                                    the ps tasks' state and their client
    │   ├── StoreError (ValueError)                [here; ps.store] unknown partition, wrong shape
    │   │   └── DynamicTableError                  [here; ps.dynamic] a dynamic table, its spec or ids
    │   ├── OptimizerError (ValueError)            [optim.spec]
    │   ├── InitializerError (ValueError)          [ps.initializers]
    │   ├── ScheduleError (ValueError)             [optim.schedules]
    │   ├── StepJournalError (RuntimeError)        [ps.global_step] the journal file
    │   └── ClientError (ValueError)               [ps client] unknown variable, wrong shape
    ├── CheckpointError                            a checkpoint cannot be written, found, read
    │   ├── CheckpointLockedError                  [checkpoint.lock] another run holds it
    │   ├── CheckpointFencedError                  [checkpoint.save] a newer chief fenced it off
    │   └── RestoreRefusedError                    [checkpoint.restore] another restore began since
    ├── DirectoryLockError                         [checkpoint.lock] a run directory's lock
    │   └── RunDirLockedError
    ├── TrainingError                              a training run cannot go on
    │   ├── NanLossError (RuntimeError)            [train.hooks]
    │   ├── RecoveryError (RuntimeError)           [train.recovery] the cluster not restored in time
    │   ├── StateLostError (RuntimeError)          [train.state_loss] no checkpoint to restore from
    │   ├── CheckpointSavesFailedError (RuntimeError)  [checkpoint.save] saves failed in a row
    │   ├── FinalCheckpointError (RuntimeError)    [checkpoint.save] the final checkpoint not written
    │   └── WorkerStopped                          [train.worker] asked to stop, left its loop
    ├── LaunchError (RuntimeError)                 [launch.processes] a task of a local cluster failed
    ├── EndNotWritten (OSError)                    [launch.launcher_signals] a run's metrics.json not written
    ├── ReportError                                [status.report] no summaries to plot
    └── StatusError                                [cli.status] a run's status unreadable

Not a ``PsflowError``: :class:`~psflow.launch.lifeline.LaunchInterrupted`, the launcher's signal, is a
``KeyboardInterrupt`` (as SIGINT always was), which ``except Exception`` must let through.

A subsystem's base lives here when a lower layer raises it too (:class:`ConfigError` is raised by
:mod:`psflow.extras`, a leaf) or when the subsystem has no ``api`` module (the ps, checkpoints,
training); otherwise in the subsystem's ``api`` module. :class:`StoreError` and :class:`DynamicTableError`
live here because :func:`psflow.placement.hashing.owner_of`, below the ps, raises the latter for bad ids
(``psflow.ps.store`` and ``psflow.ps.dynamic`` re-export them). The guards that let the chief go on after one
failed save catch :class:`CheckpointError`: :class:`CheckpointSavesFailedError` and
:class:`FinalCheckpointError`, which stop the run, are deliberately not ones.

This module imports nothing of psflow: every layer may import it.
"""

from __future__ import annotations

__all__ = ["PsflowError", "ConfigError", "PsError", "StoreError", "DynamicTableError", "CheckpointError", "TrainingError"]


class PsflowError(Exception):
    """Base of every error psflow raises on purpose; its message names what is wrong."""


class ConfigError(PsflowError, ValueError):
    """A setting is out of range or inconsistent with another."""


class PsError(PsflowError):
    """Base of the errors of the ps tasks' state (store, optimizers, initializers, schedules, step journal)
    and of the client that calls them."""


class StoreError(PsError, ValueError):
    """A request names an unknown partition or has the wrong dtype/shape/rows."""


class DynamicTableError(StoreError):
    """A dynamic table's spec, or a call on it or on its ids, is invalid; the message names the table or call."""


class CheckpointError(PsflowError):
    """A checkpoint cannot be written, found, read or restored (names the file or variable)."""


class TrainingError(PsflowError):
    """Base of the errors that end a training run (a loss no longer finite, the cluster not restored)."""
