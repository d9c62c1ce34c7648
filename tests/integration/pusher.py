"""A tiny worker process for step-accounting tests.

``python tests/integration/pusher.py CLUSTER_JSON WORKER_INDEX PUSHES`` registers
a small partitioned model, pushes PUSHES sparse gradients and prints the
global_step values its pushes returned, as one JSON list.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from psflow.cluster import ClusterSpec
from psflow.gradients import DenseGradient, SparseGradient
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, fixed_size_partitioner, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.rpc.api import ConnectConfig


def small_model(cluster: ClusterSpec) -> VariableSet:
    variables = VariableSet(replica_device_setter(cluster=cluster))
    variables.get_variable("emb", (100, 4), partitioner=fixed_size_partitioner(3))
    variables.get_variable("bias", (1,))
    return variables


def main() -> None:
    cluster = ClusterSpec.from_json(open(sys.argv[1]).read())
    index, pushes = int(sys.argv[2]), int(sys.argv[3])
    client = ParameterClient(cluster, small_model(cluster).placements(), client_name=f"/job:worker/task:{index}",
                             config=ConnectConfig(connect_timeout=30, token=os.environ.get("PSFLOW_TOKEN")))
    client.connect()
    client.register(OptimizerSpec("sgd", {"learning_rate": 0.01}), chief=index == 0)  # worker 0 initializes
    rng = np.random.default_rng(index)
    steps = []
    for _ in range(pushes):
        rows = np.unique(rng.integers(0, 100, size=10))
        steps.append(client.push({"emb": SparseGradient(rows, np.ones((rows.size, 4), np.float32)),
                                  "bias": DenseGradient(np.ones(1, np.float32))}, examples=1))
    print(json.dumps(steps))


if __name__ == "__main__":
    main()
