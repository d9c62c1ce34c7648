"""Multi-host test harness: each task in its own Linux network namespace.

Test support (not part of psflow). :class:`NetnsLab` builds, as root::

    root namespace                     namespace pf<sfx>-<host>
    bridge pfbr<sfx> 10.231.X.1/24 --- veth pfv<sfx><i> <-> eth0 10.231.X.(10+i)/24
      + "front" addresses 10.231.X.(110+i)/32, where the delaying relay listens

* **Addresses.** Host ``i`` owns ``10.231.X.(10+i)`` (``X`` random, checked
  unused and claimed under a lock file, so labs built at once, by ``pytest -n``
  or parallel runs, never share it); every name carries a random 4-hex suffix
  (namespaces, the bridge, the veths; at most 15 characters), so parallel runs
  do not collide. Tests send traffic only to these addresses.
* **Latency.** This kernel has no ``netem`` qdisc, so :func:`relay_main`
  (run as a process in the root namespace) accepts on each host's *front*
  address and forwards to the host's own address, holding every chunk
  ``delay`` seconds in each direction, in order (a round trip through it
  costs ``2 * delay`` more). A cluster whose addresses are the front
  addresses has every call delayed; each task binds its own address
  (``psflow server --bind-host``). It forwards fixed ports only, so it carries
  gRPC, not the TCP carrier's port chosen at start; either side closing its
  half closes the whole connection (enough for gRPC). Where the kernel has ``netem``,
  :meth:`NetnsLab.netem` adds delay or loss on a host's link instead.
* **Faults.** :meth:`NetnsLab.cut` / :meth:`NetnsLab.heal` set a host's veth
  down and up (established connections stall, as on a real cut);
  :meth:`NetnsLab.limit_rate` adds ``tc tbf``.
* **Cleanup.** :meth:`NetnsLab.close` (context manager exit, and an ``atexit``
  safety net) ends every process it started and every process left in its
  namespaces, by pid, then deletes every namespace, veth and the bridge,
  ignoring what is already gone; it never raises. Each lab also records what
  it made in ``/tmp/psflow-netns/<suffix>.json`` with its pid; a new lab first
  removes what labs of dead processes left (a test run killed by SIGKILL).

:func:`netns_available` says whether namespaces can be made here (root, ``ip``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

RELAY_READY = "relay: ready"
LEDGER_DIR = Path("/tmp/psflow-netns")  # what each live lab made, with its pid (see _sweep_dead_labs)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _drain(stream: IO[bytes], sink: IO[bytes]) -> None:
    with sink:
        for chunk in iter(lambda: stream.read(65536), b""):
            sink.write(chunk)
            sink.flush()


def netns_available() -> str | None:
    """None when network namespaces can be made here, else why not (for ``pytest.skip``)."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is missing"
    name = f"pfchk{secrets.token_hex(3)}"
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


def _free_subnet() -> int:
    """A third octet X with 10.231.X.0/24 not used by any address or route of this machine."""
    used = _ip("-4", "addr").stdout + _ip("-4", "route").stdout
    for _ in range(100):
        x = secrets.randbelow(250) + 1
        if f"10.231.{x}." not in used:
            return x
    raise RuntimeError("no free 10.231.X.0/24 subnet")


def _sweep_dead_labs() -> None:
    """Deletes the namespaces and links of labs whose process is gone (never a live lab's)."""
    for ledger in LEDGER_DIR.glob("*.json") if LEDGER_DIR.is_dir() else []:
        try:
            entry = json.loads(ledger.read_text())
            pid, made = int(entry["pid"]), [tuple(m) for m in entry["made"]]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        try:
            os.kill(pid, 0)
            continue  # alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        for kind, name in reversed(made):
            if kind == "netns":
                for other in _ip("netns", "pids", name, check=False).stdout.split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(other), signal.SIGKILL)
                _ip("netns", "del", name, check=False)
            else:
                _ip("link", "del", name, check=False)
        ledger.unlink(missing_ok=True)


@dataclass
class Host:
    """One namespace: its name, the root side of its veth, its address and its front (relay) address."""

    name: str
    netns: str
    veth: str
    address: str
    front: str


