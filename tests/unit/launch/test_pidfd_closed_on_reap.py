"""A task process's descriptor (its pidfd, through which the chaos and health threads signal it) is closed once the
launcher has reaped the process and recorded its exit, not when its TaskProcess is garbage-collected.

Before: :meth:`LocalCluster.start_task` opened one per process and only a ``weakref.finalize`` closed it; the
cluster keeps every task it started (``LocalCluster.tasks``, ``Resilience._stopped``), and a LocalCluster and its
Resilience refer to each other, so each run's descriptors stayed open after ``stop_all`` until a cyclic garbage
collection (3 per 3-task run, measured). Closing it while another thread signals through it must never send the
signal through a closed number (reused by then, e.g. by another task's descriptor): that signal fails with
ProcessLookupError, as one to a reaped process does. Real processes, started by ``start_task`` (a command prefix
stands in for the task's program: ``false`` exits at once, ``sh -c 'exec sleep 60'`` runs).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from psflow.launch.processes import LocalCluster, TaskHosts

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not hasattr(os, "pidfd_open") or not Path("/proc/self/fd").exists(),
                                 reason="counts process descriptors in /proc/self/fd")]

EXITS = ("false",)   # exits 1 at once (before its descriptor is opened, at times): the reap's path
RUNS = ("sh", "-c", "exec sleep 60")


def _pidfds() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[pidfd]"
        except OSError:
            pass  # the listing's own descriptor, closed since
    return count


def _cluster(tmp_path: Path, prefix: tuple[str, ...]) -> LocalCluster:
    placement = TaskHosts(prefixes={("ps", 0): prefix, ("worker", 0): prefix, ("worker", 1): prefix})
    return LocalCluster.create(1, 2, str(tmp_path), placement=placement)


def _record_every_exit(lc: LocalCluster) -> None:
    deadline = time.monotonic() + 60
    while any(t.exit_code is None for t in lc.tasks):
        assert time.monotonic() < deadline, [t.name for t in lc.tasks if t.exit_code is None]
        lc.poll()
        time.sleep(0.01)


def test_a_recorded_exit_closes_the_task_s_descriptor_across_many_starts(tmp_path: Path) -> None:
    before = _pidfds()
    lc = _cluster(tmp_path, EXITS)
    try:
        for _ in range(5):   # a task restarted again and again: each start opens one, each recorded exit closes it
            for job, index in (("ps", 0), ("worker", 0), ("worker", 1)):
                lc.start_task(job, index, str(tmp_path / "config.json"))
            _record_every_exit(lc)
            assert _pidfds() == before, f"{_pidfds() - before} descriptors of reaped tasks still open"
        assert len(lc.tasks) == 15 and {t.exit_code for t in lc.tasks} == {1}
        for t in lc.tasks:   # reaped: no signal goes anywhere, whatever holds the task
            with pytest.raises(ProcessLookupError):
                t.send_signal(signal.SIGSTOP)
    finally:
        lc.stop_all()


def test_stop_all_closes_every_task_s_descriptor_while_the_cluster_is_kept(tmp_path: Path) -> None:
    before = _pidfds()
    lc = _cluster(tmp_path, RUNS)
    for job, index in (("ps", 0), ("worker", 0), ("worker", 1)):
        lc.start_task(job, index, str(tmp_path / "config.json"))
    assert _pidfds() == before + 3
    lc.stop_all(grace=10.0)   # SIGTERM to each group: each exits on it, reaped here, never seen by poll
    assert [t.popen.returncode for t in lc.tasks] == [-signal.SIGTERM] * 3
    assert _pidfds() == before, f"{_pidfds() - before} descriptors left after stop_all (the cluster still held)"
    lc.stop_all()   # idempotent: nothing closed twice (a second close would close whatever reused the number)
    assert _pidfds() == before


def test_a_signal_racing_the_descriptor_s_closing_is_sent_or_fails_as_reaped(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The chaos thread signals a task (signal 0: no effect) while the watch loop records its exit and closes the
    descriptor: every send goes through the task's own open descriptor or raises ProcessLookupError; never EBADF,
    never a send through the number once its closing began (the number may be another file's by then)."""
    lc = _cluster(tmp_path, RUNS)
    errors: list[BaseException] = []
    closing: set[int] = set()
    sent_after_close: list[int] = []
    real_send, real_close = signal.pidfd_send_signal, os.close

    def send(fd: int, sig: int, *args: Any) -> None:
        if fd in closing:
            sent_after_close.append(fd)
        real_send(fd, sig, *args)

    def close(fd: int) -> None:
        closing.add(fd)
        real_close(fd)

    try:
        task = lc.start_task("worker", 0, str(tmp_path / "config.json"))
        assert task.pidfd is not None
        monkeypatch.setattr(signal, "pidfd_send_signal", send)
        monkeypatch.setattr(os, "close", close)

        def hammer() -> None:
            try:
                while True:
                    try:
                        task.send_signal(0)
                    except ProcessLookupError:
                        return
            except BaseException as e:  # reported by the test
                errors.append(e)

        thread = threading.Thread(target=hammer)
        thread.start()
        task.popen.kill()
        _record_every_exit(lc)
        thread.join(timeout=30)
        assert not thread.is_alive()
    finally:
        monkeypatch.undo()
        lc.stop_all()
    assert errors == [] and sent_after_close == []
