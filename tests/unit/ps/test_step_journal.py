"""global_step's durable bound: a restarted ps task 0 never hands out a value twice."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from psflow.cluster import ClusterSpec
from psflow.cluster.replicas import shard_of
from psflow.ps import global_step as global_step_module
from psflow.ps.global_step import GlobalStep, StepJournal, StepJournalError
from psflow.ps.step_clock import StepClock
from psflow.server import step_journal


def test_every_value_handed_out_stays_below_the_recorded_bound(tmp_path: Path) -> None:
    journal = StepJournal(str(tmp_path / "global_step.json"), block=10)
    step = GlobalStep(journal=journal)
    assert step.floor == 0
    for _ in range(25):
        value = step.increment()
        assert value <= journal.load()  # recorded before it was handed out
    assert journal.load() == 30  # three blocks of 10, not one write per step


def test_a_restarted_counter_starts_its_floor_past_everything_handed_out(tmp_path: Path) -> None:
    path = str(tmp_path / "global_step.json")
    first = GlobalStep(journal=StepJournal(path, block=100))
    issued = [first.increment() for _ in range(250)]
    # "kill -9": the process is gone, the file is what survives.
    second = GlobalStep(journal=StepJournal(path, block=100))
    assert second.floor >= max(issued)
    second.set(max(second.floor, 120))  # a restore from a checkpoint at step 120
    fresh = [second.increment() for _ in range(150)]
    assert not set(fresh) & set(issued)
    third = GlobalStep(journal=StepJournal(path, block=100))
    assert third.floor >= max(fresh)


def test_set_below_the_bound_keeps_the_bound(tmp_path: Path) -> None:
    journal = StepJournal(str(tmp_path / "global_step.json"), block=50)
    step = GlobalStep(journal=journal)
    for _ in range(60):
        step.increment()
    step.set(5)  # a start-up restore of an older checkpoint
    assert journal.load() == 100
    assert step.increment() == 6


def test_concurrent_increments_are_unique_and_bounded(tmp_path: Path) -> None:
    journal = StepJournal(str(tmp_path / "global_step.json"), block=7)
    step = GlobalStep(journal=journal)
    seen: list[int] = []
    lock = threading.Lock()

    def run() -> None:
        mine = [step.increment() for _ in range(200)]
        with lock:
            seen.extend(mine)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == list(range(1, 801))
    assert journal.load() >= 800


def test_a_missing_file_is_a_floor_of_zero_and_the_directory_is_created(tmp_path: Path) -> None:
    journal = StepJournal(str(tmp_path / "state" / "ps-0" / "global_step.json"), block=3)
    assert journal.load() == 0
    step = GlobalStep(journal=journal)
    step.increment()
    assert json.loads((tmp_path / "state" / "ps-0" / "global_step.json").read_text())["bound"] == 3


@pytest.mark.parametrize("content", ["", "{not json", '{"bound": -4}', '{"bound": "12"}', "[]"])
def test_a_damaged_file_is_refused_naming_it(tmp_path: Path, content: str) -> None:
    path = tmp_path / "global_step.json"
    path.write_text(content)
    with pytest.raises(StepJournalError, match="global_step.json"):
        GlobalStep(journal=StepJournal(str(path)))
    assert path.read_text() == content  # nothing overwritten


def test_a_bad_block_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="block"):
        StepJournal(str(tmp_path / "g.json"), block=0)


@pytest.mark.parametrize("record", ["increment", "reserve"])
def test_an_unwritable_bound_fails_naming_the_file_without_handing_out_a_value(tmp_path: Path, record: str) -> None:
    """An increment that must record a new bound, or SetReady's reservation of the first block."""
    state = tmp_path / "state"
    step = GlobalStep(journal=StepJournal(str(state / "global_step.json"), block=5))
    state.write_text("a file where the journal's directory should be")
    with pytest.raises(StepJournalError, match="global_step.json"):
        getattr(step, record)()
    assert step.value == 0