@dataclass
class NetnsLab:
    """Namespaces on one bridge; see the module docstring. Use as a context manager."""

    host_names: list[str]
    suffix: str = field(default_factory=lambda: secrets.token_hex(2))
    hosts: dict[str, Host] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    relay: subprocess.Popen[bytes] | None = None
    _made: list[tuple[str, str]] = field(default_factory=list)  # ("netns"|"link", name), in creation order
    _closed: bool = False

    def __post_init__(self) -> None:
        if len(self.host_names) > 99:
            raise ValueError(f"at most 99 hosts, got {len(self.host_names)}")
        self.bridge = f"pfbr{self.suffix}"
        self.subnet = 0

    def __enter__(self) -> NetnsLab:
        atexit.register(self.close)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _record(self, kind: str, name: str) -> None:
        self._made.append((kind, name))
        LEDGER_DIR.mkdir(exist_ok=True)
        tmp = LEDGER_DIR / f"{self.suffix}.json.tmp"
        tmp.write_text(json.dumps({"pid": os.getpid(), "made": self._made}))
        os.replace(tmp, LEDGER_DIR / f"{self.suffix}.json")

    def _build(self) -> None:
        _sweep_dead_labs()
        LEDGER_DIR.mkdir(exist_ok=True)
        # Labs built at the same time (pytest -n, parallel runs) each pick a subnet no address uses yet: the
        # choice and the bridge's address that claims it happen under one lock, so two labs never pick the same.
        with open(LEDGER_DIR / "subnet.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.subnet = _free_subnet()
            net = f"10.231.{self.subnet}"
            self._record("link", self.bridge)
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{net}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, name in enumerate(self.host_names):
            host = Host(name, f"pf{self.suffix}-{name}", f"pfv{self.suffix}{i}", f"{net}.{10 + i}", f"{net}.{110 + i}")
            peer = f"pfp{self.suffix}{i}"
            self._record("netns", host.netns)
            _ip("netns", "add", host.netns)
            self._record("link", host.veth)
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", host.netns)
            _ip("link", "set", host.veth, "master", self.bridge, "up")
            _ip("-n", host.netns, "link", "set", peer, "name", "eth0")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "eth0", "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
            _ip("addr", "add", f"{host.front}/32", "dev", self.bridge)
            self.hosts[name] = host

    # -- processes -------------------------------------------------------------------------------

    def spawn(self, host: str, cmd: list[str], *, env: dict[str, str] | None = None,
              log: Path | None = None) -> subprocess.Popen[bytes]:
        """Starts ``cmd`` inside ``host``'s namespace (its own process group); ended by :meth:`close`."""
        out: IO[bytes] | int = open(log, "ab") if log is not None else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(["ip", "netns", "exec", self.hosts[host].netns, *cmd], env=env,
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, process_group=0)
        finally:
            if not isinstance(out, int):
                out.close()
        self.procs.append(proc)
        return proc

    def start_relay(self, ports: dict[str, int], *, delay: float, log: Path | None = None,
                    timeout: float = 30.0) -> None:
        """Starts the delaying relay: ``front:port -> address:port`` for each ``host: port``; blocks until it listens."""
        routes = [f"{self.hosts[h].front}:{p}={self.hosts[h].address}:{p}" for h, p in ports.items()]
        self.relay = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "relay", str(delay), *routes],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      process_group=0)
        self.procs.append(self.relay)
        assert self.relay.stdout is not None
        deadline = time.monotonic() + timeout
        lines = []
        while time.monotonic() < deadline:
            line = self.relay.stdout.readline().decode(errors="replace")
            if not line:
                break
            lines.append(line)
            if line.startswith(RELAY_READY):
                # Keep draining its output (to a file or nowhere) so it never blocks on a full pipe.
                sink = open(log, "ab") if log is not None else open(os.devnull, "wb")
                threading.Thread(target=_drain, args=(self.relay.stdout, sink), daemon=True).start()
                return
        raise RuntimeError("the relay did not start: " + "".join(lines))

    # -- links -----------------------------------------------------------------------------------

    def cut(self, host: str) -> None:
        """Sets ``host``'s link down: nothing reaches it or leaves it (connections stall, no reset)."""
        _ip("link", "set", self.hosts[host].veth, "down")

    def heal(self, host: str) -> None:
        """Sets ``host``'s link up again."""
        _ip("link", "set", self.hosts[host].veth, "up")

    def limit_rate(self, host: str, rate: str = "100mbit") -> None:
        """``tc tbf`` on ``host``'s link (the root side: traffic towards the host)."""
        subprocess.run(["tc", "qdisc", "replace", "dev", self.hosts[host].veth, "root", "tbf", "rate", rate,
                        "burst", "64kb", "latency", "100ms"], check=True, capture_output=True, timeout=30)

    def netem(self, host: str, *args: str) -> bool:
        """``tc netem ARGS`` on ``host``'s link, e.g. ``("delay", "1ms")``; False where the kernel has no netem."""
        done = subprocess.run(["tc", "qdisc", "replace", "dev", self.hosts[host].veth, "root", "netem", *args],
                              capture_output=True, timeout=30)
        return done.returncode == 0

    # -- cleanup ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Ends every process (ours, then anything left in our namespaces) and deletes every namespace,
        veth and the bridge made here. Idempotent; never raises."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._stop_procs()
        for kind, name in reversed(self._made):
            with contextlib.suppress(Exception):
                if kind == "netns":
                    _ip("netns", "del", name, check=False)
                else:
                    _ip("link", "del", name, check=False)
        with contextlib.suppress(Exception):
            (LEDGER_DIR / f"{self.suffix}.json").unlink(missing_ok=True)
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)

    def _stop_procs(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in self.procs:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, sig)
            deadline = time.monotonic() + 3.0
            for p in self.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
        for kind, name in self._made:  # a process left in one of our namespaces (started by a task) ends too
            if kind == "netns":
                pids = _ip("netns", "pids", name, check=False).stdout.split()
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)

    def leftovers(self) -> list[str]:
        """Namespaces and links made here that still exist (empty after :meth:`close`)."""
        netns = _ip("netns", "list", check=False).stdout
        links = _ip("-o", "link", check=False).stdout
        left = []
        for kind, name in self._made:
            present = any(line.split()[0] == name for line in netns.splitlines() if line.strip()) if kind == "netns" \
                else f" {name}:" in links or f" {name}@" in links
            if present:
                left.append(name)
        return left


