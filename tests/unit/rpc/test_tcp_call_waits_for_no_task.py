"""A call on a tcp channel that has not connected yet waits for no task to come up (as a gRPC call without
``wait_for_ready``): a task not there fails it at once with the host's refusal, however long its deadline.

It waited the call's whole deadline (its gRPC discovery channel's ``wait_ready``): a chief's save client opened
after a replicated shard's primary died sat a whole ``--rpc-timeout`` (60 s) on the dead primary before it could
follow the promoted backup (tests/integration/test_ps_replication_fresh_client.py). Only ``wait_ready`` waits.
"""

from __future__ import annotations

import socket

import pytest

from psflow.rpc.api import PARAMETER_SERVICE, ConnectConfig, TaskUnavailableError
from psflow.rpc.tcp import open_channel

pytestmark = pytest.mark.timeout(60)


def test_a_first_call_to_a_task_not_there_fails_at_once_with_its_refusal_whatever_its_deadline() -> None:
    refusing = socket.socket()  # bound, not listening: nothing serves gRPC there, every connection is refused
    refusing.bind(("127.0.0.1", 0))
    config = ConnectConfig(connect_timeout=600, rpc_timeout=600, backoff_initial=0.01, backoff_max=0.05)
    channel = open_channel("/job:ps/task:0", f"127.0.0.1:{refusing.getsockname()[1]}", PARAMETER_SERVICE, config)
    try:
        # (the test's 60 s timeout fails the old carrier, which waited the call's 600 s for the task)
        with pytest.raises(TaskUnavailableError, match=r"(?i)/job:ps/task:0: .*connection refused"):
            channel.call("Stats", {}, timeout=600)
        with pytest.raises(TaskUnavailableError, match=r"(?i)connection refused"):  # and again: still no wait
            channel.call("Stats", {})
    finally:
        channel.close()
        refusing.close()


def test_wait_ready_still_waits_for_the_task_until_its_timeout() -> None:
    refusing = socket.socket()
    refusing.bind(("127.0.0.1", 0))
    config = ConnectConfig(connect_timeout=600, rpc_timeout=600, backoff_initial=0.01, backoff_max=0.05)
    channel = open_channel("/job:ps/task:2", f"127.0.0.1:{refusing.getsockname()[1]}", PARAMETER_SERVICE, config)
    try:
        with pytest.raises(TaskUnavailableError, match=r"timed out after 0\.5 s waiting for /job:ps/task:2"):
            channel.wait_ready(timeout=0.5)
    finally:
        channel.close()
        refusing.close()
