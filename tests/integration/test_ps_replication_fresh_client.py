"""A client opened after a replicated shard's primary died follows the promoted backup at once (issue 28: the pause
from a primary kill to the next applied push under 1 s), over the tcp carrier ``psflow train`` uses by default.

A reviewer's run (--ps-replicas 1 --chaos kill:ps:0@step=150) had the chief stuck a whole --connect-timeout (60 s,
"still waiting for /job:ps/task:0 (attempt 10/20/30)") after ps:0 was SIGKILLed, its coordination calls already at
the promoted backup: a save's client (:func:`psflow.checkpoint.bounded_save.save_client`, a router of its own
starting where the data client routes each shard: still ps:0, no data call had failed yet) opened its tcp channel to
the dead primary, and that channel's first call waited for the task to come up (its gRPC discovery channel's
``wait_ready``) for the call's whole deadline before the router could see the shard's view naming another primary.

Real server processes (tests/integration/test_ps_replication.py's shard), a real :class:`ParameterClient`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import TOKEN
from test_ps_replication import BACKUP, PRIMARY, WORKER, _layout, _Shard

from psflow.checkpoint.bounded_save import save_client
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import PromoteRequest, RegisterRequest, ReplicaStatusReply
from psflow.rpc.api import ConnectConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[_Shard]:
    """ps:0 and ps_backup:0 (not started yet), their processes killed by pid at the end."""
    handle = _Shard(tmp_path)
    try:
        yield handle
    finally:
        handle.kill_all()


def test_a_save_client_opened_after_the_primary_died_goes_to_the_promoted_backup_without_waiting_for_the_dead_one(
        replicated: _Shard, caplog: pytest.LogCaptureFixture) -> None:
    shard = replicated
    shard.start(PRIMARY)
    shard.start(BACKUP)
    shard.wait_view(PRIMARY, BACKUP)
    register = _layout(shard.cluster)
    frame = register.to_frame()
    shard.channels[PRIMARY].call(RegisterRequest.METHOD, frame.meta, timeout=30)
    # rpc_timeout = connect_timeout: the chief's defaults are both 60 s; 30 s keeps a failing run short.
    config = ConnectConfig(token=TOKEN, rpc_timeout=30.0, connect_timeout=30.0, transport="tcp")
    # failover_timeout longer than the test: only the shard's view (the backup promoted) may move the route.
    chief = ParameterClient(shard.cluster, list(register.layout), client_name=WORKER, config=config,
                            failover_timeout=600.0)
    try:
        chief.connect()
        assert chief.stats(0)["global_step"] == 0  # the data client reached ps:0 over tcp
        assert chief.router is not None and chief.router.routes[0][0] == PRIMARY

        shard.procs[PRIMARY].kill()  # SIGKILL, by pid
        shard.procs[PRIMARY].wait(timeout=30)
        # Another worker's failover promoted the backup; the chief made no data call since: it routes to ps:0.
        promote = PromoteRequest(0, 1, "/job:worker/task:1").to_frame()
        promoted = ReplicaStatusReply.from_frame(
            shard.channels[BACKUP].call(PromoteRequest.METHOD, promote.meta, timeout=30))
        assert (promoted.role, promoted.epoch) == ("primary", 2)
        assert chief.router.routes[0][0] == PRIMARY

        caplog.set_level(logging.INFO, logger="psflow")
        own = save_client(chief)  # a periodic save's client, as the chief's saver opens it
        try:
            assert own is not chief and own.router is not None and own.router.routes[0][0] == PRIMARY
            assert own.stats(0)["global_step"] == 0  # answered by the promoted backup
            assert own.router.routes[0] == (BACKUP, 2)
        finally:
            own.close()
        waited = [r.getMessage() for r in caplog.records if "still waiting for /job:ps/task:0" in r.getMessage()]
        assert waited == []  # (on the unfixed carrier: attempt 10 of a 30 s wait for the dead primary)
        timed_out = [r.getMessage() for r in caplog.records if "timed out after" in r.getMessage()]
        assert timed_out == []
    finally:
        chief.close()


def test_a_save_client_made_before_anybody_promoted_the_backup_takes_the_dead_primarys_refusal_as_proof(
        replicated: _Shard, caplog: pytest.LogCaptureFixture) -> None:
    # The data client had reached ps:0; ps:0 died and no client promoted its backup yet. The save's router used to
    # start with no record of the members the data client reached: the dead primary's refused connection was no
    # proof to it, so it waited for the data client's promotion or --ps-failover-timeout (10 s; here 20 s, its
    # promotion then logged 'answered nothing for 20.0 s').
    shard = replicated
    shard.start(PRIMARY)
    shard.start(BACKUP)
    shard.wait_view(PRIMARY, BACKUP)
    register = _layout(shard.cluster)
    shard.channels[PRIMARY].call(RegisterRequest.METHOD, register.to_frame().meta, timeout=30)
    config = ConnectConfig(token=TOKEN, rpc_timeout=30.0, connect_timeout=30.0, transport="tcp")
    chief = ParameterClient(shard.cluster, list(register.layout), client_name=WORKER, config=config,
                            failover_timeout=20.0)
    try:
        chief.connect()
        assert chief.stats(0)["global_step"] == 0  # the data client reached ps:0
        shard.procs[PRIMARY].kill()  # SIGKILL, by pid
        shard.procs[PRIMARY].wait(timeout=30)

        caplog.set_level(logging.INFO, logger="psflow")
        own = save_client(chief)
        try:
            assert own is not chief and own.router is not None and own.router.routes[0][0] == PRIMARY
            assert own.stats(0)["global_step"] == 0  # answered by the backup this save's client promoted
            assert own.router.routes[0] == (BACKUP, 2)
        finally:
            own.close()
        promoting = [r.getMessage() for r in caplog.records if "promoting /job:ps_backup/task:0" in r.getMessage()]
        assert len(promoting) == 1 and "/job:ps/task:0: refused the connection" in promoting[0], promoting
        assert chief.router is not None and chief.router.routes[0][0] == PRIMARY  # (the data client made no call)
    finally:
        chief.close()
