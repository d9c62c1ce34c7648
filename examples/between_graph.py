"""Between-graph replication with psflow, shaped like the classic TF1 program.

One process per task; every task runs this same script with its own
``--job_name`` and ``--task_index`` (start order does not matter)::

    H="--ps_hosts=127.0.0.1:2222,127.0.0.1:2223 --worker_hosts=127.0.0.1:2224,127.0.0.1:2225"
    python examples/between_graph.py $H --job_name=ps --task_index=0
    python examples/between_graph.py $H --job_name=ps --task_index=1
    python examples/between_graph.py $H --job_name=worker --task_index=0 --train=data/a9a/a9a --eval=data/a9a/a9a.t
    python examples/between_graph.py $H --job_name=worker --task_index=1 --train=data/a9a/a9a

Unlike TensorFlow's ``server.join()``, a ps task's ``join()`` returns once the
run is over: every worker reports ``Done`` when it has finished
(``stop_when_run_over=True``), and the ps tasks exit 0. ``--shutdown_ps`` (the
chief asks every ps task to stop at once when it is done) is kept for older
scripts; it is no longer needed. All tasks must share the cluster token in
``PSFLOW_TOKEN`` (or all have none).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import psflow
from psflow.data import DatasetConfig, open_dataset, read_all
from psflow.models.metrics import accuracy, auc, binary_metrics


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ps_hosts", required=True)
    p.add_argument("--worker_hosts", required=True)
    p.add_argument("--job_name", required=True, choices=["ps", "worker"])
    p.add_argument("--task_index", type=int, required=True)
    p.add_argument("--train", action="append", default=[])
    p.add_argument("--eval", default=None)
    p.add_argument("--num_features", type=int, default=124)
    p.add_argument("--batch_size", type=int, default=512)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--log_every", type=int, default=50)
    p.add_argument("--shutdown_ps", action="store_true", help="not needed: ps tasks exit once every worker is done")
    flags = p.parse_args()

    # 1. The cluster, and this task's server.
    cluster = psflow.ClusterSpec({"ps": flags.ps_hosts.split(","), "worker": flags.worker_hosts.split(",")})
    token = os.environ.get("PSFLOW_TOKEN")
    server = psflow.Server(cluster, flags.job_name, flags.task_index, token=token, stop_when_run_over=True)
    if flags.job_name == "ps":
        server.join()  # serves until every worker reported Done (or a Shutdown, or Ctrl-C)
        return

    # 2. Variables, placed on the ps tasks by replica_device_setter (round-robin).
    variables = psflow.VariableSet(psflow.replica_device_setter(cluster=cluster))
    variables.get_variable("weights", (flags.num_features, 1), partitioner=psflow.fixed_size_partitioner(2))
    variables.get_variable("bias", (1,))

    # 3. Connect to every ps task and register the variables with an FTRL optimizer.
    client = psflow.ParameterClient(cluster, variables.placements(), client_name=server.task.name,
                                    config=psflow.ConnectConfig(token=token))
    client.connect()
    # Worker 0 is the chief: it initializes the variables; the others wait for it (bounded backoff).
    client.register(psflow.OptimizerSpec("ftrl", {"learning_rate": 0.5, "learning_rate_power": -0.5,
                                                  "initial_accumulator_value": 0.1}),
                    chief=cluster.chief() == server.task)

    # 4. This worker's share of the data, and the training loop.
    num_workers = cluster.num_tasks("worker")
    data = open_dataset(DatasetConfig(paths=tuple(flags.train), format="libsvm", batch_size=flags.batch_size,
                                      num_epochs=flags.epochs, worker_index=flags.task_index,
                                      num_workers=num_workers), start=True)
    started = time.time()
    with data:
        for batch in data:
            features = batch.column()  # LIBSVM: one sparse feature, as CSR rows (indptr, ids, values)
            ids, inverse = np.unique(features.ids, return_inverse=True)
            pulled = client.pull({"weights": ids, "bias": None})
            rows = np.repeat(np.arange(batch.num_examples), np.diff(features.indptr))
            logits = np.bincount(rows, features.values * pulled["weights"][inverse, 0],
                                 minlength=batch.num_examples) + pulled["bias"][0]
            probs = sigmoid(logits)
            loss = float(np.mean(np.maximum(logits, 0) - logits * batch.labels + np.log1p(np.exp(-np.abs(logits)))))
            d = (probs - batch.labels) / batch.num_examples
            grad_w = np.bincount(inverse, features.values * d[rows], minlength=ids.size).astype(np.float32)
            step = client.push({"weights": psflow.SparseGradient(ids, grad_w[:, None]),
                                "bias": psflow.DenseGradient(np.array([d.sum()], np.float32))},
                               examples=batch.num_examples, loss=loss)
            if step % flags.log_every == 0:
                print(f"worker {flags.task_index}: step={step} loss={loss:.4f} "
                      f"accuracy={accuracy(batch.labels, probs):.4f} auc={auc(batch.labels, probs):.4f}", flush=True)
    print(f"worker {flags.task_index}: done in {time.time() - started:.1f} s", flush=True)

    # 5. The chief evaluates the model as it is on the ps tasks.
    if flags.task_index == 0 and flags.eval:
        test = read_all([flags.eval], "libsvm")
        features = test.column()
        model = client.pull({"weights": None, "bias": None})
        rows = np.repeat(np.arange(test.num_examples), np.diff(features.indptr))
        logits = np.bincount(rows, features.values * model["weights"][features.ids, 0], minlength=test.num_examples)
        print("eval:", binary_metrics(test.labels, sigmoid(logits + model["bias"][0])), flush=True)
    if flags.task_index == 0 and flags.shutdown_ps:
        client.shutdown_servers()
    else:
        client.report_done()  # the ps tasks exit once every worker has said so
    client.close()
    server.stop()


if __name__ == "__main__":
    main()
