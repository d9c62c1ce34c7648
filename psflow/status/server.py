"""The status page's HTTP server: the page, its JSON, and ``/metrics`` for Prometheus.

Routes (GET and HEAD only; any other method, OPTIONS and TRACE included, is answered 405 with
``Allow: GET, HEAD``):

``/``             the status page (plain HTML, a little JavaScript and CSS, served
                  from the package: nothing is loaded from elsewhere)
``/api/status``   the newest snapshot (:mod:`psflow.status.collector`) as JSON
``/metrics``      the same numbers in Prometheus' text format, written by the
                  Prometheus client library; labels ``job`` and ``task``

Read-only: nothing served changes the run. Bound to 127.0.0.1 by default; bound
to any other address it requires the cluster token, as ``Authorization: Bearer
TOKEN`` (what a Prometheus scrape config sends) or, for a browser, once as
``/?token=TOKEN``, which sets a cookie for the page's own requests. A request
without it gets 401 and nothing else.

Who may ask (the ``Host`` header): on loopback, where no token is asked for, a
request must name this machine's loopback, ``localhost`` or a loopback address
(``127.0.0.1``, ``[::1]``; any port, so that a tunnel's own port works); any
other ``Host``, or none, is answered 421 with one short line. That is the guard
against DNS rebinding: a web page the user visits at ``attacker.example``, whose
name the attacker then points at 127.0.0.1, reaches the port, but its requests
say ``Host: attacker.example``. Off loopback the page answers any ``Host`` (it is
reached by names no one can list: the machine's, a load balancer's) and the
token is the guard: a rebinding page has no token, and the browser sends the
page's cookie only to the name it was set for (``SameSite=Strict``).

Metrics (counters end in ``_total``; all values from the same snapshot):

==========================================  ===========================================
``psflow_global_step``                      global_step (gauge)
``psflow_examples_total``                   examples trained, each record once per epoch
``psflow_examples_per_second``              over the last sample (at the end: this run's rate)
``psflow_examples_this_run``                at the end: examples this run added (less a resumed checkpoint's)
``psflow_loss``                             the cluster's moving-average loss
``psflow_last_step_loss``                   the newest step's loss
``psflow_learning_rate``                    the run's learning rate in force (a schedule's value at global_step)
``psflow_eval_auc``                         newest ``eval/auc`` summary (or the final eval)
``psflow_task_up{job,task}``                1 if the task answered its last ping
``psflow_task_restarts_total{job,task}``
``psflow_ps_pushes_total{job,task}``        and ``_pulls_total``, ``_received_bytes_total``,
                                            ``_sent_bytes_total``, ``_apply_seconds_total``,
                                            ``_rows_pulled_total``, ``_rows_pushed_total``
``psflow_ps_parameter_bytes{job,task}``
``psflow_gradient_staleness``               histogram of async pushes' staleness (steps)
``psflow_sync_waiting_workers``             workers the sync step being collected waits for
``psflow_sync_failed_ps_tasks``             ps tasks whose sync step failed (timed out under
                                            ``--on-timeout fail``): each refuses every push until a restore
``psflow_faults_total``, ``psflow_checkpoints_saved_total``, ``psflow_checkpoints_failed_total``
``psflow_checkpoint_last_saved_step``       global_step of the newest checkpoint saved
==========================================  ===========================================

At a run's end the snapshot is the run's final one (:meth:`StatusCollector.finish`),
so the last ``/metrics`` (``metrics.prom``) says what metrics.json says.
"""

from __future__ import annotations

import errno
import hmac
import http.server
import importlib.resources
import ipaddress
import logging
import selectors
import socket
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from psflow import jsonio
from psflow.status.collector import StatusCollector
from psflow.train.config import ConfigError

__all__ = ["StatusConfig", "StatusServer", "prometheus_text", "is_loopback", "is_loopback_host"]

log = logging.getLogger("psflow.status.collector")

_PAGE_FILES = {"/": ("index.html", "text/html; charset=utf-8"), "/index.html": ("index.html", "text/html; charset=utf-8"),
               "/status.js": ("status.js", "text/javascript; charset=utf-8"),
               "/status.css": ("status.css", "text/css; charset=utf-8")}