def test_reserve_records_the_first_block_so_the_first_increments_write_nothing(tmp_path: Path) -> None:
    path = tmp_path / "global_step.json"
    step = GlobalStep(journal=StepJournal(str(path), block=10))
    step.reserve()
    step.reserve()  # idempotent: the recorded bound already covers the next value
    assert json.loads(path.read_text())["bound"] == 10
    path.unlink()  # any write from here on recreates it
    assert [step.increment() for _ in range(10)] == list(range(1, 11))
    assert not path.exists()
    assert step.increment() == 11
    assert json.loads(path.read_text())["bound"] == 20


def test_reserve_after_a_restore_covers_the_step_after_it(tmp_path: Path) -> None:
    path = tmp_path / "global_step.json"
    step = GlobalStep(journal=StepJournal(str(path), block=10))
    step.set(35)  # a restore: recorded as the bound
    step.reserve()
    assert json.loads(path.read_text())["bound"] == 45
    assert step.increment() == 36


def test_the_chief_s_initialization_records_the_first_block_before_any_push(tmp_path: Path) -> None:
    """SetReady (the chief's initialization) writes the journal, so the first push does not."""
    from psflow.cluster import ClusterSpec
    from psflow.gradients import DenseGradient
    from psflow.optim import OptimizerSpec
    from psflow.placement import VariableSet, replica_device_setter
    from psflow.ps.client import ParameterClient
    from psflow.ps.service import ParameterService
    from psflow.rpc.inprocess import InProcessChannel
    from psflow.train.chief import join_cluster

    path = tmp_path / "state" / "global_step.json"
    service = ParameterService(0, holds_global_step=True, step_journal=StepJournal(str(path), block=4))
    cluster = ClusterSpec({"ps": ["127.0.0.1:1"]})
    variables = VariableSet(replica_device_setter(cluster=cluster))
    variables.get_variable("bias", (2,))
    client = ParameterClient(cluster, variables.placements(), client_name="chief",
                             channels={0: InProcessChannel("/job:ps/task:0", service.handlers())})
    join_cluster(client, OptimizerSpec("sgd", {"learning_rate": 0.5}), chief=True)
    assert json.loads(path.read_text())["bound"] == 4
    path.unlink()
    steps = [client.push_detailed({"bias": DenseGradient(np.ones(2, np.float32))}).step for _ in range(5)]
    assert steps == [1, 2, 3, 4, 5]
    assert json.loads(path.read_text())["bound"] == 8  # the fifth push recorded the next block


# ---- the exact last value, for a restart on the same boot ------------------------------------------------------
_KILLED_COUNTER = """
import os, signal, sys
from psflow.ps.global_step import GlobalStep, StepJournal
step = GlobalStep(journal=StepJournal(sys.argv[1], block=100))
for _ in range(int(sys.argv[2])):
    step.increment()
os.kill(os.getpid(), signal.SIGKILL)  # no clean-up of any kind: what a killed ps task 0 leaves
"""


def _killed_after(path: Path, increments: int) -> None:
    """A real process that hands out ``increments`` values with ``path``'s journal (block 100), then is SIGKILLed."""
    done = subprocess.run([sys.executable, "-c", _KILLED_COUNTER, str(path), str(increments)], timeout=120)
    assert done.returncode == -signal.SIGKILL


def test_a_counter_killed_on_this_boot_leaves_its_exact_last_value_as_the_floor(tmp_path: Path) -> None:
    """A restarted ps task 0 goes on from the last value handed out, not from the block's bound: a restore then
    sets global_step past the kill by nothing, so a schedule and --max-steps lose no steps to the gap."""
    path = tmp_path / "global_step.json"
    _killed_after(path, 250)
    assert StepJournal(str(path)).load() == 300  # the durable bound, for a machine that crashed
    second = GlobalStep(journal=StepJournal(str(path), block=100))
    assert second.floor == 250
    second.set(second.floor)  # the restore within the run
    assert second.increment() == 251
    _killed_after(path, 0)  # a restarted process that handed out nothing keeps the floor
    assert GlobalStep(journal=StepJournal(str(path), block=100)).floor == 251


