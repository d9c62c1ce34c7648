"""A chief candidate process for the fail-over tests.

``python candidate.py BACKEND ADDRESS TTL NAME PS_ADDRESS`` (token in PSFLOW_TOKEN):
campaigns, prints ``leader NAME epoch E``, then every 0.1 s asks the ps task
to accept a fenced write with its epoch, printing ``write ok E sent T`` or
``fenced: ...`` (then exits 3). ``T`` is ``time.monotonic()`` taken just
before the write was sent (CLOCK_MONOTONIC: one clock for every process of
the machine), so a test that pauses this process can tell a write sent after
it resumed from one sent before the pause whose reply is printed after it.
The fenced check deliberately does not ask the backend first: it shows that
the ps itself refuses a deposed leader.
"""

from __future__ import annotations

import os
import sys
import time

from psflow.coord import CoordinationConfig, FencedError, create_backend
from psflow.ps.fencing import FencedWriter
from psflow.rpc.api import PARAMETER_SERVICE, ConnectConfig
from psflow.rpc.grpc_client import TaskChannel


def main() -> int:
    backend_name, address, ttl, name, ps_address = sys.argv[1:6]
    token = os.environ.get("PSFLOW_TOKEN")
    backend = create_backend(CoordinationConfig(backend_name, address, lease_ttl=float(ttl), token=token))
    print(f"campaigning {name}", flush=True)
    lease = backend.campaign(name, timeout=60)
    print(f"leader {name} epoch {lease.epoch}", flush=True)
    channel = TaskChannel("/job:ps/task:0", ps_address, PARAMETER_SERVICE,
                          ConnectConfig(rpc_timeout=5, connect_timeout=30, token=token))
    channel.wait_ready()  # with ZooKeeper the lease can come before the ps task is listening
    writer = FencedWriter({0: channel}, lease)
    while True:
        sent = time.monotonic()
        try:
            writer.check()
        except FencedError as e:
            print(f"fenced: {e}", flush=True)
            return 3
        print(f"write ok {lease.epoch} sent {sent!r}", flush=True)
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
