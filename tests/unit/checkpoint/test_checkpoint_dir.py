"""One writer per checkpoint directory, lineage-scoped rotation, failed saves and the fenced pointer
(issue 17, items 5-7), on real in-process ps services (no sockets).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from psflow.checkpoint.ledger import checkpoint_status
from psflow.checkpoint.lock import LOCK_NAME, CheckpointDirLock, CheckpointLockedError, holder_alive
from psflow.checkpoint.manifest import Manifest, read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.restore import restore
from psflow.checkpoint.save import CheckpointFencedError, CheckpointManager, CheckpointSavesFailedError
from psflow.cluster import ClusterSpec
from psflow.errors import CheckpointError
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, fixed_size_partitioner, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.service import ParameterService
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.chief import check_restorable

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})
ADAGRAD = OptimizerSpec("adagrad", {"learning_rate": 0.5})


def _cluster(name: str = "chief") -> ParameterClient:
    """A fresh, initialized cluster of two in-process ps services and a client on it."""
    vs = VariableSet(replica_device_setter(cluster=CLUSTER))
    vs.get_variable("w", (10, 2), partitioner=fixed_size_partitioner(2), initializer={"name": "constant", "value": 1.0})
    vs.get_variable("b", (1,))
    services = [ParameterService(i, holds_global_step=i == 0) for i in (0, 1)]
    channels = {i: InProcessChannel(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)}
    client = ParameterClient(CLUSTER, vs.placements(), client_name=name, channels=channels)
    client.register(ADAGRAD, chief=True)
    _STEP_TASK[id(client)] = services[0]
    return client


_STEP_TASK: dict[int, ParameterService] = {}


def _step(client: ParameterClient) -> None:
    """global_step + 1, as a push would."""
    counter = _STEP_TASK[id(client)].global_step
    assert counter is not None
    counter.increment()


# ---- the lock ----------------------------------------------------------------
def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: the pid names no process now
    return proc.pid


def test_a_second_live_run_is_refused_naming_the_holder(tmp_path: Path) -> None:
    first = CheckpointDirLock(str(tmp_path), "run-a", run_dir="runs/a")
    first.acquire()
    first.acquire()  # idempotent
    holder = json.loads((tmp_path / LOCK_NAME).read_text())
    assert holder["run_id"] == "run-a" and holder["pid"] == os.getpid()
    with pytest.raises(CheckpointLockedError, match=rf"in use by run run-a \(pid {os.getpid()} on .*run directory "
                                                    r".*runs/a\).*this run \(run-b\)"):
        CheckpointDirLock(str(tmp_path), "run-b").acquire()
    assert not CheckpointDirLock(str(tmp_path), "run-b").release()  # only the holder releases
    assert first.release() and not (tmp_path / LOCK_NAME).exists()
    CheckpointDirLock(str(tmp_path), "run-b").acquire()  # free again


def test_a_dead_runs_lock_is_taken_over_and_the_same_run_keeps_its_own(tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    lock = CheckpointDirLock(str(tmp_path), "run-a")
    lock.acquire()
    stale = json.loads((tmp_path / LOCK_NAME).read_text())
    stale["pid"] = _dead_pid()
    (tmp_path / LOCK_NAME).write_text(json.dumps(stale))
    # The same run (a restarted chief): the lock is the run's, this process vouches for it now.
    with caplog.at_level(logging.INFO, logger="psflow.checkpoint"):
        CheckpointDirLock(str(tmp_path), "run-a").acquire()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert "is gone; pid" in caplog.text
    # Another run: takes over the stale lock of a dead one, saying so.
    (tmp_path / LOCK_NAME).write_text(json.dumps(stale))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="psflow.checkpoint"):
        CheckpointDirLock(str(tmp_path), "run-b").acquire()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["run_id"] == "run-b"
    assert f"taking over the stale lock of run run-a (pid {stale['pid']}" in caplog.text
    # A pid reused by another process (its start time differs) is a dead holder too.
    reused = dict(stale, run_id="run-c", pid=os.getppid(), pid_start=1)
    (tmp_path / LOCK_NAME).write_text(json.dumps(reused))
    CheckpointDirLock(str(tmp_path), "run-d").acquire()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["run_id"] == "run-d"


def test_a_lock_from_another_host_or_unreadable_is_never_taken_over(tmp_path: Path) -> None:
    CheckpointDirLock(str(tmp_path), "run-a").acquire()
    holder = json.loads((tmp_path / LOCK_NAME).read_text())
    (tmp_path / LOCK_NAME).write_text(json.dumps(dict(holder, host="another-host", pid=_dead_pid())))
    with pytest.raises(CheckpointLockedError, match="on another-host.*cannot tell from this host.*delete"):
        CheckpointDirLock(str(tmp_path), "run-b").acquire()
    (tmp_path / LOCK_NAME).write_text("{not json")
    with pytest.raises(CheckpointLockedError, match="unreadable lock file"):
        CheckpointDirLock(str(tmp_path), "run-b").acquire()


def test_a_live_runs_lock_from_another_pid_namespace_is_never_judged_by_a_pid_here(tmp_path: Path) -> None:
    """A run in a container beside this one shares the kernel (its boot id) and, with host networking, the host
    name, but numbers its processes in its own pid namespace: its pid means nothing here. A real holder, run under
    ``unshare --pid``: it is pid 1 there, and pid 1 here is another process (started at another time), so judged by
    that pid its live lock was taken over as a dead run's."""
    script = (f"import sys; from psflow.checkpoint.lock import CheckpointDirLock; "
              f"CheckpointDirLock({str(tmp_path)!r}, 'run-a').acquire(); print('held', flush=True); sys.stdin.read()")
    try:
        holder_process = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", script],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          cwd=str(Path(__file__).resolve().parents[3]))
    except FileNotFoundError:
        pytest.skip("no unshare here")
    try:
        assert holder_process.stdout is not None
        if holder_process.stdout.readline().strip() != b"held":
            holder_process.wait(timeout=60)
            assert holder_process.stderr is not None
            pytest.skip(f"cannot run a process in a new pid namespace here: {holder_process.stderr.read()[-300:]!r}")
        holder = json.loads((tmp_path / LOCK_NAME).read_text())
        assert holder["pid"] == 1 and holder["pid_ns"] != os.readlink("/proc/self/ns/pid"), holder
        assert holder_alive(holder) is None
        with pytest.raises(CheckpointLockedError, match=r"in use by run run-a \(pid 1 on .*cannot tell from this host"):
            CheckpointDirLock(str(tmp_path), "run-b").acquire()
        assert json.loads((tmp_path / LOCK_NAME).read_text()) == holder  # nothing written
    finally:
        assert holder_process.stdin is not None
        holder_process.stdin.close()
        holder_process.wait(timeout=60)