_COOKIE = "psflow_token"


@dataclass(frozen=True)
class StatusConfig:
    """Where a launcher (or the chief under ``psflow server``) serves the status page.

    Attributes:
        enabled: serve it at all (``--no-status`` turns it off).
        host: address to bind (127.0.0.1; any other requires the cluster token).
        port: port to bind (0: a free one, printed at start).
        interval: seconds between samples of the cluster.
        token: the secret the page requires off loopback (``PSFLOW_TOKEN``). ``psflow train``'s
            cluster token is made fresh for each run and known to no one, so a page it serves
            elsewhere requires this one; under ``psflow server`` it is the cluster's token.
    """

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 0
    interval: float = 1.0
    token: str | None = field(default=None, repr=False)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback_host(header: str | None) -> bool:
    """Whether a request's ``Host`` header names this machine's loopback: ``localhost`` or a loopback
    address (``127.0.0.1``, ``[::1]``, ...), with any port or none. A missing header is not."""
    if not header:
        return False
    name = header.strip().lower()
    if name.startswith("["):
        name, bracket, rest = name[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return False
    elif name.count(":") == 1:  # NAME:PORT (more colons: an IPv6 address without brackets)
        name = name.partition(":")[0]
    return is_loopback(name)


def _page(name: str) -> bytes:
    return importlib.resources.files("psflow.status").joinpath("page", name).read_bytes()


class _Metrics:
    """A Prometheus collector over the newest snapshot (registered in a registry of its own)."""

    def __init__(self, collector: StatusCollector) -> None:
        self._collector = collector

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        s = self._collector.snapshot()

        def gauge(name: str, doc: str, value: Any) -> Iterator[Any]:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                yield GaugeMetricFamily(name, doc, value=float(value))

        yield from gauge("psflow_global_step", "global_step of the run (ps task 0)", s.get("global_step"))
        if isinstance(s.get("examples"), int):
            yield CounterMetricFamily("psflow_examples", "examples trained, each record counted once per epoch",
                                      value=float(s["examples"]))
        yield from gauge("psflow_examples_per_second", "examples per second over the last sample",
                         s.get("examples_per_sec"))
        yield from gauge("psflow_examples_this_run", "examples this run added to the model (the count after a resume "
                         "less the resumed checkpoint's)", s.get("examples_this_run"))
        yield from gauge("psflow_loss", "the cluster's moving-average training loss", s.get("loss"))
        yield from gauge("psflow_last_step_loss", "the training loss of the newest step", s.get("last_step_loss"))
        yield from gauge("psflow_learning_rate", "the run's learning rate in force (the next update's)",
                         s.get("learning_rate"))
        auc = _newest(s.get("scalars", {}).get("eval/auc"))
        if isinstance(s.get("eval"), dict) and s["eval"].get("auc") is not None:
            auc = s["eval"]["auc"]
        yield from gauge("psflow_eval_auc", "newest eval AUC", auc)
        up = GaugeMetricFamily("psflow_task_up", "1 if the task answered its last ping", labels=["job", "task"])
        restarts = CounterMetricFamily("psflow_task_restarts", "restarts of the task's process", labels=["job", "task"])
        for t in s.get("tasks", []):
            labels = [t["job"], str(t["index"])]
            up.add_metric(labels, 1.0 if t.get("state") == "up" else 0.0)
            restarts.add_metric(labels, float(t.get("restarts") or 0))
        yield up
        yield restarts
        counters = (("pushes", "pushes", "push requests"), ("pulls", "pulls", "pull requests"),
                    ("received_bytes", "bytes_in", "bytes of pushed gradients received"),
                    ("sent_bytes", "bytes_out", "bytes of pulled rows sent"),
                    ("apply_seconds", "apply_seconds", "seconds spent applying async pushes"),
                    ("rows_pulled", "rows_pulled", "rows pulled"), ("rows_pushed", "rows_pushed", "rows pushed"))
        for name, key, doc in counters:
            family = CounterMetricFamily(f"psflow_ps_{name}", f"{doc}, per ps task", labels=["job", "task"])
            for row in s.get("ps", []):
                if isinstance(row.get(key), (int, float)):
                    family.add_metric(["ps", str(row["index"])], float(row[key]))
            yield family
        params = GaugeMetricFamily("psflow_ps_parameter_bytes", "bytes of variables and slots held",
                                   labels=["job", "task"])
        for row in s.get("ps", []):
            if isinstance(row.get("parameter_bytes"), (int, float)):
                params.add_metric(["ps", str(row["index"])], float(row["parameter_bytes"]))
        yield params
        yield from _replication_metrics(s, gauge)
        histogram = {int(k): int(v) for k, v in (s.get("staleness_histogram") or {}).items()}
        if histogram:
            buckets, running = [], 0
            for staleness in sorted(histogram):
                running += histogram[staleness]
                buckets.append((str(float(staleness)), float(running)))
            buckets.append(("+Inf", float(running)))
            yield HistogramMetricFamily("psflow_gradient_staleness", "staleness (steps) of applied async pushes",
                                        buckets=buckets, sum_value=float(sum(k * v for k, v in histogram.items())))
        if s.get("sync") is not None:
            yield GaugeMetricFamily("psflow_sync_waiting_workers", "workers the sync step being collected waits for",
                                    value=float(len(s["sync"].get("waiting_for") or [])))
            yield GaugeMetricFamily("psflow_sync_failed_ps_tasks", "ps tasks whose sync step failed (refusing every "
                                    "push until a restore)", value=float(len(s["sync"].get("failed") or {})))
        yield CounterMetricFamily("psflow_faults", "faults injected (--chaos)", value=float(len(s.get("faults", []))))
        ledger = s.get("checkpoints")
        if ledger is not None:
            yield CounterMetricFamily("psflow_checkpoints_saved", "checkpoints saved",
                                      value=float(ledger.get("saved") or 0))
            yield CounterMetricFamily("psflow_checkpoints_failed", "checkpoint saves that failed",
                                      value=float(ledger.get("failed") or 0))
            yield from gauge("psflow_checkpoint_last_saved_step", "global_step of the newest checkpoint saved",
                             ledger.get("last_saved_step"))


def _replication_metrics(s: Mapping[str, Any], gauge: Any) -> Iterator[Any]:
    """Replicated ps shards (where the ps tasks report them, :mod:`psflow.status.replication`): the pushes
    acknowledged, applied and lost; per shard, its primary (a 1 labelled with the task) and epoch, each
    backup's lag in entries and seconds, and the entries queued for each member joining."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    for name, doc in (("pushes_acknowledged", "pushes acknowledged to the workers, all shards"),
                      ("pushes_applied", "pushes held in the model, all shards")):
        if isinstance(s.get(name), int):
            yield CounterMetricFamily(f"psflow_{name}", doc, value=float(s[name]))
    yield from gauge("psflow_updates_lost", "acknowledged pushes lost with every replica of a shard (0 unless "
                     "all of a shard's replicas were lost at once)", s.get("updates_lost"))
    shards = s.get("shards") or []
    if not shards:
        return
    primary = GaugeMetricFamily("psflow_shard_primary", "1 for each shard's primary", labels=["shard", "task"])
    epoch = GaugeMetricFamily("psflow_shard_epoch", "the shard's view epoch (one more per promotion or change)",
                              labels=["shard"])
    entries = GaugeMetricFamily("psflow_backup_lag_entries", "entries sent to the backup and not acknowledged yet",
                                labels=["shard", "task"])
    seconds = GaugeMetricFamily("psflow_backup_lag_seconds", "age of the oldest entry the backup has not "
                                "acknowledged", labels=["shard", "task"])
    joining = GaugeMetricFamily("psflow_joining_queue_entries", "entries queued for a member rebuilding from the "
                                "shard's primary, not in its view yet", labels=["shard", "task"])
    for shard in shards:
        label = str(shard.get("shard"))
        primary.add_metric([label, str(shard.get("primary"))], 1.0)
        if isinstance(shard.get("epoch"), int):
            epoch.add_metric([label], float(shard["epoch"]))
        for backup in shard.get("backups") or []:
            if isinstance(backup.get("lag_entries"), int):
                entries.add_metric([label, str(backup["task"])], float(backup["lag_entries"]))
            if isinstance(backup.get("lag_seconds"), (int, float)):
                seconds.add_metric([label, str(backup["task"])], float(backup["lag_seconds"]))
        for member in shard.get("joining") or []:
            if isinstance(member.get("lag_entries"), int):
                joining.add_metric([label, str(member["task"])], float(member["lag_entries"]))
    yield from (primary, epoch, entries, seconds, joining)


def _newest(points: Any) -> float | None:
    return float(points[-1][1]) if points else None


def prometheus_text(collector: StatusCollector) -> bytes:
    """The newest snapshot in Prometheus' text exposition format."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Metrics(collector))
    return bytes(generate_latest(registry))


class StatusServer:
    """Serves the status page of one :class:`StatusCollector` on its own daemon threads."""

    def __init__(self, collector: StatusCollector, *, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None) -> None:
        """Binds ``host:port`` (0: a free port); serves nothing until :meth:`start`.

        ``host`` is an IPv4 or IPv6 address (``::1``, also written ``[::1]``) or a name.

        Raises:
            ConfigError: ``host`` is not a loopback address and there is no token to require, or
                the address cannot be bound: the message names ``--status-port`` where the port is
                at fault (out of range, in use, privileged) and ``--status-host`` otherwise.
        """
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not is_loopback(host) and not token:
            raise ConfigError(f"--status-host {host}: a status page on an address other than loopback requires the "
                              "cluster token (PSFLOW_TOKEN); without one, keep it on 127.0.0.1")
        if not 0 <= port <= 65535:
            raise ConfigError(f"--status-port {port}: want a port in [0, 65535] (0: a free one)")
        self.collector = collector
        self._token = token if not is_loopback(host) else None
        self._httpd = _bind(host, port, _handler(self))
        self._httpd.daemon_threads = True
        self.host, self.port = host, int(self._httpd.server_address[1])
        self._thread: threading.Thread | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None  # close() writes to [1]; the loop reads [0]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def start(self) -> StatusServer:
        """Serves on a daemon thread until :meth:`close`; idempotent."""
        if self._thread is None:
            self._wake = socket.socketpair()
            self._thread = threading.Thread(target=self._serve, args=(self._wake[0],), name="psflow-status-http",
                                            daemon=True)
            self._thread.start()
        return self

    def _serve(self, wake: socket.socket) -> None:
        """Answers each connection as it comes (each request on its own thread) until ``wake`` is readable.

        Blocks in one ``select`` on the listening socket and ``wake``: it never wakes up on its own, and
        :meth:`close` ends it at once (socketserver's ``serve_forever`` polls its stop flag every
        ``poll_interval``, which every run's end used to wait out: up to 0.2 s).
        """
        self._httpd.timeout = 0  # handle_request's own select: never blocks (a connection gone before accept)
        with selectors.DefaultSelector() as selector:
            selector.register(self._httpd, selectors.EVENT_READ, "http")
            selector.register(wake, selectors.EVENT_READ, "wake")
            while True:
                events = selector.select()
                if any(key.data == "wake" for key, _ in events):
                    return
                self._httpd.handle_request()  # the socket is readable: accepts at once, never waits

    def close(self) -> None:
        """Stops serving (returns once the serving thread has ended, at once when idle; requests being
        answered finish on their own threads) and closes the socket; idempotent."""
        if self._thread is not None and self._wake is not None:
            self._wake[1].send(b"x")
            self._thread.join(timeout=5)
            self._thread = None
            for end in self._wake:
                end.close()
            self._wake = None
        self._httpd.server_close()

    def host_allowed(self, host: str | None) -> bool:
        """Whether a request with this ``Host`` header is answered: on loopback only a loopback name
        (the DNS-rebinding guard); off loopback any (the token guards it). See the module docstring."""
        return self._token is not None or is_loopback_host(host)

    def authorized(self, headers: Any, query: dict[str, list[str]]) -> tuple[bool, str | None]:
        """(allowed, token to set as a cookie)."""
        if self._token is None:
            return True, None
        offered = []
        auth = headers.get("Authorization") or ""
        if auth.startswith("Bearer "):
            offered.append(auth[len("Bearer "):].strip())
        for part in (headers.get("Cookie") or "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == _COOKIE:
                offered.append(value)
        from_query = query.get("token", [])
        offered += from_query
        ok = any(hmac.compare_digest(o.encode(), self._token.encode()) for o in offered)
        return ok, (self._token if ok and from_query else None)

    def __enter__(self) -> StatusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Server6(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6


def _bind(host: str, port: int, handler: type[http.server.BaseHTTPRequestHandler]) -> http.server.ThreadingHTTPServer:
    """The HTTP server bound to ``host:port``, IPv6 where ``host`` is an IPv6 address; a failure is a
    ConfigError naming the flag at fault."""
    server = _Server6 if ":" in host else http.server.ThreadingHTTPServer
    where = f"cannot serve the status page on {f'[{host}]' if ':' in host else host}:{port}"
    try:
        return server((host, port), handler)
    except socket.gaierror as e:
        raise ConfigError(f"--status-host {host}: {where}: the name does not resolve ({e.strerror or e})") from None
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise ConfigError(f"--status-port {port}: {where}: port {port} is already in use (another process "
                              "listens on it)") from None
        if e.errno == errno.EACCES:
            raise ConfigError(f"--status-port {port}: {where}: permission denied (a port below 1024 needs "
                              "privileges)") from None
        hint = " (not an address of this machine)" if e.errno == errno.EADDRNOTAVAIL else ""
        raise ConfigError(f"--status-host {host}: {where}: {e.strerror or e}{hint}") from None


def _handler(server: StatusServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "psflow-status"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            log.debug("status http: " + format, *args)

        def do_HEAD(self) -> None:  # noqa: N802 - the base class's naming
            self._serve(head=True)

        def do_GET(self) -> None:  # noqa: N802
            self._serve(head=False)

        def _refuse(self) -> None:
            if self._misdirected(head=False):
                return
            self._reply(405, b"read-only: GET and HEAD only\n", "text/plain; charset=utf-8", extra={"Allow": "GET, HEAD"})

        def __getattr__(self, name: str) -> Any:
            # The base class answers a method it has no do_<METHOD> for with 501 (OPTIONS, TRACE,
            # CONNECT, any word): this page answers every method but GET and HEAD with 405.
            if name.startswith("do_"):
                return self._refuse
            raise AttributeError(name)

        def _misdirected(self, head: bool) -> bool:
            """Answers 421 (and returns True) when the request does not say it is for this page."""
            if server.host_allowed(self.headers.get("Host")):
                return False
            self._reply(421, b"psflow status page: refused: the Host header must be localhost or a loopback address "
                             b"(this page is served on loopback only)\n", "text/plain; charset=utf-8", head=head)
            return True

        def _serve(self, head: bool) -> None:
            if self._misdirected(head):
                return
            url = urllib.parse.urlsplit(self.path)
            ok, cookie = server.authorized(self.headers, urllib.parse.parse_qs(url.query))
            if not ok:
                self._reply(401, b"the cluster token is required (Authorization: Bearer TOKEN, or ?token=TOKEN)\n",
                            "text/plain; charset=utf-8", head=head, extra={"WWW-Authenticate": "Bearer"})
                return
            extra = {"Set-Cookie": f"{_COOKIE}={cookie}; HttpOnly; SameSite=Strict; Path=/"} if cookie else {}
            try:
                if url.path in _PAGE_FILES:
                    name, ctype = _PAGE_FILES[url.path]
                    self._reply(200, _page(name), ctype, head=head, extra=extra)
                elif url.path == "/api/status":
                    body = jsonio.dumps(server.collector.snapshot()).encode()
                    self._reply(200, body, "application/json", head=head, extra=extra)
                elif url.path == "/metrics":
                    from prometheus_client import CONTENT_TYPE_LATEST

                    self._reply(200, prometheus_text(server.collector), CONTENT_TYPE_LATEST, head=head)
                else:
                    self._reply(404, b"not found\n", "text/plain; charset=utf-8", head=head)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _reply(self, code: int, body: bytes, ctype: str, *, head: bool = False,
                   extra: dict[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if not head:
                self.wfile.write(body)

    return Handler
