"""psflow: parameter-server training in Python.

The public API, by concept (each name's module says more):

=================================  ==========================================
``ClusterSpec``, ``TaskId``         :mod:`psflow.cluster` (jobs, tasks, TF_CONFIG)
``Server``                          :mod:`psflow.server` (one task's gRPC endpoint)
``replica_device_setter``,          :mod:`psflow.placement` (where variables live;
``VariableSet``, partitioners,      partitions along axis 0)
strategies
``ParameterClient``                 :mod:`psflow.ps.client` (pull rows, push
                                    gradients; one RPC per ps task)
``DenseGradient``,                  :mod:`psflow.gradients` (what a push carries)
``SparseGradient``
``Model``, ``ModelConfig``,         :mod:`psflow.models` (the model seam: declare
``VariableSpec``, ``ModelOutput``,  variables, say which rows a batch needs,
``create_model``                    compute loss and gradients; the registry)
``Batch``                           :mod:`psflow.data` (labels, named sparse and
                                    dense features)
``OptimizerSpec``                   :mod:`psflow.optim` (applied on the ps)
``ScheduleSpec``                    :mod:`psflow.optim.schedules` (a learning rate
                                    decayed by global_step)
``ConnectConfig``                   :mod:`psflow.rpc.api` (timeouts, token)
``PsflowError``                     :mod:`psflow.errors` (the root of every error
                                    psflow raises on purpose; the hierarchy)
=================================  ==========================================

Guarantees are stated in each package's docstring; the cluster-wide ones
(placement agreement, atomic global_step, TF-exact optimizers, no pickle on
the wire) are in the README.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from psflow.cluster import ClusterSpec, TaskId, parse_tf_config
    from psflow.data import Batch
    from psflow.errors import PsflowError
    from psflow.gradients import DenseGradient, SparseGradient
    from psflow.models import Model, ModelConfig, ModelOutput, VariableSpec, create_model
    from psflow.optim import OptimizerSpec
    from psflow.optim.schedules import ScheduleSpec
    from psflow.placement import (
        GreedyLoadBalancingStrategy,
        RoundRobinStrategy,
        VariableSet,
        byte_size_load_fn,
        fixed_size_partitioner,
        min_max_variable_partitioner,
        replica_device_setter,
        variable_axis_size_partitioner,
    )
    from psflow.ps.client import ParameterClient
    from psflow.rpc.api import ConnectConfig
    from psflow.server import Server

__version__ = "0.1.0"

#: Each public name's module, imported on first use of the name (PEP 562): ``import psflow.<module>``
#: (every task process, the ``psflow`` command) imports that module and what it needs, not the whole API.
#: A ps task never reads data, so it skips ``psflow.data`` (its YAML, CRC32C and protobuf readers: ~50 ms
#: of CPU per process); and ``Server``/``ParameterClient`` import ``grpc``, which reads its settings
#: (GRPC_VERBOSITY) once, when imported, so the ``psflow`` command sets them first (psflow.launch.console).
_LAZY = {
    **dict.fromkeys(("ClusterSpec", "TaskId", "parse_tf_config"), "psflow.cluster"),
    "Batch": "psflow.data",
    "PsflowError": "psflow.errors",
    **dict.fromkeys(("DenseGradient", "SparseGradient"), "psflow.gradients"),
    **dict.fromkeys(("Model", "ModelConfig", "ModelOutput", "VariableSpec", "create_model"), "psflow.models"),
    "OptimizerSpec": "psflow.optim",
    "ScheduleSpec": "psflow.optim.schedules",
    **dict.fromkeys(("GreedyLoadBalancingStrategy", "RoundRobinStrategy", "VariableSet", "byte_size_load_fn",
                     "fixed_size_partitioner", "min_max_variable_partitioner", "replica_device_setter",
                     "variable_axis_size_partitioner"), "psflow.placement"),
    "ParameterClient": "psflow.ps.client",
    "ConnectConfig": "psflow.rpc.api",
    "Server": "psflow.server",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'psflow' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

__all__ = [
    "ClusterSpec",
    "TaskId",
    "parse_tf_config",
    "Server",
    "VariableSet",
    "replica_device_setter",
    "RoundRobinStrategy",
    "GreedyLoadBalancingStrategy",
    "byte_size_load_fn",
    "fixed_size_partitioner",
    "min_max_variable_partitioner",
    "variable_axis_size_partitioner",
    "ParameterClient",
    "DenseGradient",
    "SparseGradient",
    "OptimizerSpec",
    "ScheduleSpec",
    "ConnectConfig",
    "PsflowError",
    "Batch",
    "Model",
    "ModelConfig",
    "ModelOutput",
    "VariableSpec",
    "create_model",
    "__version__",
]
