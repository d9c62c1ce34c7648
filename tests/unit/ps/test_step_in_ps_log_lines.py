"""A ps task's save and restore lines say the step only where it holds global_step: no ``None`` in a user's log.

Before: every ps task but the one holding global_step (ps task 0) logged ``wrote checkpoint shard ... (412
bytes, step None)`` for its shard and ``restore to generation G begins (global_step None)``, and a diverged
shard there was refused as ``refused to save the checkpoint shard of global_step None``. ps services in this process
(tests/two_ps_in_process.py), writing their shards into a temp directory.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from two_ps_in_process import SGD, train_a_step, two_ps_cluster

from psflow.gradients import DenseGradient
from psflow.rpc.api import InvalidRequest
from psflow.rpc.framing import Frame
from psflow.train.chief import join_cluster

pytestmark = pytest.mark.timeout(60)


def test_the_save_line_names_the_step_only_where_the_shard_holds_it(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    client, services = two_ps_cluster()
    join_cluster(client, SGD, chief=True)
    train_a_step(client)
    caplog.set_level(logging.INFO, logger="psflow.ps")
    for i, service in enumerate(services):
        service.handlers()["SaveShard"](Frame({"path": str(tmp_path / f"shard-{i}.safetensors")}))
    lines = [r.getMessage() for r in caplog.records if "wrote checkpoint shard" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "None" not in " ".join(lines), lines
    assert lines[0].startswith("/job:ps/task:0: ") and lines[0].endswith(" bytes, step 1)"), lines
    assert lines[1].startswith("/job:ps/task:1: ") and "step" not in lines[1], lines


def test_a_diverged_shard_without_global_step_is_refused_without_a_step(tmp_path: Path) -> None:
    client, services = two_ps_cluster()
    join_cluster(client, SGD, chief=True)
    client.push({"bias": DenseGradient(np.array([1.0, np.nan], np.float32))},
                generation=client.ps_stats().generation)  # ps task 1 diverged
    with pytest.raises(InvalidRequest) as refused:
        services[1].handlers()["SaveShard"](Frame({"path": str(tmp_path / "shard-1.safetensors")}))
    assert str(refused.value).startswith("/job:ps/task:1: refused to save its checkpoint shard: bias/part_0 holds 1 "
                                         "non-finite value"), refused.value


def test_a_restore_begins_naming_the_step_only_where_the_task_holds_it(caplog: pytest.LogCaptureFixture) -> None:
    client, services = two_ps_cluster()
    join_cluster(client, SGD, chief=True)
    train_a_step(client)
    caplog.set_level(logging.INFO, logger="psflow.ps")
    for service in services:
        service.handlers()["BeginRestore"](Frame({"generation": 1}))
    lines = [r.getMessage() for r in caplog.records if "begins" in r.getMessage()]
    assert lines == ["/job:ps/task:0: restore to generation 1 begins (global_step 1)",
                     "/job:ps/task:1: restore to generation 1 begins"], lines
