"""A restore's ``LoadShard`` that ps task 0 cannot record in its global_step journal (a full disk, the directory
gone) changes nothing, and says so in one line naming the task, the generation and the file
(psflow/ps/checkpointing.py load_shard).

The load wrote every partition first and set global_step (which records a bound past the checkpoint's step in the
journal) after: a journal it could not write left the task holding the checkpoint's values beside the old
global_step, reader positions and lineage, refused as an internal error (a traceback). Not a model anyone used:
the task stays not ready at the restore's generation (its saves and pushes refused, and only that restore's
``SetReady``, which its restorer sends after every load succeeded, opens it), and the restorer's retry at a new
generation loads every partition again; this test shows both. The load now sets global_step before it writes the
partitions, so the failure leaves the task as it was. In-process services, no sockets; the journal's directory is
replaced by a file after the task started, so its next write fails.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from two_ps_in_process import SGD, two_ps_cluster

from psflow.gradients import DenseGradient
from psflow.ps.global_step import StepJournal
from psflow.ps.protocol import BeginRestoreRequest, LoadShardRequest, SaveShardRequest, SetReadyRequest
from psflow.ps.service import ParameterService
from psflow.rpc.api import FailedPreconditionError, FencedOffError, RemoteError, RpcError
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.generation_restore import register_as_chief

pytestmark = pytest.mark.timeout(60)

TASK = "/job:ps/task:0"
_KEY = "weights/part_0"  # on ps task 0, which holds global_step, the reader positions and the lineage


def _checkpoint(generation: int) -> LoadShardRequest:
    """ps task 0's load of a checkpoint of global_step 40 whose weights are all 4.0."""
    return LoadShardRequest.build(
        {_KEY: np.full((8, 2), 4.0, np.float32)}, {}, {}, [_KEY], global_step=40,
        positions={"/job:worker/task:0": '{"step": 40}'}, examples=400, lineage="lineage-40", restored_step=40,
        restored_from="/ckpt/ckpt-000000040", restored_from_step=40, generation=generation)


def test_a_load_whose_global_step_the_journal_cannot_record_changes_nothing_and_a_new_restore_loads_whole(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    client, services = two_ps_cluster()
    state = tmp_path / "state"
    journal = StepJournal(str(state / "global_step.json"))
    service = services[0] = ParameterService(0, holds_global_step=True, step_journal=journal)
    client.channels[0] = InProcessChannel(TASK, service.handlers())
    register_as_chief(client, SGD, None)
    initial = service.store.get(_KEY).value.copy()
    client.call(0, BeginRestoreRequest(9))
    shutil.rmtree(state, ignore_errors=True)
    state.write_text("not a directory")  # the journal cannot be written from now on
    with caplog.at_level(logging.INFO):
        with pytest.raises(RpcError) as failed:
            client.call(0, _checkpoint(9))
    error = failed.value
    weights = service.store.get(_KEY).value
    assert np.array_equal(weights, initial), "partitions loaded, global_step not: the task holds half a load"
    stats = client.ps_stats(0)
    assert (stats.global_step, stats.ready, stats.generation, stats.restored_from) == (0, False, 9, None)
    assert (service.workers.positions(), service.workers.examples, service.saves.lineage) == ({}, 0, None)
    assert type(error) is FailedPreconditionError and not isinstance(error, (RemoteError, FencedOffError)), error
    text = str(error)
    assert text.startswith(f"{TASK}: LoadShard: cannot write the global_step journal {state / 'global_step.json'}: ")
    assert "LoadShard of generation 9 refused" in text and "nothing loaded" in text and "\n" not in text
    lines = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(lines) == 1 and lines[0].exc_info is None, [r.getMessage() for r in lines]  # one line, no traceback
    # Nothing reads the task meanwhile: not ready, a restore in progress (as before the change).
    with pytest.raises(FailedPreconditionError, match="refused to save a checkpoint shard"):
        client.call(0, SaveShardRequest(None, 0, 2))
    with pytest.raises(FailedPreconditionError, match="not ready"):
        client.push({"weights": DenseGradient(np.ones((8, 2), np.float32))}, generation=9)
    # The disk is back: the restorer's retry, at a new generation, loads the task whole and opens it.
    state.unlink()
    client.call(0, BeginRestoreRequest(10))
    client.call(0, _checkpoint(10))
    client.call(0, SetReadyRequest("the chief", 10, 40))
    stats = client.ps_stats(0)
    assert (stats.global_step, stats.ready, stats.generation, stats.restored_from_step) == (40, True, 10, 40)
    assert np.all(service.store.get(_KEY).value == 4.0)
    assert (service.workers.positions(), service.workers.examples, service.saves.lineage) == (
        {"/job:worker/task:0": '{"step": 40}'}, 400, "lineage-40")
