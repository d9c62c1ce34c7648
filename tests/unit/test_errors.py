"""One error root: every exception class psflow defines derives from psflow.errors.PsflowError (issue 27, item 5)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import psflow
from psflow.errors import CheckpointError, ConfigError, PsError, PsflowError, TrainingError

PACKAGE_DIR = Path(psflow.__file__).parent

#: Modules not imported: ``python -m psflow`` runs the command line when imported (checked by reading it instead).
NOT_IMPORTED = {"psflow.__main__"}

#: Defined in psflow, derived from BaseException but deliberately not from Exception, so not from PsflowError
#: either: a signal to the launcher is a KeyboardInterrupt (as SIGINT always was), which ``except Exception``
#: (psflow's own cleanup paths among them) must let through.
SIGNALS = {"psflow.launch.launcher_signals.LaunchInterrupted"}


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages([str(PACKAGE_DIR)], "psflow.") if m.name not in NOT_IMPORTED)


def _classes(owner: object, module: str) -> Iterator[type]:
    """The classes ``owner`` (a module or a class) defines, nested ones included."""
    for value in vars(owner).values():
        if inspect.isclass(value) and value.__module__ == module and value is not owner:
            yield value
            yield from _classes(value, module)


def _exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in _modules():
        module = importlib.import_module(name)  # every module imports: a failure here is a bug too
        for cls in _classes(module, name):
            if issubclass(cls, BaseException):
                found[f"{name}.{cls.__qualname__}"] = cls
    return found


def test_every_exception_class_psflow_defines_derives_from_psflow_error() -> None:
    classes = _exception_classes()
    assert len(classes) > 40, sorted(classes)  # the walk found the package's modules
    outside = sorted(name for name, cls in classes.items() if not issubclass(cls, PsflowError))
    assert outside == sorted(SIGNALS), f"not under psflow.errors.PsflowError: {sorted(set(outside) - SIGNALS)}"
    for name in SIGNALS:
        assert not issubclass(classes[name], Exception), name


def test_the_modules_not_imported_define_no_class() -> None:
    for name in NOT_IMPORTED:
        path = PACKAGE_DIR / (name.removeprefix("psflow.").replace(".", "/") + ".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)], path


@pytest.mark.parametrize(("name", "mixin"), [
    ("psflow.errors.ConfigError", ValueError),
    ("psflow.extras.MissingExtraError", ImportError),
    ("psflow.cluster.spec.ClusterError", ValueError),
    ("psflow.placement.api.PlacementError", ValueError),
    ("psflow.models.api.ModelError", ValueError),
    ("psflow.ps.store.StoreError", ValueError),
    ("psflow.optim.spec.OptimizerError", ValueError),
    ("psflow.optim.schedules.ScheduleError", ValueError),
    ("psflow.ps.initializers.InitializerError", ValueError),
    ("psflow.ps.global_step.StepJournalError", RuntimeError),
    ("psflow.rpc.framing.FrameError", ValueError),
    ("psflow.rpc.api.ListenError", RuntimeError),
    ("psflow.storage.UnknownSchemeError", ValueError),
    ("psflow.train.hooks.NanLossError", RuntimeError),
    ("psflow.launch.processes.LaunchError", RuntimeError),
])
def test_the_builtin_bases_callers_catch_stay(name: str, mixin: type[Exception]) -> None:
    """``except ValueError`` (and the others) around psflow calls keeps catching what it caught."""
    module, _, cls = name.rpartition(".")
    error = getattr(importlib.import_module(module), cls)
    assert issubclass(error, PsflowError) and issubclass(error, mixin)


def test_one_base_per_subsystem() -> None:
    from psflow.checkpoint.lock import CheckpointLockedError
    from psflow.checkpoint.save import CheckpointFencedError, CheckpointSavesFailedError
    from psflow.cluster import ClusterError
    from psflow.coord.api import CoordinationError, FencedError
    from psflow.data import BadRecordError, DataError
    from psflow.optim import OptimizerError
    from psflow.ps.dynamic import DynamicTableError
    from psflow.ps.store import StoreError
    from psflow.rpc.api import RpcError, TaskUnavailableError
    from psflow.train.config import ConfigError as ConfigErrorOfTrainConfig
    from psflow.train.hooks import NanLossError
    from psflow.train.state_loss import StateLostError

    assert ConfigErrorOfTrainConfig is ConfigError  # the old import keeps working: one class
    for base in (ClusterError, CoordinationError, DataError, RpcError, PsError, CheckpointError, ConfigError,
                 TrainingError):
        assert base.__mro__[1] is PsflowError, base
    assert issubclass(FencedError, CoordinationError) and issubclass(BadRecordError, DataError)
    assert issubclass(TaskUnavailableError, RpcError)
    assert all(issubclass(e, PsError) for e in (StoreError, DynamicTableError, OptimizerError))
    assert issubclass(CheckpointLockedError, CheckpointError) and issubclass(CheckpointFencedError, CheckpointError)
    # The guards that let the chief go on after one failed save catch CheckpointError: this one must pass them.
    assert not issubclass(CheckpointSavesFailedError, CheckpointError)
    assert all(issubclass(e, TrainingError) for e in (NanLossError, StateLostError, CheckpointSavesFailedError))


def test_psflow_error_is_exported_and_caught_by_except_exception() -> None:
    assert psflow.PsflowError is PsflowError and "PsflowError" in psflow.__all__
    assert issubclass(PsflowError, Exception)


def _psflow_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {n for n in names if n == "psflow" or n.startswith("psflow.")}


def test_errors_is_a_leaf_and_extras_imports_only_it() -> None:
    assert _psflow_imports(PACKAGE_DIR / "errors.py") == set()
    assert _psflow_imports(PACKAGE_DIR / "extras.py") == {"psflow.errors"}  # not psflow.train.config
