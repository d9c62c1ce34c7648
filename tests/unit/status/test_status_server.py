"""The status page's server: read-only, loopback by default, the cluster token elsewhere; ``psflow status``.

The collector here watches a cluster whose ports nobody serves (free ports, closed again): every task
shows as never answered, which is all these tests need; the page over a real run is
tests/integration/test_status_page.py.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from psflow.cli.main import main
from psflow.cli.status import StatusError, fetch_status, render_status
from psflow.cluster import ClusterSpec
from psflow.launch.ports import free_ports
from psflow.status.collector import StatusCollector
from psflow.status.server import StatusServer, is_loopback, prometheus_text
from psflow.status.views import sync_view
from psflow.train.config import ConfigError

TOKEN = "status-token-0123"


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[StatusCollector]:
    ports = free_ports(3)
    cluster = ClusterSpec({"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{p}" for p in ports[1:]]})
    c = StatusCollector(cluster, token=TOKEN, run={"mode": "async", "run_dir": str(tmp_path)}, timeout=0.5,
                        run_dir=str(tmp_path))
    c.sample()
    yield c
    c.stop()


def fetch(url: str, *, method: str = "GET", headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_loopback_page_serves_html_json_and_metrics_and_refuses_writes(collector: StatusCollector) -> None:
    with StatusServer(collector) as server:
        assert server.url.startswith("http://127.0.0.1:")
        code, headers, body = fetch(server.url)
        assert code == 200 and headers["Content-Type"].startswith("text/html") and b"status.js" in body
        assert b"//" not in body.split(b"<body>")[1].replace(b"http://www.w3.org", b"")  # nothing from elsewhere
        code, _, body = fetch(server.url + "status.js")
        assert code == 200 and b"api/status" in body
        code, headers, body = fetch(server.url + "api/status")
        snapshot = json.loads(body)
        assert code == 200 and [t["task"] for t in snapshot["tasks"]] == [
            "/job:ps/task:0", "/job:worker/task:0", "/job:worker/task:1"]
        assert {t["state"] for t in snapshot["tasks"]} == {"unknown"}  # never answered
        code, headers, body = fetch(server.url + "metrics")
        assert code == 200 and headers["Content-Type"].startswith("text/plain")
        assert b'psflow_task_up{job="worker",task="1"} 0.0' in body
        for method in ("POST", "PUT", "DELETE"):
            code, headers, _ = fetch(server.url + "api/status", method=method)
            assert code == 405 and headers["Allow"] == "GET, HEAD"
        assert fetch(server.url + "nothing-here")[0] == 404


def test_another_address_requires_the_token(collector: StatusCollector) -> None:
    with pytest.raises(ConfigError, match="requires the cluster token"):
        StatusServer(collector, host="0.0.0.0", token=None)
    with StatusServer(collector, host="0.0.0.0", token=TOKEN) as server:
        local = f"http://127.0.0.1:{server.port}/"
        for path in ("", "api/status", "metrics", "status.js"):
            code, _, body = fetch(local + path)
            assert code == 401 and b"token" in body and b"psflow_" not in body, path
        assert fetch(local + "metrics", headers={"Authorization": "Bearer wrong"})[0] == 401
        code, _, body = fetch(local + "metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert code == 200 and b"psflow_task_up" in body
        # A browser: ?token= once, then the cookie it set.
        code, headers, _ = fetch(local + f"?token={TOKEN}")
        assert code == 200 and "HttpOnly" in headers["Set-Cookie"]
        cookie = headers["Set-Cookie"].split(";")[0]
        assert fetch(local + "api/status", headers={"Cookie": cookie})[0] == 200


def test_loopback_addresses() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.0.0.2")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("example.org")


def test_a_port_in_use_is_named(collector: StatusCollector) -> None:
    with StatusServer(collector) as first, pytest.raises(ConfigError, match=f"--status-port {first.port}"):
        StatusServer(collector, port=first.port)


def test_psflow_status_reads_a_run_directory_and_a_url(collector: StatusCollector, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    collector.stop()  # writes status.json
    assert main(["status", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "/job:worker/task:1" in out and "never" in out
    with StatusServer(collector) as server:
        assert fetch_status(server.url)["tasks"][0]["task"] == "/job:ps/task:0"
        assert main(["status", server.url, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["run"]["mode"] == "async"
    with pytest.raises(StatusError, match="cannot reach the status page"):
        fetch_status(server.url)
    assert main(["status", str(tmp_path / "nope")]) == 1
    assert "no status.json" in capsys.readouterr().err


def test_prometheus_text_parses(collector: StatusCollector) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    names = {f.name for f in text_string_to_metric_families(prometheus_text(collector).decode())}
    assert {"psflow_task_up", "psflow_task_restarts", "psflow_faults"} <= names


def test_render_status_of_a_sync_run_names_who_the_step_waits_for() -> None:
    snapshot: dict[str, Any] = {
        "time": 100.0, "run": {"phase": "training", "mode": "sync"}, "global_step": 7, "examples": 900,
        "tasks": [{"task": "/job:worker/task:0", "host": "127.0.0.1", "pid": 12, "state": "up",
                   "last_heartbeat": 99.5, "restarts": 0, "history": []}],
        "sync": {"contributed": ["/job:worker/task:0"], "waiting_for": ["/job:worker/task:1"],
                 "waiting_seconds": 2.5},
        "ps": [], "faults": [], "restarts": [], "hangs": [], "checkpoints": None,
    }
    text = render_status(snapshot)
    assert "waiting 2.5 s for /job:worker/task:1" in text and "0.5 s ago" in text


def test_render_status_of_a_sync_run_whose_step_timed_out_says_it_failed_not_waiting() -> None:
    """--on-timeout fail: the step timed out on ps task 0, and every push is refused until a restore. psflow status
    said "waiting 3.4 s for /job:worker/task:1" (the seconds growing); it now says the step failed, in the refusal's
    words, and which ps task refused it."""
    reason = "sync step 7 timed out after 3.0 s with 1 of 2 gradients; missing: /job:worker/task:1"
    failed = {"task": "/job:ps/task:0", "sync_contributed": ["/job:worker/task:0"], "sync_waiting_for": [],
              "sync_waiting_seconds": None, "sync_failed": reason}
    waiting = {"task": "/job:ps/task:1", "sync_contributed": [], "sync_waiting_for": [], "sync_waiting_seconds": None,
               "sync_failed": None}
    sync = sync_view({"mode": "sync", "sync_steps_applied": 7, "sync_timeouts": 1}, [failed, waiting])
    assert sync is not None and sync["failed"] == {"/job:ps/task:0": reason} and sync["waiting_for"] == []
    snapshot: dict[str, Any] = {"time": 100.0, "run": {"phase": "failed", "mode": "sync"}, "global_step": 7,
                                "tasks": [], "sync": sync, "ps": [], "faults": []}
    text = render_status(snapshot)
    assert f"sync: step failed on /job:ps/task:0: {reason}; every push is refused until a restore" in text, text
    assert "waiting" not in text, text

    class Snapshot:  # /metrics of that snapshot (the collector's one method the exposition reads)
        def snapshot(self) -> dict[str, Any]:
            return snapshot

    from prometheus_client.parser import text_string_to_metric_families
    gauges = {f.name: f.samples[0].value for f in text_string_to_metric_families(
        prometheus_text(cast(StatusCollector, Snapshot())).decode()) if f.name.startswith("psflow_sync_")}
    assert gauges == {"psflow_sync_waiting_workers": 0, "psflow_sync_failed_ps_tasks": 1}


def test_render_status_of_a_replicated_run_says_what_was_lost_and_who_is_primary() -> None:
    """psflow status of a run that lost every replica of shard 0 (--ps-replicas 1) said nothing of the 211
    acknowledged pushes its checkpoint lacked, nor which task was each shard's primary: status.json had both."""
    snapshot: dict[str, Any] = {
        "time": 100.0, "run": {"phase": "finished", "mode": "async"}, "global_step": 1195, "examples": 97683,
        "tasks": [], "ps": [], "faults": [], "restarts": [], "hangs": [], "checkpoints": None,
        "pushes_acknowledged": 607, "pushes_applied": 396, "updates_lost": 211,
        "shards": [{"shard": 0, "primary": "/job:ps_backup/task:0", "role": "primary", "epoch": 2, "backups": [],
                    "pushes_acknowledged": 302, "pushes_applied": 198, "updates_lost": 104},
                   {"shard": 1, "primary": "/job:ps/task:1", "role": "primary", "epoch": 1,
                    "backups": [{"task": "/job:ps_backup/task:1", "lag_entries": 3, "lag_seconds": 0.25}],
                    "pushes_acknowledged": 305, "pushes_applied": 198, "updates_lost": 107}],
    }
    text = render_status(snapshot)
    assert "replicated shards: pushes acknowledged 607 | applied 396 | updates lost 211" in text, text
    assert "shard 0: primary /job:ps_backup/task:0 (epoch 2), no backup; 104 updates lost" in text, text
    assert ("shard 1: primary /job:ps/task:1 (epoch 1), backups /job:ps_backup/task:1 (3 entries, 0.25 s behind); "
            "107 updates lost") in text, text
    unreplicated = render_status({**snapshot, "pushes_acknowledged": None, "pushes_applied": None,
                                  "updates_lost": None, "shards": None})
    assert "pushes acknowledged" not in unreplicated and "shard 0" not in unreplicated