def test_every_save_confirms_the_lock(tmp_path: Path) -> None:
    client = _cluster()
    ours = CheckpointDirLock(str(tmp_path), "run-a")
    manager = CheckpointManager(str(tmp_path), lock=ours, max_failed_saves=0)
    manager.save(client)
    # Another live run took the directory (its lock removed ours by hand): our next save fails, loudly.
    (tmp_path / LOCK_NAME).unlink()
    CheckpointDirLock(str(tmp_path), "run-b").acquire()
    _step(client)
    with pytest.raises(CheckpointLockedError, match="in use by run run-b"):
        manager.save(client)
    assert manager.failed_in_a_row == 1 and checkpoint_status(client)["failed"] == 1
    assert [p.name for p in tmp_path.glob("ckpt-*")] == ["ckpt-000000000"]


# ---- lineage ------------------------------------------------------------------
def test_rotation_deletes_only_its_own_lineage_and_a_restore_continues_it(tmp_path: Path) -> None:
    a, b = _cluster("a"), _cluster("b")
    manager_a = CheckpointManager(str(tmp_path), max_to_keep=2, run_id="run-a")
    manager_b = CheckpointManager(str(tmp_path), max_to_keep=1, run_id="run-b")
    saved_a = []
    for _ in range(2):
        _step(a)
        saved_a.append(manager_a.save(a).path)
    for _ in range(3):  # b keeps one checkpoint of its own, and deletes none of a's
        _step(b)
        _step(b)
        last_b = manager_b.save(b).path
    names = sorted(p.name for p in tmp_path.glob("ckpt-*"))
    assert names == sorted([Path(p).name for p in saved_a] + [Path(last_b).name]), names
    assert {read_manifest(p).lineage for p in saved_a} == {"run-a"} and read_manifest(last_b).lineage == "run-b"
    # A cluster restored from a's checkpoint continues a's lineage: its rotation deletes a's older one.
    c = _cluster("c")
    restore(c, saved_a[-1])
    assert checkpoint_status(c)["lineage"] == "run-a"
    for _ in range(2):
        _step(c)
        _step(c)
        _step(c)
        saved_c = CheckpointManager(str(tmp_path), max_to_keep=2, run_id="run-c").save(c).path
    assert read_manifest(saved_c).lineage == "run-a"
    names = sorted(p.name for p in tmp_path.glob("ckpt-*"))
    assert Path(saved_a[0]).name not in names and Path(last_b).name in names and len(names) == 3, names


