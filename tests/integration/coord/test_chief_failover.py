"""Chief fail-over with real processes: a killed leader is replaced within the
lease time; a stopped-then-resumed leader is fenced by the ps. Both backends."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import ClusterHandle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

HERE = Path(__file__).resolve().parent
TTL = 1.5


class Candidate:
    """A candidate process whose stdout lines are collected by a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line matching {pattern!r} within {timeout} s; got {self.lines[-5:]}") from None
            self.lines.append(line)
            if re.search(pattern, line):
                return line

    def drain(self) -> list[str]:
        while True:
            try:
                self.lines.append(self._queue.get_nowait())
            except queue.Empty:
                return self.lines


@pytest.fixture
def candidates(local_cluster: Callable[..., ClusterHandle], request: pytest.FixtureRequest
               ) -> Iterator[tuple[ClusterHandle, Callable[[str], Candidate]]]:
    """(ps cluster handle, start(name)) for the backend named by the test's parameter."""
    handle = local_cluster(1)
    backend = request.param
    address = request.getfixturevalue("zookeeper") if backend == "zookeeper" else handle.cluster.task_address("ps", 0)
    started: list[Candidate] = []

    def start(name: str) -> Candidate:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "candidate.py"), backend, address, str(TTL), name,
             handle.cluster.task_address("ps", 0)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
            env=dict(os.environ, PSFLOW_TOKEN=handle.token))
        started.append(Candidate(proc))
        return started[-1]

    try:
        yield handle, start
    finally:
        for c in started:
            if c.proc.poll() is None:
                os.kill(c.proc.pid, signal.SIGCONT)
                os.kill(c.proc.pid, signal.SIGKILL)
            c.proc.wait(timeout=10)


BACKENDS = pytest.mark.parametrize("candidates", ["embedded", "zookeeper"], indirect=True)


def _epoch(line: str) -> int:
    return int(line.rsplit(" ", 1)[1])


def _sent_at(line: str) -> float:
    """When a candidate sent the write of a ``write ok E sent T`` line (its time.monotonic())."""
    return float(line.rsplit(" sent ", 1)[1])


@BACKENDS
def test_killed_leader_is_replaced_within_the_lease_time(candidates) -> None:  # type: ignore[no-untyped-def]
    _handle, start = candidates
    a = start("a")
    first = _epoch(a.wait_for(r"^leader a epoch", 20))
    a.wait_for("^write ok", 10)
    b = start("b")
    b.wait_for("^campaigning", 20)
    time.sleep(0.5)  # b is now queued behind a
    killed = time.monotonic()
    os.kill(a.proc.pid, signal.SIGKILL)
    second = _epoch(b.wait_for(r"^leader b epoch", TTL + 5))
    elapsed = time.monotonic() - killed
    # lease ttl, plus the embedded backend's renewal period (ttl/3) and polling, plus slack for a busy machine
    assert elapsed < TTL * 4 / 3 + 1.5, f"fail-over took {elapsed:.2f} s"
    assert second > first
    b.wait_for("^write ok", 10)


@BACKENDS
def test_resumed_old_leader_is_fenced(candidates) -> None:  # type: ignore[no-untyped-def]
    _handle, start = candidates
    a = start("a")
    first = _epoch(a.wait_for(r"^leader a epoch", 20))
    a.wait_for("^write ok", 10)
    b = start("b")
    b.wait_for("^campaigning", 20)
    os.kill(a.proc.pid, signal.SIGSTOP)  # a long pause: a still believes it leads
    stopped = time.monotonic()
    second = _epoch(b.wait_for(r"^leader b epoch", TTL + 5))
    assert time.monotonic() - stopped < TTL * 4 / 3 + 1.5
    b.wait_for(f"^write ok {second} ", 10)  # the ps has now seen b's epoch
    resumed = time.monotonic()  # every write a sends from now on is sent after SIGCONT
    os.kill(a.proc.pid, signal.SIGCONT)
    fenced = a.wait_for("^fenced", 10)
    assert f"epoch {first} refused" in fenced and f"fenced at epoch {second}" in fenced
    assert a.proc.wait(timeout=10) == 3
    # A write a sent before the stop may be answered (and printed) after SIGCONT: the ps took it while
    # a still led. Only writes *sent* after SIGCONT must have been refused.
    late = [line for line in a.drain() if line.startswith("write ok") and _sent_at(line) >= resumed]
    assert not late, f"a wrote after resuming: {late}"
