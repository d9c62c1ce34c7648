"""psflow.torch: train a PyTorch module on psflow (the optional extra ``psflow[torch]``).

Its parameters and embedding tables live on the ps tasks, placed like any
variable (round-robin, greedy by bytes, or pinned; large tables partitioned);
the optimizers run there with TensorFlow's formulas, chosen per parameter
group; autograd runs on the workers. A :class:`TorchModel` is a
:class:`psflow.models.Model`, so every path psflow has trains it.

* ``model.py`` -- :class:`TorchModel` (subclass it: ``build()`` returns the
  module), :class:`ParamGroup`, :class:`Dense` (TensorFlow's layout),
  :func:`configure_threads`.
* ``embedding.py`` -- :class:`Embedding` (one table, one sparse feature,
  TensorFlow's combiners) and :class:`EmbeddingCollection` (several tables in
  one kernel); only the rows of a batch's unique ids are pulled and pushed.
* ``inputs.py`` -- :class:`Inputs`, what ``forward`` receives.
* ``lookup_rows.py`` -- the gather of every lookup group's rows and the scatter-add of their gradients,
  one autograd node per step (C loops in ``_lookup.c``, torch twins).
* ``dense_product.py`` -- :class:`Dense`'s product and its gradients, one autograd node, in oneDNN on the
  CPU where PyTorch has it (about twice MKL's speed on AVX-512 machines), else ``torch.addmm``.
* ``towers.py`` -- towers: replicas of a worker's module on its devices
  (``--device``, ``--towers``, ``--devices``), each on a slice of the batch.
* ``ctr.py`` -- the built-in models ``wide_deep``, ``deepfm`` and ``dnn``.

See ``docs/torch.md``.
"""

from psflow.extras import MissingExtraError, missing_extra_message

try:
    import torch as _torch  # noqa: F401
except ModuleNotFoundError as e:  # pragma: no cover - depends on the install
    if e.name != "torch":
        raise  # PyTorch is installed, one of its own imports failed
    # One line the CLI prints: "psflow.torch needs torch: pip install 'psflow[torch]'" (an ImportError too).
    raise MissingExtraError(missing_extra_message("psflow.torch", "torch", "torch"), module="torch", extra="torch") from e

from psflow.torch.embedding import Embedding, EmbeddingCollection
from psflow.torch.inputs import Inputs
from psflow.torch.model import THREADS_ENV, Dense, ParamGroup, TorchModel, configure_threads

__all__ = ["Dense", "Embedding", "EmbeddingCollection", "Inputs", "ParamGroup", "THREADS_ENV", "TorchModel",
           "configure_threads"]