def test_a_save_killed_while_creating_its_directory_leaves_nothing_the_next_save_keeps(tmp_path: Path) -> None:
    """SIGKILL between mkdir and the writer file leaves an empty directory (or the writer's temp): the next save of
    any run removes it; a directory holding anything else that it cannot read is left alone."""
    client = _cluster()
    (tmp_path / "ckpt-000000007").mkdir(parents=True)
    (tmp_path / "ckpt-000000008").mkdir()
    (tmp_path / "ckpt-000000008" / "writer.json.tmp-4242").write_bytes(b'{"run_')
    (tmp_path / "ckpt-000000009").mkdir()
    (tmp_path / "ckpt-000000009" / "notes.txt").write_text("a user's file")
    _step(client)
    saved = CheckpointManager(str(tmp_path), run_id="run-b").save(client)
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == ["ckpt-000000001", "ckpt-000000009"]
    assert latest_checkpoint(str(tmp_path)) == saved.path
    assert (tmp_path / "ckpt-000000009" / "notes.txt").exists()


# ---- failed saves ------------------------------------------------------------
def test_failed_saves_are_counted_cleaned_up_and_the_limit_stops_the_run(tmp_path: Path) -> None:
    client = _cluster()

    def disk_full(phase: str) -> None:
        if phase == "shards_written":
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "manifest.json"))

    good = CheckpointManager(str(tmp_path), run_id="run-a").save(client)
    failing = CheckpointManager(str(tmp_path), run_id="run-a", fault=disk_full, max_failed_saves=3)
    for attempt in (1, 2):
        _step(client)
        with pytest.raises(CheckpointError, match="No space left on device"):
            failing.save(client)
        assert failing.failed_in_a_row == attempt
    _step(client)
    with pytest.raises(CheckpointSavesFailedError, match=r"3 checkpoint saves in a row .* failed \(--max-failed-saves 3\)"):
        failing.save(client)
    # No partial directory is left; the pointer still names the last good checkpoint.
    assert [p.name for p in tmp_path.glob("ckpt-*")] == [Path(good.path).name]
    assert latest_checkpoint(str(tmp_path)) == good.path
    status = checkpoint_status(client)
    assert (status["saved"], status["failed"], status["failed_in_a_row"]) == (1, 3, 3)
    assert [f["global_step"] for f in status["failures"]] == [1, 2, 3]
    # A completed save resets the count in a row (here and in the ledger).
    failing._fault = None
    failing.save(client)
    assert failing.failed_in_a_row == 0 and checkpoint_status(client)["failed_in_a_row"] == 0


