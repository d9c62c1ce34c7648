"""Models by name: the built-in ones, and a user's own by import path.

>>> create_model("logistic", ModelConfig(num_features=124))     # doctest: +SKIP
>>> create_model("examples.wide_deep_numpy:WideDeep", config)   # doctest: +SKIP

A name is either a registered name (:data:`MODELS`) or ``package.module:Class``
naming a :class:`~psflow.models.api.Model` subclass. Nothing is imported until
a model is created. A user's module is imported with ``search_path`` (the
directory ``psflow train`` was started in, recorded in the run's config) first
on ``sys.path``, so every task process finds it wherever it was started.
"""

from __future__ import annotations

import importlib
import re
import sys

from psflow.models.api import Model, ModelConfig, ModelError

__all__ = ["MODELS", "model_names", "register_model", "model_class", "create_model"]

#: name -> "module:Class" of the built-in models.
MODELS: dict[str, str] = {
    "logistic": "psflow.models.logistic:LogisticRegression",
    "fm": "psflow.models.fm:FactorizationMachine",
    "wide_deep": "psflow.torch.ctr:WideDeep",
    "deepfm": "psflow.torch.ctr:DeepFM",
    "dnn": "psflow.torch.ctr:DNN",
}

_PATH_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*\Z")


def model_names() -> list[str]:
    """Registered model names, sorted."""
    return sorted(MODELS)


def register_model(name: str, target: str) -> None:
    """Registers ``"module:Class"`` under ``name`` (nothing is imported now).

    Raises:
        ModelError: ``target`` is not of the form ``module:Class``.
    """
    if not _PATH_RE.match(target):
        raise ModelError(f"model target must be 'package.module:Class', got {target!r}")
    MODELS[name] = target


def model_class(name: str, *, search_path: str | None = None) -> type[Model]:
    """The model class named ``name`` (a registered name or ``package.module:Class``).

    Args:
        name: the model's name.
        search_path: a directory put first on ``sys.path`` before importing a
            user's module (where ``psflow train`` was started).

    Raises:
        ModelError: unknown name (lists the registered ones), a module that
            cannot be imported, or a class that is not a Model subclass.
    """
    target = MODELS.get(name, name)
    if not _PATH_RE.match(target):
        raise ModelError(f"unknown model {name!r}: use one of {', '.join(model_names())} "
                         f"or 'package.module:Class' for your own")
    module_name, class_name = target.split(":")
    if search_path and search_path not in sys.path:
        sys.path.insert(0, search_path)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        from psflow.extras import extra_for, missing_extra_message  # here: psflow.extras imports psflow.train

        extra = extra_for(e)
        if extra is not None:  # e.g. "model 'wide_deep' needs torch: pip install 'psflow[torch]'"
            raise ModelError(missing_extra_message(f"model {name!r}", str(e.name).split(".")[0], extra)) from e
        where = f" (searched {search_path} first)" if search_path else ""
        raise ModelError(f"model {name!r}: cannot import module {module_name!r}{where}: {e}") from e
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Model)):
        raise ModelError(f"model {name!r}: {target} is not a subclass of psflow.models.Model")
    return cls


def create_model(name: str, config: ModelConfig, *, search_path: str | None = None) -> Model:
    """Builds model ``name`` from ``config``; its :attr:`~Model.name` is set to ``name``.

    Raises:
        ModelError: see :func:`model_class`; also a config the model refuses.
    """
    cls = model_class(name, search_path=search_path)
    try:
        model = cls(config)
    except ModelError:
        raise
    except (TypeError, ValueError, KeyError) as e:
        raise ModelError(f"model {name!r}: {e}") from e
    model.name = name
    return model
