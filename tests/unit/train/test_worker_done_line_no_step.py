"""A worker that took no step (its data shard empty) ends with a line that says it read no global step, never
'last global step None' (psflow.train.worker). The ps task is in this process, behind an in-process channel."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from psflow.cluster import ClusterSpec
from psflow.ps.client import ParameterClient
from psflow.ps.service import ParameterService
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.build import build_model
from psflow.train.config import TrainConfig
from psflow.train.worker import run_worker

pytestmark = pytest.mark.timeout(60)


def test_a_worker_that_took_no_step_says_so_never_none(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    empty = tmp_path / "train.libsvm"
    empty.write_text("")
    config = TrainConfig.flat(train=(str(empty),), format="libsvm", num_features=16, num_ps=1, num_workers=1,
                              batch_size=10, epochs=1, log_every=1000)
    cluster = ClusterSpec({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]})
    service = ParameterService(0, holds_global_step=True)
    _, variables = build_model(config, cluster)
    client = ParameterClient(cluster, variables.placements(), client_name="/job:worker/task:0",
                             sync=config.sync_config(), channels={0: InProcessChannel("/job:ps/task:0", service.handlers())})
    with caplog.at_level(logging.INFO):
        result = run_worker(config, cluster, 0, client=client)
    assert (result.local_steps, result.last_step) == (0, None)
    done = [r.getMessage() for r in caplog.records if "done after" in r.getMessage()]
    assert done == ["worker 0: done after 0 local steps (0 examples), no global step read: end of data"]
