"""The settings of a training run, parsed once at the edge.

Files:

* ``train_config.py`` -- :class:`TrainConfig`: the run's settings, one group per concern, and the rules
  that span groups; nested JSON (config.json); :meth:`TrainConfig.flat` / :meth:`TrainConfig.with_` take
  settings by their flat (flag) names.
* ``groups.py`` -- the groups, each a frozen dataclass checking its own fields: ``data``
  (:class:`DataSettings`: files, format, schema, batches, epochs, shuffle, bad records), ``model``
  (:class:`ModelSettings`), ``optimizer`` (:class:`OptimizerSettings`: learning rate, schedule, moving
  averages, l1/l2, clipping), ``cluster`` (:class:`ClusterSettings`: tasks, placement, partitions, transport,
  timeouts), ``sync`` (:class:`SyncSettings`: mode, aggregation, staleness, replication), ``checkpoint``
  (:class:`CheckpointSettings`), ``report`` (:class:`ReportSettings`: log lines, summaries, evaluations),
  ``chief`` (:class:`ChiefSettings`: election) and ``compute`` (:class:`ComputeSettings`: devices, towers).

Guarantee: a :class:`TrainConfig` that exists is valid; an invalid setting raises
:class:`~psflow.errors.ConfigError` naming its flag.
"""

from psflow.errors import ConfigError
from psflow.train.config.groups import (
    DEFAULT_LEARNING_RATES,
    MAX_SEED,
    MAX_STEPS_IN_FLIGHT,
    CheckpointSettings,
    ChiefSettings,
    ClusterSettings,
    ComputeSettings,
    DataSettings,
    ModelSettings,
    OptimizerSettings,
    ReportSettings,
    SyncSettings,
)
from psflow.train.config.train_config import (
    FLAT_FIELDS,
    MODE_FLAGS,
    TrainConfig,
    in_graph_timeout_refusal,
    other_mode_refusal,
)

#: Intra-op threads of PyTorch in a task process (psflow.torch.THREADS_ENV, named here so that the
#: launcher and the in-process path set it without importing PyTorch).
TORCH_THREADS_ENV = "PSFLOW_TORCH_THREADS"

__all__ = ["TrainConfig", "FLAT_FIELDS", "DataSettings", "ModelSettings", "OptimizerSettings", "ClusterSettings",
           "SyncSettings", "CheckpointSettings", "ReportSettings", "ChiefSettings", "ComputeSettings",
           "DEFAULT_LEARNING_RATES", "ConfigError", "MAX_SEED", "MAX_STEPS_IN_FLIGHT", "TORCH_THREADS_ENV",
           "in_graph_timeout_refusal", "MODE_FLAGS", "other_mode_refusal"]
