"""Shared fixtures. ``local_cluster`` is the one way tests start real tasks.

It picks free ports on 127.0.0.1, starts real task processes
(``python -m psflow.launch.task``), yields handles, and always ends every
process it started, by pid, however the test ends.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from replica_shard import InProcessShard
from support import TOKEN, ClusterHandle, TaskExited

from psflow.cluster import ClusterSpec
from psflow.launch.ports import free_ports

# Hypothesis, for every test: nothing depends on the machine's speed (CI runs on 2 busy cores). Its default
# deadline of 200 ms per example failed test_walk_matches_numpy_on_valid_and_damaged_records under load
# ("Unreliable test timings": 322 ms, then 0.8 ms on the replay), and its too_slow health check fails a slow
# generation the same way. A failure prints the blob that replays it (@reproduce_failure).
settings.register_profile("psflow", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.load_profile("psflow")


# The stop signals at their default action for every process the tests start. A suite started in the background of
# a script or under nohup (`nohup pytest ... &`) inherits SIGHUP and SIGINT ignored, and since e5f8f9d psflow keeps an
# inherited ignore and says so on stderr ("psflow: SIGINT is ignored (inherited): ..."): every psflow command a test
# ran would then print that line too and ignore a Ctrl-C the test sends (test_cli_errors' "the refusal alone" cases
# failed that way). An ignore passes to children through exec; a handler does not. The tests of the ignored case
# ask for it per command (support.with_stop_signals).
for _sig, _action in ((signal.SIGHUP, signal.SIG_DFL), (signal.SIGTERM, signal.SIG_DFL),
                      (signal.SIGINT, signal.default_int_handler)):
    if signal.getsignal(_sig) == signal.SIG_IGN:
        signal.signal(_sig, _action)


@pytest.fixture
def local_cluster(tmp_path: Path) -> Iterator[Callable[..., ClusterHandle]]:
    """Factory: ``local_cluster(num_ps, num_workers, start_ps=True)``.

    Starts the ps task processes and returns once each serves (workers are left
    to the test, which may run them in-process or as processes via
    ``handle.start("worker", i, ...)``). A ps task whose picked port another
    process bound first is started again, with the whole cluster on new ports.
    """
    handles: list[ClusterHandle] = []

    def make(num_ps: int, num_workers: int = 0, *, start_ps: bool = True) -> ClusterHandle:
        for attempt in range(3):
            ports = free_ports(num_ps + num_workers)
            spec: dict[str, list[str]] = {"ps": [f"127.0.0.1:{p}" for p in ports[:num_ps]]}
            if num_workers:
                spec["worker"] = [f"127.0.0.1:{p}" for p in ports[num_ps:]]
            handle = ClusterHandle(ClusterSpec(spec), tmp_path, TOKEN)
            handles.append(handle)
            if not start_ps:
                return handle
            for i in range(num_ps):
                handle.start("ps", i)
            try:  # serving before the test goes on: a ps task that died shows its log, not a worker's timeout
                for i in range(num_ps):
                    handle.wait_serving(i)
                return handle
            except TaskExited as e:
                # A port picked free can be bound by another process before the task binds it: pick again.
                if not e.port_taken or attempt == 2:
                    raise
                handle.stop_all()
                for i in range(num_ps):  # the next try's logs start empty
                    (tmp_path / f"ps-{i}.log").unlink(missing_ok=True)
        raise AssertionError("unreachable")

    try:
        yield make
    finally:
        for h in handles:
            h.stop_all()


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``127.0.0.1:PORT`` of a real standalone ZooKeeper server for the whole session.

    Skips the test when ZooKeeper (Debian package ``zookeeper``), java or kazoo
    is missing; see tests/zookeeper_server.py.
    """
    from zookeeper_server import run_zookeeper

    yield from run_zookeeper(tmp_path_factory)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """moto's standalone S3 server on 127.0.0.1 for the whole session; see tests/object_store_servers.py."""
    from object_store_servers import run_s3

    yield from run_s3(tmp_path_factory)


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """gcp-storage-emulator on 127.0.0.1 for the whole session; see tests/object_store_servers.py."""
    from object_store_servers import run_gcs

    yield from run_gcs(tmp_path_factory)


@pytest.fixture(params=["s3", "gs"])
def object_store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh, empty bucket, ``s3://NAME`` and then ``gs://NAME`` (the test runs once with each), with the
    client settings of its emulator in this process's environment (and so in every process the test starts).
    Skipped when the emulator's or the client's package is missing."""
    return _fresh_bucket(request.getfixturevalue(f"{'s3' if request.param == 's3' else 'gcs'}_server"), monkeypatch)


@pytest.fixture
def gcs_bucket(gcs_server: object, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh, empty ``gs://NAME`` on the session's GCS emulator, its client settings in the environment as
    :func:`object_store` sets them (a test stopping the store asks for ``gcs_server`` too, for its pid)."""
    return _fresh_bucket(gcs_server, monkeypatch)


def _fresh_bucket(server: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new bucket on ``server``, with its client settings in this process's environment (and so in every
    process the test starts), no credentials of the machine's own."""
    from object_store_servers import new_bucket

    for key, value in server.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return new_bucket(server)


@pytest.fixture
def make_shard() -> Iterator[Callable[..., InProcessShard]]:
    """``make_shard(...)``: an in-process replicated shard (tests/replica_shard.py), stopped after the test.
    (Here, not in tests/unit/ps/replication/conftest.py: a second module named ``conftest`` shadowed this one
    for ``from conftest import ...`` in other test files.)"""
    made: list[InProcessShard] = []

    def make(backups: int = 1, replica_timeout: float = 5.0, message_limit: int | None = None,
             chunk_bytes: int | None = None) -> InProcessShard:
        shard = InProcessShard(backups, replica_timeout, message_limit, chunk_bytes)
        made.append(shard)
        return shard
    yield make
    for shard in made:
        shard.stop()