# ---- the fenced pointer ------------------------------------------------------
def test_a_chief_paused_before_the_pointer_switch_cannot_point_at_a_deleted_checkpoint(tmp_path: Path) -> None:
    client = _cluster()
    successor = CheckpointManager(str(tmp_path), max_to_keep=1, run_id="run-a")
    first = successor.save(client, epoch=5, holder="old chief")
    _step(client)
    successor_saved = []

    def paused_here(phase: str) -> None:
        if phase == "fence_checked":  # the old chief pauses; a successor is elected, saves and rotates
            _step(client)
            successor_saved.append(successor.save(client, epoch=7, holder="new chief"))

    old = CheckpointManager(str(tmp_path), max_to_keep=1, run_id="run-a", fault=paused_here)
    with pytest.raises(CheckpointFencedError, match="written at epoch 7 .*new chief.*epoch 5 is older"):
        old.save(client, epoch=5, holder="old chief")
    (new,) = successor_saved
    assert latest_checkpoint(str(tmp_path)) == new.path and os.path.isdir(new.path)
    assert json.loads((tmp_path / "checkpoint").read_text())["epoch"] == 7
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == [Path(new.path).name]
    assert not os.path.exists(first.path)
    assert old.failed_in_a_row == 0  # fenced off is not a failed save


def test_a_chief_fenced_right_after_its_switch_puts_the_pointer_back(tmp_path: Path) -> None:
    client = _cluster()
    previous = CheckpointManager(str(tmp_path), run_id="run-a").save(client, epoch=5, holder="old chief")
    _step(client)

    def successor_elected(phase: str) -> None:
        if phase == "pointer_switched":  # a successor fences every ps task before the re-check
            for channel in client.channels.values():
                channel.call("Fence", {"token": 9, "holder": "new chief"})

    old = CheckpointManager(str(tmp_path), run_id="run-a", fault=successor_elected)
    with pytest.raises(CheckpointFencedError, match="epoch 5 refused"):
        old.save(client, epoch=5, holder="old chief")
    assert latest_checkpoint(str(tmp_path)) == previous.path
    assert json.loads((tmp_path / "checkpoint").read_text())["latest"] == Path(previous.path).name
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == [Path(previous.path).name]