def test_after_a_reboot_the_floor_is_the_durable_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The exact value lives in the page cache until written back: another boot (the machine crashed) may have lost
    it, so only the fsync'd bound counts there."""
    path = tmp_path / "global_step.json"
    _killed_after(path, 250)
    monkeypatch.setattr(global_step_module, "_boot_id", lambda: b"another-boot")
    assert GlobalStep(journal=StepJournal(str(path), block=100)).floor == 300


@pytest.mark.parametrize("damage", ["empty", "truncated", "above the bound"])
def test_a_damaged_last_value_falls_back_to_the_durable_bound(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "global_step.json"
    _killed_after(path, 250)
    live = Path(StepJournal(str(path)).live_path)
    data = live.read_bytes()
    live.write_bytes({"empty": b"", "truncated": data[:-3],
                      "above the bound": data[:-8] + (301).to_bytes(8, "little")}[damage])
    assert GlobalStep(journal=StepJournal(str(path), block=100)).floor == 300


_FAILING_COUNTER = """
import os, signal, sys
from psflow.ps.global_step import GlobalStep, StepJournal
real, calls = os.pwrite, [0]
def pwrite(fd, data, offset):  # the disk refuses the exact value's writes after the first N (EIO)
    calls[0] += 1
    if calls[0] > int(sys.argv[3]):
        raise OSError(5, "Input/output error")
    return real(fd, data, offset)
os.pwrite = pwrite
step = GlobalStep(journal=StepJournal(sys.argv[1], block=100))
for _ in range(int(sys.argv[2])):
    step.increment()
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("written", [0, 100])
def test_a_last_value_that_could_not_be_written_never_lowers_the_floor(tmp_path: Path, written: int) -> None:
    """Where a write of the exact value fails (after ``written`` good ones), the file must not keep an older value:
    a restart would take it as the floor and restore below values already handed out (duplicate steps). The floor
    is then the durable bound."""
    path = tmp_path / "global_step.json"
    done = subprocess.run([sys.executable, "-c", _FAILING_COUNTER, str(path), "250", str(written)], timeout=120)
    assert done.returncode == -signal.SIGKILL
    assert GlobalStep(journal=StepJournal(str(path), block=100)).floor >= 250


def test_a_backup_of_shard_0_bounds_every_value_its_primary_handed_out_once_a_block(tmp_path: Path) -> None:
    """A replicated shard 0's backup follows its primary's global_step (each entry's small state) into its own
    journal, one block at a time: promoted, then lost with its shard at once, its restarted process's floor bounds
    the values it and its primary handed out (the restore goes on past them). It kept no journal: a restore after
    every replica of shard 0 was lost went on from the checkpoint's step, and step=300 was logged twice."""
    path = str(tmp_path / "global_step.json")
    backup = StepClock(holds_global_step=True, journal=StepJournal(path, block=100))
    for value in range(1, 251):  # the primary's entries, each after it handed the value out
        backup.load_replica_state({"global_step": value, "sync_step": value, "heard": None})
    assert StepJournal(path).load() == 300  # three blocks of 100: not a write (and fsync) per entry
    assert GlobalStep(journal=StepJournal(path, block=100)).floor == 250  # killed on this boot: the exact value


def test_only_shard_0s_members_keep_a_step_journal(tmp_path: Path) -> None:
    cluster = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"], "ps_backup": ["127.0.0.1:3", "127.0.0.1:4"],
                           "worker": ["127.0.0.1:5"]})
    made = {(job, i): step_journal(str(tmp_path / f"{job}-{i}"), job, shard_of(job, i, cluster) == 0)
            for job in ("ps", "ps_backup") for i in (0, 1)}
    assert {k for k, journal in made.items() if journal is not None} == {("ps", 0), ("ps_backup", 0)}
    assert step_journal(None, "ps", True) is None and step_journal(str(tmp_path), "worker", True) is None
