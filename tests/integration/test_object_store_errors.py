"""A store that refuses psflow's calls, against real local stores (the ``object_store`` fixture: moto's S3 server
and gcp-storage-emulator; tests/object_store_servers.py): a bucket that does not exist, no credentials, an
endpoint nobody answers, a store killed during a save or while a reader streams an object. Each reaches the
user as one line naming the URL and what to set, never a traceback; and each is an ``OSError``
(psflow.storage.StorageError too), so a checkpoint save that meets it is a failed save, counted, as one on a
full disk, and a reader's is its DataError naming the byte reached.

Before, ``psflow train --checkpoint-dir s3://no-such-bucket/ckpt`` ended with ``error: The specified bucket does
not exist`` (gs://: ``error: http://127.0.0.1:PORT/upload/storage/v1/b/no-such-bucket/o``), without credentials
with botocore's traceback, and an S3 endpoint that stopped answering raised botocore's
``EndpointConnectionError``, no ``OSError``: the tasks and the launcher ended on its traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from object_store_servers import refuses_connections, run_s3
from support import A9A, in_fresh_process, run_cli, wait_until

from psflow import storage
from psflow.checkpoint.ledger import checkpoint_status
from psflow.checkpoint.lock import CheckpointDirLock
from psflow.checkpoint.save import CheckpointManager
from psflow.cluster import ClusterSpec
from psflow.data.api import DataError
from psflow.data.source import iter_blocks
from psflow.errors import CheckpointError
from psflow.launch.ports import free_ports
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, fixed_size_partitioner, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.service import ParameterService
from psflow.rpc.inprocess import InProcessChannel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def train(out: Path, ckpt: str) -> subprocess.CompletedProcess[str]:
    return run_cli("train", "--train", str(A9A), "--num-features", "124", "--ps", "1", "--workers", "1",
                   "--max-steps", "5", "--quiet", "--output", str(out), "--checkpoint-dir", ckpt, timeout=240)


def error_line(r: subprocess.CompletedProcess[str]) -> str:
    """The one line ``psflow train`` ended with (stderr holds nothing else: no traceback)."""
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("psflow train: error: "), r.stderr[-3000:]
    return lines[0]


def test_a_bucket_that_does_not_exist(object_store: str, tmp_path: Path) -> None:
    scheme = object_store.split("://")[0]
    bucket = f"psflow-missing-{uuid.uuid4().hex[:8]}"
    line = error_line(train(tmp_path / "run", f"{scheme}://{bucket}/ckpt"))
    assert f"{scheme}://{bucket}/ckpt/" in line and f"bucket '{bucket}' does not exist" in line, line
    with pytest.raises(storage.StorageError, match=f"^{scheme}://{bucket}/x: the bucket '{bucket}' does not exist") as e:
        storage.write_atomically(f"{scheme}://{bucket}/x", b"1")
    assert isinstance(e.value, FileNotFoundError)  # a save meeting it fails as on a missing disk
    with pytest.raises(FileNotFoundError):
        storage.create_exclusive(f"{scheme}://{bucket}/x", b"1")


def test_s3_without_credentials(object_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not object_store.startswith("s3://"):
        pytest.skip("the GCS emulator takes anonymous calls: gcsfs asks for no credentials there")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")  # and the fixture points AWS's files at nothing
    line = error_line(train(tmp_path / "run", f"{object_store}/ckpt"))
    assert f"{object_store}/ckpt" in line and "no credentials" in line, line
    assert "AWS_ACCESS_KEY_ID" in line and "AWS_PROFILE" in line, line


#: argv[1]: a URL. One write, its error printed: the line, then the classes it is. On gs:// gcsfs's backoff between
#: its six tries (1 + 2 + 4 + 8 + 16 s and up, which the client has no setting for) is taken out: the same six
#: calls, the same error once they are spent, ~35 s sooner.
CALLS = """
import sys
if sys.argv[1].startswith(("gs://", "gcs://")):
    import asyncio, types
    import gcsfs.retry
    gcsfs.retry.asyncio = types.SimpleNamespace(sleep=lambda seconds: asyncio.sleep(0))  # its only use of asyncio
from psflow import storage
try:
    storage.write_atomically(sys.argv[1], b"1")
except OSError as e:
    assert isinstance(e, storage.StorageError), repr(e)
    print(e)
    print(" ".join(c.__name__ for c in type(e).__mro__))
except Exception as e:
    print(f"no OSError: {type(e).__name__}: {e}")
