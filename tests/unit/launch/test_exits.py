"""The launcher's watch loop waits for its tasks' exits (psflow.launch.exits.wait_for_exit), woken by the exit
itself: a run's end is seen when the last worker exits, not at the loop's next 0.05 s tick (issue 29)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from psflow.launch.exits import wait_for_exit

pytestmark = pytest.mark.timeout(60)


def _child() -> subprocess.Popen[bytes]:
    """A child that runs until its stdin is closed."""
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)


def _end(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        child.kill()  # this test's own child, by its Popen
    child.wait(timeout=30)


def test_the_wait_ends_when_a_child_exits() -> None:
    running, ending = _child(), _child()
    woken: list[bool] = []
    try:
        waiter = threading.Thread(target=lambda: woken.append(wait_for_exit([running, ending], 30.0)), daemon=True)
        waiter.start()
        assert ending.stdin is not None
        ending.stdin.close()       # this one exits; the other keeps running
        waiter.join(timeout=30)
        assert woken == [True]     # woken by the exit (a sleep of the timeout would say False)
        assert ending.poll() == 0  # not reaped by the wait: Popen.poll still sees the exit code
    finally:
        _end(running)
        _end(ending)


def test_the_wait_says_false_at_its_timeout_while_every_child_runs() -> None:
    child = _child()
    try:
        assert wait_for_exit([child], 0.05) is False
    finally:
        _end(child)


def test_a_child_that_already_exited_returns_at_once_reaped_or_not() -> None:
    child = _child()
    assert child.stdin is not None
    child.stdin.close()
    assert wait_for_exit([child], 30.0) is True  # exited (a zombie until reaped) or reaped by now
    child.wait(timeout=30)
    assert wait_for_exit([child], 30.0) is True  # reaped: its return code says it exited


_MANY_DESCRIPTORS = """
import os, resource, subprocess, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if hard != resource.RLIM_INFINITY and hard < 2048:
    print("skip: hard limit", hard); sys.exit(0)
resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # a launcher of many tasks: descriptors past 1024
from psflow.launch.exits import wait_for_exit
child = subprocess.Popen([sys.executable, "-c", "pass"])
print(wait_for_exit([child], 30.0))
child.wait()
"""


def test_descriptors_past_fd_setsize_are_waited_on() -> None:
    # select.select refuses a descriptor >= 1024 (ValueError): the watch loop of a launcher with many tasks died
    out = subprocess.run([sys.executable, "-c", _MANY_DESCRIPTORS], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    if out.stdout.startswith("skip"):
        pytest.skip(out.stdout.strip())
    assert out.stdout.strip() == "True"
