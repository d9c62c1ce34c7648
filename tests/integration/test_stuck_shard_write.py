"""A chief whose shard write (``--checkpoint-transport rpc``: the chief writes each ps task's bytes itself) is stuck
in an object store that stopped answering still exits: the write ran in a ThreadPoolExecutor's thread, which the
interpreter joins at exit, so once its save was given up (psflow.checkpoint.bounded_save) and its session ended, the
process never ended (psflow server: nothing stops it). Now each write is a daemon thread's
(psflow.checkpoint.daemon_calls).

A real ps process, a real GCS emulator SIGSTOPped once the save's writer file is written (the fault hook's
``writer_written``: the shard writes come next), and a real chief process whose save runs in a daemon thread, as
the bounded save runs it; the chief's main thread returns once the write is stuck, and the process must end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support import A9A, TOKEN

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

EXIT_LIMIT = 60.0  # a safety net, never reached by a passing run: the process ends at once

CHIEF = textwrap.dedent("""
    import os, signal, sys, threading, time
    from psflow.checkpoint.save import CheckpointManager
    from psflow.cluster.spec import ClusterSpec
    from psflow.ps.client import ParameterClient
    from psflow.rpc.api import ConnectConfig
    from psflow.train.build import build_model
    from psflow.train.chief import join_cluster
    from psflow.train.config import TrainConfig

    spec, ckpt, store_pid, train, token = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
    cluster = ClusterSpec.from_json(spec)
    config = TrainConfig.flat(train=(train,), num_features=124, num_ps=1, num_workers=1)
    _, variables = build_model(config, cluster)
    client = ParameterClient(cluster, variables.placements(), client_name="/job:worker/task:0",
                             config=ConnectConfig(connect_timeout=30, token=token))
    client.connect()
    join_cluster(client, config.optimizer_spec(), chief=True)

    def stop_the_store(phase):
        if phase == "writer_written":
            os.kill(store_pid, signal.SIGSTOP)

    manager = CheckpointManager(ckpt, transport="rpc", fault=stop_the_store)
    threading.Thread(target=manager.save, args=(client,), daemon=True).start()

    def writing_a_shard():
        for frame in list(sys._current_frames().values()):
            names = set()
            while frame is not None:
                names.add(frame.f_code.co_name)
                frame = frame.f_back
            if {"_finish_shard", "write_atomically"} <= names:
                return True
        return False

    deadline = time.monotonic() + 120
    while not writing_a_shard():
        if time.monotonic() > deadline:
            sys.exit("no shard write under way within 120 s")
        time.sleep(0.05)
    print("a shard's write is stuck in the store; exiting", flush=True)
""")


def test_a_chief_exits_while_a_shard_write_is_stuck_in_the_store(
        local_cluster, gcs_server: object, gcs_bucket: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from object_store_servers import StoreServer

    assert isinstance(gcs_server, StoreServer)
    ckpt = f"{gcs_bucket}/ckpt"
    handle = local_cluster(1)
    log = tmp_path / "chief.log"
    with open(log, "w") as err:
        chief = subprocess.Popen([sys.executable, "-c", CHIEF, handle.cluster.to_json(), ckpt, str(gcs_server.pid),
                                  str(A9A), TOKEN], stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert chief.stdout is not None
        said = chief.stdout.readline()  # (its own safety net: 120 s for the write to begin)
        assert "a shard's write is stuck" in said, log.read_text()[-3000:]
        try:
            chief.wait(timeout=EXIT_LIMIT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the chief did not exit within {EXIT_LIMIT:g} s of its main thread's end, a shard write "
                        "stuck in the store (a thread joined at exit)")
    finally:
        if chief.poll() is None:
            chief.kill()
            chief.wait()
        os.kill(gcs_server.pid, signal.SIGCONT)
    assert chief.returncode == 0, log.read_text()[-3000:]