"""


def test_an_endpoint_nobody_answers(object_store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """gs:// too: it was skipped as 'gcsfs already raises an OSError', but that was aiohttp's ClientConnectorError,
    'Cannot connect to host 127.0.0.1:PORT ...', no StorageError and without the URL (db66ad2 maps it)."""
    nobody = f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", nobody)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", nobody)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore tries once (five times: ~20 s); gcsfs six (CALLS)
    r = subprocess.run([sys.executable, "-c", CALLS, f"{object_store}/x"], capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0 and (not r.stderr or object_store.startswith("gs://")), r.stderr[-3000:]  # gcsfs logs
    assert r.stdout.startswith(f"{object_store}/x: the store did not answer"), r.stdout


def _in_process_cluster() -> ParameterClient:
    """Two in-process ps services holding ``w`` (2 partitions) and ``b``, initialized, and a chief's client."""
    cluster = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})
    vs = VariableSet(replica_device_setter(cluster=cluster))
    vs.get_variable("w", (10, 2), partitioner=fixed_size_partitioner(2))
    vs.get_variable("b", (1,))
    services = [ParameterService(i, holds_global_step=i == 0) for i in (0, 1)]
    channels = {i: InProcessChannel(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)}
    client = ParameterClient(cluster, vs.placements(), client_name="chief", channels=channels)
    client.register(OptimizerSpec("adagrad", {"learning_rate": 0.5}), chief=True)
    return client


def save_while_the_store_goes_away(env: dict[str, str], store_pid: int, port: int) -> tuple[str, int, list[object]]:
    """In a fresh process (fsspec keeps one client per settings): a save on the store, then one whose store is
    killed once the shards are in, then one more (its run lock cannot be confirmed); returns the first failed
    save's error, the manager's failures in a row and the global_step of each failure in the ledger."""
    os.environ.update(env)
    import fsspec

    fsspec.filesystem("s3").mkdir("psflow-going")
    client = _in_process_cluster()
    lock = CheckpointDirLock("s3://psflow-going/ckpt", "run-a")
    CheckpointManager("s3://psflow-going/ckpt", run_id="run-a", lock=lock).save(client)

    def store_gone(phase: str) -> None:
        if phase == "shards_written":
            os.kill(store_pid, signal.SIGKILL)
            wait_until(lambda: refuses_connections(port), "the killed store refuses connections")

    manager = CheckpointManager("s3://psflow-going/ckpt", run_id="run-a", fault=store_gone, lock=lock)
    with pytest.raises(CheckpointError) as e:
        manager.save(client)
    with pytest.raises(CheckpointError, match="directory.mutex: the store did not answer"):  # the lock's
        manager.save(client)
    return str(e.value), manager.failed_in_a_row, [f["global_step"] for f in checkpoint_status(client)["failures"]]


