"""The run record a ``psflow server`` chief's status page exports (``/api/status``'s ``run``)."""

from __future__ import annotations

import json
import urllib.request

from psflow.cluster import ClusterSpec
from psflow.launch.ports import free_ports
from psflow.launch.run_status import chief_status_page
from psflow.status.server import StatusConfig
from psflow.train.config import TrainConfig


def test_a_psflow_server_chiefs_page_counts_every_training_task_as_a_worker() -> None:
    """A chief job trains too: 1 chief + 2 workers is 3 training workers, as the config the tasks train with says
    (``run.num_workers`` said 2: the worker job alone). Nothing listens at the tasks' addresses: the page serves."""
    ports = free_ports(4)
    cluster = ClusterSpec({"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[2]}"],
                           "ps": [f"127.0.0.1:{ports[3]}"]})
    config = TrainConfig.flat(train=("unused",), num_features=4, num_ps=1, num_workers=3)  # as psflow server makes it
    page = chief_status_page(cluster, "chief", 0, config, token="t", status=StatusConfig(interval=60.0))
    assert page is not None
    try:
        with urllib.request.urlopen(page.server.url + "api/status", timeout=30) as reply:
            run = json.loads(reply.read())["run"]
    finally:
        page.close()
    assert (run["num_workers"], run["num_ps"], run["served_by"]) == (3, 1, "/job:chief/task:0"), run