# ---- the doors (issue 30, item 2) ---------------------------------------------------------------
def raw_request(port: int, request: bytes, host: str = "127.0.0.1") -> bytes:
    """Sends ``request`` as it is (no Host header added) and returns the whole reply."""
    import socket

    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(request)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_on_loopback_a_request_by_another_name_is_refused(collector: StatusCollector) -> None:
    """DNS rebinding: a web page at attacker.example whose name now resolves to 127.0.0.1 reaches the page with
    ``Host: attacker.example:PORT``; it gets 421 and a short line, never the run's numbers."""
    with StatusServer(collector) as server:
        for path in ("", "api/status", "metrics", "status.js"):
            for host in (f"attacker.example:{server.port}", "attacker.example", "localhost.attacker.example",
                         f"10.0.0.5:{server.port}", f"127.0.0.1.nip.io:{server.port}"):
                code, headers, body = fetch(server.url + path, headers={"Host": host})
                assert code == 421, (path, host)
                assert body.startswith(b"psflow status page: ") and len(body) < 300, body
                assert b"psflow_" not in body and b"tasks" not in body and host.encode() not in body
            assert fetch(server.url + path, method="HEAD", headers={"Host": "attacker.example"})[0] == 421
        # The names this machine's loopback is reached by, on any port (a tunnel: ssh -L 9000:127.0.0.1:PORT).
        for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}", f"LOCALHOST:{server.port}",
                     "localhost", "127.0.0.1:9000", f"[::1]:{server.port}", "127.0.0.2:9000"):
            code, _, body = fetch(server.url + "api/status", headers={"Host": host})
            assert code == 200 and json.loads(body)["tasks"], host
        # No Host at all (HTTP/1.0): what no browser sends; refused as well.
        reply = raw_request(server.port, b"GET /api/status HTTP/1.0\r\n\r\n")
        assert reply.startswith(b"HTTP/1.0 421 ") and b"psflow_" not in reply and b'"tasks"' not in reply