def test_a_fence_re_check_that_cannot_reach_a_ps_task_says_the_checkpoint_is_current(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """ps task 1 stops answering once the pointer names the new checkpoint: the save is complete and current, and its
    warning says so. It read 'could not re-check the fence after making X current: checkpoint X not made current:
    ...', which contradicts itself."""
    from psflow.rpc.api import Unavailable

    client = _cluster()

    def unreachable(frame: object) -> object:
        raise Unavailable("/job:ps/task:1: connection refused")

    def ps_1_gone(phase: str) -> None:
        if phase == "pointer_switched":
            handlers = dict(client.channels[1]._handlers)  # type: ignore[attr-defined]
            handlers["Fence"] = unreachable
            client.channels[1] = InProcessChannel("/job:ps/task:1", handlers)

    with caplog.at_level(logging.WARNING, logger="psflow.checkpoint.save"):
        saved = CheckpointManager(str(tmp_path), run_id="run-a", fault=ps_1_gone).save(client, epoch=5, holder="c")
    assert latest_checkpoint(str(tmp_path)) == saved.path
    (line,) = [r.getMessage() for r in caplog.records if "fence" in r.getMessage()]
    assert "not made current" not in line, line
    assert f"checkpoint {saved.path} is current" in line and "/job:ps/task:1" in line, line


def test_a_successor_saving_the_same_step_never_shares_its_directory_with_the_fenced_chief(tmp_path: Path) -> None:
    """Issue 28: two lease holders saved the run's final step at once (the old chief's lease lived on in its own view
    after ps task 0, the lease table, restarted and elected another worker). The successor deleted the old chief's
    unfinished ckpt-N as a crashed save's leftover and made ckpt-N again; the old chief then wrote its manifest into
    it, and its failure removed it: the run ended with the initial checkpoint as its newest."""
    client = _cluster()
    CheckpointManager(str(tmp_path), run_id="run-a").save(client, epoch=5, holder="old chief")
    _step(client)
    successor = CheckpointManager(str(tmp_path), run_id="run-a")
    saved = []

    def successor_saves_meanwhile(phase: str) -> None:
        if phase == "shards_written":  # the old chief's shards are written, its manifest not yet
            saved.append(successor.save(client, epoch=7, holder="new chief", final=True))

    old = CheckpointManager(str(tmp_path), run_id="run-a", fault=successor_saves_meanwhile)
    with pytest.raises(CheckpointError):
        old.save(client, epoch=5, holder="old chief", final=True)
    (new,) = saved
    assert latest_checkpoint(str(tmp_path)) == new.path and os.path.isdir(new.path)
    manifest = read_manifest(new.path)
    assert manifest.final and manifest.run is not None and manifest.run["holder"] == "new chief", manifest.run
    for shard in manifest.shards:  # the successor's own shard files, as its manifest describes them
        data = (Path(new.path) / shard["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == shard["sha256"], shard["file"]


def test_a_pointer_to_a_missing_checkpoint_falls_back_to_the_newest_listed(tmp_path: Path) -> None:
    client = _cluster()
    manager = CheckpointManager(str(tmp_path), max_to_keep=3, run_id="run-a")
    paths = []
    for _ in range(3):
        _step(client)
        paths.append(manager.save(client).path)
    pointer = json.loads((tmp_path / "checkpoint").read_text())
    (tmp_path / "checkpoint").write_text(json.dumps(dict(pointer, latest="ckpt-000000099")))
    assert latest_checkpoint(str(tmp_path)) == paths[2]
    os.rename(paths[2], str(tmp_path / "elsewhere"))  # the newest listed is gone too
    assert latest_checkpoint(str(tmp_path)) == paths[1]


# ---- what a restore may take ------------------------------------------------
def _manifest(model: dict[str, object] | None) -> Manifest:
    return Manifest(global_step=3, variables={}, shards=[], model=model, psflow_version="0.9")


def _record(name: str = "logistic", seed: int = 0, num_features: int = 124) -> dict[str, object]:
    return {"name": name, "config": {"features": {}, "num_features": num_features, "partitions": 1, "embedding_dim": 8,
                                     "params": {}, "seed": seed},
            "data": {"format": "libsvm", "schema": None, "num_features": num_features}}


def test_a_checkpoint_of_another_model_is_refused_and_another_seed_warned() -> None:
    assert check_restorable("ck", _manifest(_record()), _record()) == []
    with pytest.raises(CheckpointError, match=r"another model: --model 'logistic' \(this run: 'fm'\); --num-features "
                                              r"124 \(this run: 125\)"):
        check_restorable("ck", _manifest(_record()), _record("fm", num_features=125))
    (warning,) = check_restorable("ck", _manifest(_record(seed=1)), _record(seed=2))
    assert "--seed 1; this run has --seed 2: resuming it" in warning
    (warning,) = check_restorable("ck", _manifest(None), _record())
    assert "does not record the model" in warning
    # partitions may differ: a checkpoint restores onto any partitioning
    other = _record()
    other["config"] = dict(other["config"], partitions=4)  # type: ignore[call-overload]
    assert check_restorable("ck", _manifest(_record()), other) == []


def test_marking_the_final_checkpoint_removes_a_crashed_saves_leftover(tmp_path: Path) -> None:
    """A run resumed after its predecessor was killed mid-save, with nothing left to train, only marks the newest
    checkpoint final: the killed save's directory (its writer file, no manifest) was left behind, since only a save
    removed such leftovers."""
    client = _cluster()
    manager = CheckpointManager(str(tmp_path), run_id="run-a")
    saved = manager.save(client)
    leftover = tmp_path / "ckpt-000000999"
    leftover.mkdir()
    (leftover / "writer.json").write_text((Path(saved.path) / "writer.json").read_text())
    other = tmp_path / "ckpt-000000998"  # another lineage's: never touched
    other.mkdir()
    (other / "writer.json").write_text(json.dumps({"run_id": "run-b", "lineage": "elsewhere"}))
    resumed = CheckpointManager(str(tmp_path), run_id="run-a")
    resumed.mark_final(saved.path)
    assert read_manifest(saved.path).final
    assert not leftover.exists() and other.exists()
    resumed.mark_final(saved.path)  # idempotent
    assert os.path.isdir(saved.path) and latest_checkpoint(str(tmp_path)) == saved.path
