"""Models by name: the built-in ones, and a user's own by import path.

>>> create_model("logistic", ModelConfig(num_features=124))     # doctest: +SKIP
>>> create_model("examples.wide_deep_numpy:WideDeep", config)   # doctest: +SKIP

A name is either a registered name (:data:`MODELS`) or ``package.module:Class``
naming a :class:`~psflow.models.api.Model` subclass. Nothing is imported until
a model is created. A user's module is imported with ``search_path`` (the
directory ``psflow train`` was started in, recorded in the run's config) first
on ``sys.path``, so every task process finds it wherever it was started.

Importing a module runs its code, so a model named by a *file* (an export's
``model.json``, a checkpoint's manifest: data anyone may have sent) is built
only if :func:`trusted_model` allows it: a registered model, or the module the
user named too (``--model``), or one they said they trust
(``psflow predict --trust-model-module``). Nothing is imported to decide.
"""

from __future__ import annotations

import importlib
import re
import sys
import traceback

from psflow.models.api import Model, ModelConfig, ModelError

__all__ = ["MODELS", "model_names", "register_model", "model_class", "create_model", "trusted_model"]

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
    except SyntaxError as e:  # the user's module does not parse
        raise ModelError(f"model {name!r}: module {module_name!r} does not parse: {e.filename}:{e.lineno}: "
                         f"{e.msg}") from e
    except Exception as e:  # the user's module raised while it ran (its top level)
        frame = traceback.extract_tb(e.__traceback__)[-1]
        raise ModelError(f"model {name!r}: importing module {module_name!r} raised {type(e).__name__} at "
                         f"{frame.filename}:{frame.lineno}: {e}") from e
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ModelError(f"model {name!r}: module {module_name!r} ({getattr(module, '__file__', None) or 'no file'}) "
                         f"has no class {class_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Model)):
        raise ModelError(f"model {name!r}: {target} is not a subclass of psflow.models.Model")
    return cls


def trusted_model(recorded: str, where: str, *, named: str | None = None, trust_module: bool = False) -> str:
    """``recorded``, the model a file names, if psflow may build it; imports nothing.

    A file (an export's ``model.json``, a checkpoint's manifest) is data: it
    may have come from anyone, and importing the module it names would run
    that module's code. So its model is built only if it is a registered model
    (or the target of one), or the model the user named (``named``, e.g.
    ``--model``), or ``trust_module`` (the user said they trust the file).

    Args:
        recorded: the model's name as the file records it.
        where: the file, for the message.
        named: the model the user named on the command line (None: none).
        trust_module: import whatever module the file names.

    Returns:
        ``recorded``.

    Raises:
        ModelError: a module the user did not name (says how to name it).
    """
    if recorded in MODELS or recorded in MODELS.values() or not _PATH_RE.match(recorded):
        return recorded  # built in, or no module path at all (model_class refuses an unknown name)
    if trust_module or (named is not None and MODELS.get(named, named) == recorded):
        return recorded
    module = recorded.split(":")[0]
    other = f"; --model names {named!r}" if named is not None and named not in MODELS else ""
    raise ModelError(f"{where} names the model {recorded!r}{other}: psflow imports a module a file names (which "
                     f"runs its code) only when you name it yourself: if you trust module {module!r}, pass "
                     f"--model {recorded}")


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