def test_off_loopback_the_token_guards_whatever_the_host(collector: StatusCollector) -> None:
    """Bound to every address, the page is reached by names nobody can list (the machine's, a load balancer's):
    it answers any Host, and the token is what a rebinding page does not have."""
    with StatusServer(collector, host="0.0.0.0", token=TOKEN) as server:
        local = f"http://127.0.0.1:{server.port}/"
        assert fetch(local + "api/status", headers={"Host": "attacker.example"})[0] == 401
        code, _, body = fetch(local + "api/status", headers={"Host": "ps-host.cluster.internal:8080",
                                                             "Authorization": f"Bearer {TOKEN}"})
        assert code == 200 and json.loads(body)["tasks"]


@pytest.mark.parametrize("method", ["OPTIONS", "TRACE", "CONNECT", "PROPFIND", "POST", "PATCH"])
def test_every_method_but_get_and_head_is_405_with_allow(collector: StatusCollector, method: str) -> None:
    with StatusServer(collector) as server:
        reply = raw_request(server.port, f"{method} /api/status HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                                         "Connection: close\r\n\r\n".encode())
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 405 ") or head.startswith(b"HTTP/1.1 405 "), head
        assert b"\r\nAllow: GET, HEAD" in head and b"psflow_" not in body and b'"tasks"' not in body


def ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback")
@pytest.mark.parametrize("host", ["::1", "[::1]"])
def test_the_page_serves_on_ipv6_loopback(collector: StatusCollector, host: str) -> None:
    with StatusServer(collector, host=host) as server:
        assert server.url == f"http://[::1]:{server.port}/"
        code, _, body = fetch(server.url + "api/status")
        assert code == 200 and len(json.loads(body)["tasks"]) == 3
        assert fetch(server.url + "api/status", headers={"Host": "attacker.example"})[0] == 421


def test_a_bad_address_or_port_names_its_own_flag(collector: StatusCollector) -> None:
    with pytest.raises(ConfigError, match=r"^--status-host 192\.0\.2\.1: cannot serve the status page on "
                                          r"192\.0\.2\.1:0: .*not an address of this machine"):
        StatusServer(collector, host="192.0.2.1", token=TOKEN)  # TEST-NET-1: on no machine
    with pytest.raises(ConfigError, match=r"^--status-host nosuch\.invalid: cannot serve the status page on "
                                          r"nosuch\.invalid:0: the name does not resolve"):
        StatusServer(collector, host="nosuch.invalid", token=TOKEN)
    with pytest.raises(ConfigError, match=r"^--status-port 70000: want a port in \[0, 65535\]"):
        StatusServer(collector, port=70000)
    with StatusServer(collector) as first, pytest.raises(
            ConfigError, match=rf"^--status-port {first.port}: cannot serve the status page on 127\.0\.0\.1:"
                               rf"{first.port}: port {first.port} is already in use"):
        StatusServer(collector, port=first.port)


@pytest.mark.timeout(30)
def test_close_ends_the_serving_thread_of_an_idle_server_and_frees_the_port(collector: StatusCollector) -> None:
    """The serving loop waits on the socket and close()'s wake-up alone (no poll of a stop flag): closing a
    server that has answered requests, or none, ends its thread and the port refuses connections after."""
    for requests in (0, 2):
        server = StatusServer(collector).start()
        thread = server._thread
        assert thread is not None and thread.is_alive()
        for _ in range(requests):
            assert fetch(server.url + "api/status")[0] == 200
        server.close()
        assert not thread.is_alive()
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(server.url + "api/status", timeout=5)
        server.close()  # idempotent


def test_render_status_of_a_psflow_server_chiefs_page_names_who_serves_it() -> None:
    """Under psflow server the run has no run directory: the headline said 'run : training ...', an empty name."""
    snapshot: dict[str, Any] = {
        "time": 100.0, "run": {"phase": "training", "mode": "async", "served_by": "/job:chief/task:0"},
        "global_step": 7, "examples": 900, "tasks": [], "ps": [], "faults": [], "restarts": [], "hangs": [],
        "checkpoints": None,
    }
    assert render_status(snapshot).splitlines()[0].startswith("run served by /job:chief/task:0: training after ")
    snapshot["run"] = {"phase": "finished", "run_dir": "/runs/demo"}
    assert render_status(snapshot).splitlines()[0].startswith("run /runs/demo: finished after ")