# -- the delaying relay (run as a process: python tests/netns.py relay DELAY FRONT:PORT=ADDR:PORT ...) ----


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copies reader to writer, each chunk sent ``delay`` s after it arrived, in order."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
    loop = asyncio.get_running_loop()

    async def send() -> None:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    sender = asyncio.ensure_future(send())
    try:
        while True:
            data = await reader.read(65536)
            queue.put_nowait((loop.time() + delay, data))
            if not data:
                break
        await sender
    except (OSError, asyncio.CancelledError):
        sender.cancel()
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _relay(delay: float, routes: list[tuple[str, int, str, int]]) -> None:
    async def serve(front_reader: asyncio.StreamReader, front_writer: asyncio.StreamWriter,
                    target: tuple[str, int]) -> None:
        try:
            back_reader, back_writer = await asyncio.wait_for(asyncio.open_connection(*target), timeout=10.0)
        except (TimeoutError, OSError):
            front_writer.close()
            return
        await asyncio.gather(_pump(front_reader, back_writer, delay), _pump(back_reader, front_writer, delay),
                             return_exceptions=True)

    servers = []
    for host, port, thost, tport in routes:
        servers.append(await asyncio.start_server(
            lambda r, w, t=(thost, tport): serve(r, w, t), host, port, reuse_address=True))
    print(RELAY_READY, flush=True)
    await asyncio.Event().wait()


def relay_main(argv: list[str]) -> None:
    delay = float(argv[0])
    routes = []
    for spec in argv[1:]:
        front, target = spec.split("=")
        fh, fp = front.rsplit(":", 1)
        th, tp = target.rsplit(":", 1)
        routes.append((fh, int(fp), th, int(tp)))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_relay(delay, routes))


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "relay":
        relay_main(sys.argv[2:])
    else:
        raise SystemExit("usage: python tests/netns.py relay DELAY FRONT:PORT=ADDR:PORT ...")
