"""psflow.models: the model seam, the registry, and the built-in models.

A model is a class that declares its variables and computes a batch's loss
and gradients from the rows it asked for; the runtime (placement, pulls and
pushes, optimizers on the ps tasks, sync and ssp modes, checkpoints,
recovery, evaluation, export and predict) is the same for every model.

Files:

* ``api.py`` -- :class:`Model` (the interface; its docstring gives the order
  of a step and what the runtime guarantees), :class:`VariableSpec`,
  :class:`ModelConfig`, :class:`ModelOutput`, :class:`ModelError`.
* ``registry.py`` -- :func:`create_model`, :func:`model_class`,
  :func:`register_model`, :data:`MODELS`: built-in names, and
  ``package.module:Class`` for a user's own model.
* ``embedding.py`` -- :class:`EmbeddingLookup`: a sparse feature looked up in
  a table with TF's combiners (sum, mean, sqrtn; per-id weights; an example
  without ids gets zeros), forward and backward.
* ``features.py`` -- one shared hashed table for every sparse feature
  (:func:`shared_rows`), dense features as one matrix, segment sums.
* ``losses.py``, ``metrics.py`` -- sigmoid cross-entropy; AUC, log-loss, accuracy.
* ``logistic.py`` -- ``logistic``: sparse logistic regression; ``_logistic.c`` its
  per-entry forward products and gradient sums in C (optional, built by
  ``setup.py``; numpy twins in ``logistic.py``, the same numbers).
* ``fm.py`` -- ``fm``: a factorization machine.

Guarantees: a model never names the runtime's modules (it imports only
``psflow.data``, ``psflow.gradients``, ``psflow.native``, ``psflow.placement`` partitioners and
``psflow.optim`` specs; an import contract in ``pyproject.toml`` forbids the ps, training and launch
packages); the runtime never names a model's variables.
"""

from psflow.models.api import Lookups, Model, ModelConfig, ModelError, ModelOutput, Values, VariableSpec
from psflow.models.embedding import COMBINERS, EmbeddingLookup, unique_ids
from psflow.models.registry import MODELS, create_model, model_class, model_names, register_model

__all__ = [
    "COMBINERS",
    "EmbeddingLookup",
    "Lookups",
    "MODELS",
    "Model",
    "ModelConfig",
    "ModelError",
    "ModelOutput",
    "Values",
    "VariableSpec",
    "create_model",
    "model_class",
    "model_names",
    "register_model",
    "unique_ids",
]