def test_a_save_whose_store_stops_answering_is_a_failed_save(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The chief's save counts the failure and the chief duties go on (the next period saves again): the save's
    cleanup asked the dead store whether its partial checkpoint was there, outside its guard, and that error
    ended the chief's session (``session ended by StoreUnreachableError``), the run with it. A save that fails
    at its first call on the store, the run lock's, names its step too (``checkpoint at global_step None FAILED``)."""
    servers = run_s3(tmp_path_factory)  # a store of this test's own, to kill
    server = next(servers)
    try:
        error, in_a_row, steps = in_fresh_process(save_while_the_store_goes_away, {**server.env, "AWS_MAX_ATTEMPTS": "1"},
                                                   server.pid, server.port, limit=200)
    finally:
        servers.close()  # reaps the server
    assert "s3://psflow-going/ckpt/ckpt-" in error and "the store did not answer" in error, error
    assert in_a_row == 2
    assert steps == [0, 0], steps  # each failure names its step (not None, as one failing at the run lock did)


def read_while_the_store_goes_away(env: dict[str, str], store_pid: int, port: int) -> str:
    """In a fresh process: streams an object of four read blocks and kills the store after the first block;
    returns the error the reader raised."""
    os.environ.update(env)
    import fsspec

    fsspec.filesystem("s3").mkdir("psflow-reading")
    url = "s3://psflow-reading/train-0"
    storage.write_atomically(url, b"1 1:1\n" * (4 * storage.READ_BLOCK // 6 + 1))
    blocks = iter_blocks(url, "none", block_size=storage.READ_BLOCK)
    assert len(next(blocks)) == storage.READ_BLOCK
    os.kill(store_pid, signal.SIGKILL)
    wait_until(lambda: refuses_connections(port), "the killed store refuses connections")
    with pytest.raises(DataError) as e:
        for _ in range(4):  # the stream fetched a block ahead: a later read asks the store
            next(blocks)
    return str(e.value)


def test_a_stream_whose_store_stops_answering_fails_in_one_line(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A worker reading its --train objects when the store goes away ends with the readers' one line naming the
    object and the byte reached: the stream's own reads (after the first block) let botocore's
    EndpointConnectionError through, no OSError, and the worker ended on its traceback."""
    servers = run_s3(tmp_path_factory)  # a store of this test's own, to kill
    server = next(servers)
    try:
        error = in_fresh_process(read_while_the_store_goes_away, {**server.env, "AWS_MAX_ATTEMPTS": "1"},
                                 server.pid, server.port, limit=200)
    finally:
        servers.close()  # reaps the server
    assert error.startswith("s3://psflow-reading/train-0: read failed at byte "), error
    assert "the store did not answer" in error, error


#: A store that fails every call with one HTTP status (argv: port, status, s3|gs), as S3 and GCS answer a
#: throttled (503 SlowDown), failing (503), expired-token (401) or refused (403) call; the emulators never do.
FAILING_STORE = """
import http.server, sys
port, status, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
S3 = {503: ("SlowDown", "Please reduce your request rate."), 403: ("AccessDenied", "Access Denied")}
GS = {503: "Service Unavailable", 401: "Invalid Credentials", 403: "does not have storage.objects.create access"}
class Failing(http.server.BaseHTTPRequestHandler):
    def answer(self):
        if "100-continue" not in (self.headers.get("Expect") or ""):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.close_connection = True
        if kind == "s3":
            body = "<Error><Code>%s</Code><Message>%s</Message></Error>" % S3[status]
        else:
            body = '{"error": {"code": %d, "message": "%s"}}' % (status, GS[status])
        self.send_response(status)
        self.send_header("Content-Type", "application/xml" if kind == "s3" else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body.encode())
    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = answer
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Failing).serve_forever()
"""


@pytest.mark.parametrize(("kind", "status", "says", "error"), [
    ("s3", 503, "the store is unavailable", "ConnectionError"), ("gs", 503, "the store is unavailable",
                                                                "ConnectionError"),
    ("gs", 401, "the store refused the credentials", "PermissionError"), ("gs", 403, "access denied", "PermissionError")])
def test_a_store_that_answers_an_http_error_fails_in_one_line(kind: str, status: int, says: str,
                                                              error: str) -> None:
    """Throttling, a store failing, credentials expired mid-run and a write the credentials may not make reach
    the user as one line naming the URL, an OSError of its kind (a save meeting one is a failed save; a
    ConnectionError for what passes, as an evaluator takes it). Before: gcsfs's HttpError (503, 401), no OSError,
    ended the chief; S3's SlowDown was '[Errno 16] Please reduce your request rate.', without the URL; GCS's 403
    two lines naming the store's upload endpoint."""
    pytest.importorskip("s3fs" if kind == "s3" else "gcsfs")
    port = free_ports(1)[0]
    server = subprocess.Popen([sys.executable, "-c", FAILING_STORE, str(port), str(status), kind],
                              stdin=subprocess.DEVNULL)
    try:
        wait_until(lambda: not refuses_connections(port), "the failing store listens")
        endpoint = f"http://127.0.0.1:{port}"
        env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="psflow-test",
                   AWS_SECRET_ACCESS_KEY="psflow-test", AWS_DEFAULT_REGION="us-east-1", AWS_MAX_ATTEMPTS="1",
                   AWS_EC2_METADATA_DISABLED="true", STORAGE_EMULATOR_HOST=endpoint, NO_GCE_CHECK="true",
                   GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false", GOOGLE_CLOUD_PROJECT="psflow-test")
        r = subprocess.run([sys.executable, "-c", CALLS, f"{kind}://psflow-failing/ckpt/x"], capture_output=True,
                           text=True, timeout=240, env=env)  # gcsfs tries a 503 or 401 six times (CALLS)
    finally:
        os.kill(server.pid, signal.SIGKILL)
        server.wait(timeout=10)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"{kind}://psflow-failing/ckpt/x: {says}"), r.stdout
    assert f" {error} " in lines[1], lines
