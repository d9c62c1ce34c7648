"""Optional parts of psflow (pip extras) and the one-line error when one is missing.

``pip install psflow`` installs the core: training, serving, convert, export,
predict and summaries. Each extra below adds one feature's library:

* ``plots`` (matplotlib): ``psflow report``, PNG plots of a run.
* ``tensorboard`` (tensorboard): the TensorBoard viewer, ``tensorboard --logdir RUN_DIR``
  (psflow writes and reads its summaries without it).
* ``zookeeper`` (kazoo): ``--coordination zookeeper``.
* ``torch`` (torch): :mod:`psflow.torch` and ``--model wide_deep|deepfm|dnn``.
* ``cloud`` (fsspec, s3fs, gcsfs): checkpoints and inputs at ``s3://`` and ``gs://`` URLs
  (:mod:`psflow.storage`).
* ``all``: every extra above.

A feature imports its library through :func:`require` when it is used, never
at ``import psflow``; without it the feature stops with
:class:`MissingExtraError`, whose message is one line the CLI prints as is:
``plots need matplotlib: pip install 'psflow[plots]'``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from psflow.errors import ConfigError

__all__ = ["EXTRAS", "MissingExtraError", "extra_for", "missing_extra_message", "require"]

#: Top-level module -> the extra that installs it.
EXTRAS = {"matplotlib": "plots", "tensorboard": "tensorboard", "kazoo": "zookeeper", "torch": "torch",
          "fsspec": "cloud", "s3fs": "cloud", "gcsfs": "cloud"}


class MissingExtraError(ConfigError, ImportError):
    """A feature's optional library is not installed.

    A :class:`~psflow.errors.ConfigError` (the CLI prints it as one line,
    exit status 1) and an :class:`ImportError` (``except ImportError`` still
    catches it where a feature is imported).

    Attributes:
        name: the module that could not be imported (as on ImportError).
        extra: the pip extra that installs it.
    """

    def __init__(self, message: str, *, module: str, extra: str) -> None:
        super().__init__(message)
        self.msg = message
        self.name = module
        self.extra = extra

    def __str__(self) -> str:
        return self.msg


def missing_extra_message(feature: str, package: str, extra: str, *, plural: bool = False) -> str:
    """``"<feature> needs <package>: pip install 'psflow[<extra>]'"`` ("need" when ``plural``)."""
    return f"{feature} {'need' if plural else 'needs'} {package}: pip install 'psflow[{extra}]'"


def extra_for(error: ImportError) -> str | None:
    """The extra whose module ``error`` found missing, or None (another module, or another import failure)."""
    if not isinstance(error, ModuleNotFoundError | MissingExtraError) or not error.name:
        return None
    return EXTRAS.get(error.name.split(".")[0])


def require(module: str, extra: str, feature: str, *, plural: bool = False) -> ModuleType:
    """Imports ``module`` (a feature's optional library) and returns it.

    Args:
        module: the module to import, e.g. ``"matplotlib"`` or ``"kazoo.client"``.
        extra: the pip extra that installs it, e.g. ``"plots"``.
        feature: what needs it, the subject of the message, e.g. ``"plots"``
            or ``"--coordination zookeeper"``.
        plural: ``feature`` is plural ("plots need", not "plots needs").

    Raises:
        MissingExtraError: the module's package is not installed (a failure
            inside an installed package is raised as it is).
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        top = module.split(".")[0]
        if e.name is None or e.name.split(".")[0] != top:
            raise  # the library is installed but one of its own imports failed: not a missing extra
        raise MissingExtraError(missing_extra_message(feature, top, extra, plural=plural), module=top, extra=extra) from e
