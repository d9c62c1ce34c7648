"""Two ps tasks as services in this process, behind in-process channels, with one chief client: the shared set-up
of the state-loss and restore unit tests (tests/unit/train/test_state_loss.py, test_restore_vs_fenced_save.py).
No sockets: a "restart" of a ps task is a fresh service behind the same channel. :class:`SumModel` and
:class:`OneExample`: a model whose one metric is the sum of both variables, for the evaluation tests.
:func:`chief_duties`: the chief's session hooks over them (the lock-at-exit tests' child processes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from psflow.cluster import ClusterSpec
from psflow.gradients import DenseGradient
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.service import ParameterService
from psflow.rpc.inprocess import InProcessChannel

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})
SGD = OptimizerSpec("sgd", {"learning_rate": 0.5})


def two_ps_cluster(*, training_workers: Sequence[str] | None = None) -> tuple[ParameterClient, list[ParameterService]]:
    """``weights`` (8 x 2, random normal, seed 3) on ps task 0 (which holds global_step), ``bias`` (2) on ps task 1;
    the client is worker 0's, not yet joined. ``training_workers``: ps task 0 serves ``Done`` and ``FinalEval``
    for them (:class:`~psflow.ps.run_end.RunLedger`)."""
    vs = VariableSet(replica_device_setter(cluster=CLUSTER))
    vs.get_variable("weights", (8, 2), initializer={"name": "random_normal", "seed": 3})  # ps task 0
    vs.get_variable("bias", (2,))                                                          # ps task 1
    services = [_service(i, training_workers) for i in (0, 1)]
    channels = {i: InProcessChannel(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)}
    client = ParameterClient(CLUSTER, vs.placements(), client_name="/job:worker/task:0", channels=channels)
    return client, services


def restart_ps(client: ParameterClient, services: list[ParameterService], index: int, *,
               training_workers: Sequence[str] | None = None) -> ParameterService:
    """ps task ``index`` died and came back empty, at the same address; returns its fresh service."""
    fresh = _service(index, training_workers)
    services[index] = fresh
    client.channels[index] = InProcessChannel(f"/job:ps/task:{index}", fresh.handlers())
    return fresh


def _service(index: int, training_workers: Sequence[str] | None) -> ParameterService:
    return ParameterService(index, holds_global_step=index == 0,
                            training_workers=training_workers if index == 0 else None)


def chief_duties(checkpoint_dir: str) -> tuple[ParameterClient, Any]:
    """:func:`two_ps_cluster` initialized by a chief, then :func:`psflow.train.duties.make_session`'s session for
    worker 0 with checkpoints in ``checkpoint_dir`` (saved every 1,000 steps: only the initial and final ones), its
    hooks' ``after_create_session`` run (the initial checkpoint written, the run's lock taken). Returns the client
    and the session (its ``__exit__`` ends the hooks: the final save, the lock's release)."""
    from types import SimpleNamespace

    from psflow.train.config import TrainConfig
    from psflow.train.duties import make_session
    from psflow.train.session import MonitoredTrainingSession

    client, _ = two_ps_cluster()
    with MonitoredTrainingSession(client, SGD, is_chief=True):
        pass
    config = TrainConfig.flat(train=("unused",), num_features=8, checkpoint_dir=checkpoint_dir,
                              save_checkpoints_steps=1000)
    cluster = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3"]})
    made = make_session(config, cluster, client, SimpleNamespace(initial_values=None), "worker", 0)
    for hook in made.hooks:
        hook.after_create_session(made)
    return client, made


def train_a_step(client: ParameterClient) -> None:
    """One push of gradients of ones to both variables, at the generation a worker reads once it joined."""
    generation = client.ps_stats().generation
    client.push({"weights": DenseGradient(np.ones((8, 2), np.float32)), "bias": DenseGradient(np.ones(2, np.float32))},
                generation=generation)


class SumModel:
    """Reads ``weights`` and ``bias`` whole; its metric ``auc`` is their sum (what a read of a known model gives is
    known); ``on_predict`` runs inside each read's use (a test's interleaving point)."""

    def __init__(self) -> None:
        self.on_predict: list[Any] = []

    def prepare(self, batch: Any) -> Any:
        return batch

    def lookups(self, batch: Any) -> dict[str, np.ndarray | None]:
        return {"weights": None, "bias": None}

    def predict(self, batch: Any, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.on_predict:
            self.on_predict.pop(0)()
        return {"score": np.array([float(values["weights"].sum() + values["bias"].sum())])}

    def metrics(self, labels: np.ndarray, outputs: Mapping[str, np.ndarray]) -> dict[str, float]:
        return {"auc": float(outputs["score"][0]), "examples": 1.0}


class OneExample:
    """An evaluation batch of one example."""

    num_examples = 1
    labels = np.zeros(1, np.float32)

    def slice(self, start: int, stop: int) -> OneExample:
        return self
