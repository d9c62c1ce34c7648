"""In-graph replication: the Session face and the worker's step allowlist."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support import A9A

from psflow.data import read_all
from psflow.rpc.api import ConnectConfig, InvalidArgumentError
from psflow.train.config import TrainConfig
from psflow.train.in_graph import BUILTIN_STEPS, Session
from psflow.train.worker import connect_client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_session_runs_named_steps_and_refuses_others(local_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    handle = local_cluster(1, 1)
    config = TrainConfig(train=(str(A9A),), num_features=124, num_ps=1, num_workers=1, replication="in-graph")
    path = tmp_path / "config.json"
    path.write_text(config.to_json())
    handle.start("worker", 0, "--config", str(path))
    from psflow.train.build import build_model

    _, variables = build_model(config, handle.cluster)
    client = connect_client(config, handle.cluster, variables, "test client", handle.token)  # registers (chief)
    session = Session(f"grpc://{handle.cluster.task_address('worker', 0)}", task="/job:worker/task:0",
                      config=ConnectConfig(token=handle.token, connect_timeout=30))
    session.connect()
    batch = read_all([str(A9A)], "libsvm").slice(0, 32)
    frame, grads = session.run(BUILTIN_STEPS[0], batch, push=False)
    assert set(grads) == {"weights", "bias"} and np.asarray(frame.arrays["o/predictions"]).shape == (32,)
    assert client.global_step() == 0  # returned, not pushed
    frame, _ = session.run(BUILTIN_STEPS[0], batch, push=True)
    assert frame.meta["step"] == 1 and client.global_step() == 1
    for bad in ("os:system", "psflow.train.in_graph:average_gradients"):
        with pytest.raises(InvalidArgumentError, match="is not allowed on this worker"):
            session.run(bad, batch, push=True)
    assert client.global_step() == 1
    session.close()
    client.close()
