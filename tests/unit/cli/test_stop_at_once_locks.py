"""What ``psflow train``'s stop at once after its end (the signal after the one said) says of the run locks it leaves
(``cli/train.py`` ``_leaves_undone``, asked from the signal handler): a lock is named only where its file names this
process and this run (host, pid namespace, pid, run id, and boot and start time: judged by
:func:`psflow.checkpoint.holder.is_this_process`, as :mod:`psflow.checkpoint.lock` judges one its own), and the
line says who takes it over: a run from this host (its process is seen gone there); from another host it is never
judged stale (:mod:`psflow.checkpoint.lock`): deleted by hand. Before, the line said 'the next run there takes it
over' of a shared directory's lock that a run from another host or container is refused by, and named a lock of
another host's process whose pid matched this one's (containers number their processes from 1). Real lock files,
written by :class:`~psflow.checkpoint.lock.RunDirLock` and :class:`~psflow.checkpoint.lock.CheckpointDirLock`."""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from psflow.checkpoint.lock import CheckpointDirLock, RunDirLock
from psflow.cli import train
from psflow.launch import launcher_signals

pytestmark = pytest.mark.timeout(60)

RUN = "20261129-000000-0000abcd"


@pytest.fixture
def said(tmp_path: Path) -> Iterator[types.SimpleNamespace]:
    out, ck = tmp_path / "run", tmp_path / "ck"
    config = types.SimpleNamespace(checkpoint=types.SimpleNamespace(dir=str(ck)))
    train._leaves_undone(str(out), config, [True], RUN)  # (the summary printed: only the locks are said)
    held = launcher_signals._HELD
    held.final, held.written = {"phase": "finished", "global_step": 20}, True
    try:
        yield types.SimpleNamespace(out=out, ck=ck, lines=held._undone)
    finally:
        for name in ("summary", "run lock", "checkpoint lock"):
            launcher_signals.stop_at_once_leaves(name, None)


def test_a_lock_of_this_process_and_run_says_who_takes_it_over(said: types.SimpleNamespace) -> None:
    with RunDirLock(str(said.out), RUN), CheckpointDirLock(str(said.ck), RUN):
        lines = said.lines()
    assert lines == [f"{path} is left (a run there from this host takes it over, its process gone; from another host, "
                     f"delete it)" for path in (said.out / "run.lock", said.ck / "checkpoint.lock")], lines


@pytest.mark.parametrize("field", ["host", "run_id", "pid_ns"])
def test_a_lock_naming_this_pid_on_another_host_or_for_another_run_is_not_said(said: types.SimpleNamespace,
                                                                               field: str) -> None:
    with RunDirLock(str(said.out), RUN):
        path = said.out / "run.lock"
        holder = json.loads(path.read_text())
        holder[field] = "elsewhere"  # the same pid number, another host's (namespace's) process or another run
        path.write_text(json.dumps(holder))
        assert said.lines() == []


@pytest.mark.parametrize("field", ["boot_id", "pid_start"])
def test_a_lock_of_an_earlier_process_under_this_pid_is_not_said(said: types.SimpleNamespace, field: str) -> None:
    """This run, host, pid namespace and pid, but another boot or process start time: an earlier process of the
    run given this pid (after a reboot, or a pid reused), whose lock is not this process's to name (as
    :mod:`psflow.checkpoint.lock` judges it: taken over, not kept as its own). Before, d2302fb's check compared run
    id, pid, host and pid namespace only, and named it."""
    with CheckpointDirLock(str(said.ck), RUN):
        path = said.ck / "checkpoint.lock"
        holder = json.loads(path.read_text())
        assert holder[field] is not None  # (recorded: /proc answers here)
        holder[field] = "6d0c3a2e-0000-4000-8000-000000000000" if field == "boot_id" else holder[field] - 1
        path.write_text(json.dumps(holder))
        assert said.lines() == []
