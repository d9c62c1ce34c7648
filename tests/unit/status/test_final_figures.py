"""The final snapshot a run's end is reported from (issue 25, items 5 and 6): per-run counts after a resume,
the last step's loss, and a checkpoint ledger that survives a restart of the ps task holding it."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import pytest
from support import wait_until

from psflow.checkpoint.ledger import SaveStatusWatcher
from psflow.status.final_snapshot import Resumed, final_snapshot, resumed_from

LIMIT = 60.0  # safety net, seconds


def ps0(**stats: object) -> dict[str, object]:
    return {"task": "/job:ps/task:0", "global_step": 900, "examples": 100_000, "loss_ema": 0.35, "last_loss": 0.3312,
            **stats}


def test_after_a_resume_the_count_and_rate_are_this_runs_and_the_history_stays_the_models() -> None:
    resumed = Resumed("/c/ckpt-000000600", 600, 60_000)
    s = final_snapshot(phase="finished", ps_stats=[ps0(), {"task": "/job:ps/task:1", "global_step": None}],
                       wall_seconds=10.0, resumed=resumed)
    assert (s["examples"], s["examples_at_start"], s["examples_this_run"]) == (100_000, 60_000, 40_000)
    assert s["examples_per_sec"] == pytest.approx(4_000.0)  # 40,000 in 10 s: not the model's 100,000
    assert s["resumed_from"] == {"path": "/c/ckpt-000000600", "global_step": 600, "examples": 60_000}
    assert (s["global_step"], s["loss"], s["last_step_loss"]) == (900, 0.35, 0.3312)
    fresh = final_snapshot(phase="finished", ps_stats=[ps0()], wall_seconds=10.0, rate_seconds=8.0)
    assert (fresh["examples_this_run"], fresh["examples_per_sec"], fresh["resumed_from"]) == (100_000, 12_500.0, None)


def test_a_run_no_ps_task_answered_has_none_not_zero_and_a_phase_is_checked() -> None:
    s = final_snapshot(phase="interrupted", ps_stats=[], wall_seconds=3.0, extra={"global_step": 5, "interrupted": "SIGTERM"})
    assert s["global_step"] is None and s["examples"] is None and s["examples_per_sec"] is None
    assert s["interrupted"] == "SIGTERM"  # extra fields kept, shared figures never replaced by them
    with pytest.raises(ValueError, match="phase 'done'"):
        final_snapshot(phase="done", ps_stats=[], wall_seconds=0.0)


def test_the_ledger_seen_over_a_restart_of_its_task_keeps_counts_and_the_newest_checkpoint() -> None:
    """The issue's repro of item 5: after ps task 0 restarted, its ledger said 3 saves where the run had made 7,
    and status.json took the restarted ledger's figures. The watcher's view goes on over the restart."""
    watcher = SaveStatusWatcher(max_failed_saves=3)
    assert watcher.update({"saved": 4, "failed": 0, "last_saved_step": 400, "last_saved_path": "/c/ckpt-000000400"}) == []
    watcher.update({"saved": 0, "failed": 0, "last_saved_step": None, "last_saved_path": None})  # ps 0 restarted
    assert watcher.ledger()["last_saved_path"] == "/c/ckpt-000000400"  # a fresh ledger knows none yet
    lines = watcher.update({"saved": 3, "failed": 1, "failed_in_a_row": 0, "last_saved_step": 512,
                            "last_saved_path": "/c/ckpt-000000512",
                            "failures": [{"seq": 1, "global_step": 450, "writer": "w0", "error": "disk full"}]})
    assert any("checkpoint at global_step 450 FAILED" in line for line in lines)
    assert watcher.ledger() == {"saved": 7, "failed": 1, "failed_in_a_row": 0, "last_saved_step": 512,
                                "last_saved_path": "/c/ckpt-000000512"}
    s = final_snapshot(phase="finished", ps_stats=[ps0()], wall_seconds=1.0, checkpoints=watcher.ledger())
    assert s["checkpoints"] == {**watcher.ledger(), "last_saved_by_this_run": True}
    assert (s["checkpoints_saved"], s["checkpoints_failed"]) == (7, 1)


def test_a_run_that_saved_nothing_names_the_checkpoint_it_restored_as_the_newest() -> None:
    """Resumed with nothing left to train (or stopped before its first save): the ledger knows no checkpoint,
    the directory holds the one restored; a fresh run that saved none has none."""
    nothing = {"saved": 0, "failed": 1, "failed_in_a_row": 1, "last_saved_step": None, "last_saved_path": None}
    resumed = Resumed("/c/ckpt-000000600", 600, 60_000)
    s = final_snapshot(phase="interrupted", ps_stats=[ps0()], wall_seconds=1.0, resumed=resumed, checkpoints=nothing)
    assert s["checkpoints"] == {**nothing, "last_saved_step": 600, "last_saved_path": "/c/ckpt-000000600",
                                "last_saved_by_this_run": False}
    assert (s["checkpoints_saved"], s["checkpoints_failed"]) == (0, 1)  # this run's saves: none restored counted
    fresh = final_snapshot(phase="interrupted", ps_stats=[ps0()], wall_seconds=1.0, checkpoints=nothing)
    assert fresh["checkpoints"] == {**nothing, "last_saved_by_this_run": None}
    saved = {**nothing, "saved": 1, "last_saved_step": 700, "last_saved_path": "/c/ckpt-000000700"}
    after = final_snapshot(phase="finished", ps_stats=[ps0()], wall_seconds=1.0, resumed=resumed, checkpoints=saved)
    assert after["checkpoints"] == {**saved, "last_saved_by_this_run": True}


def test_a_run_whose_ledger_counted_no_save_names_the_directorys_newest_at_the_end() -> None:
    """The ledger knows no save, the directory's newest at the end (``newest``) is the restored one (False) or one
    this run wrote that the ledger never counted (True: its chief died as the save completed)."""
    nothing = {"saved": 0, "failed": 0, "failed_in_a_row": 0, "last_saved_step": None, "last_saved_path": None}
    resumed = Resumed("/c/ckpt-000000600", 600, 60_000)
    for newest, mine in ((resumed, False), (Resumed("/c/ckpt-000000640", 640, 64_000), True)):
        s = final_snapshot(phase="failed", ps_stats=[ps0()], wall_seconds=1.0, resumed=resumed, checkpoints=nothing,
                           newest=newest)
        assert s["checkpoints"] == {**nothing, "last_saved_step": newest.global_step, "last_saved_path": newest.path,
                                    "last_saved_by_this_run": mine}


def test_resumed_from_is_none_without_a_directory_or_checkpoint(tmp_path: Path) -> None:
    assert resumed_from(None) is None
    assert resumed_from(str(tmp_path)) is None


def test_a_newest_read_that_fails_raises_its_error_not_a_stopped_store_warning(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The run's end reads the newest checkpoint in a daemon thread, bounded (a store that stopped answering never
    ends the read); a read that failed at once (an error resumed_from does not take as 'no checkpoint') was logged
    as 'not read within 15 s (the store stopped answering?)' and its traceback printed by the thread: it is
    raised to the caller, as it was before the read had a bound."""
    from psflow.status import final_snapshot as module

    def broken(checkpoint_dir: str | None) -> Resumed | None:
        raise ValueError(f"a broken read of {checkpoint_dir}")

    monkeypatch.setattr(module, "resumed_from", broken)
    with pytest.raises(ValueError, match="a broken read of"):
        module.newest_if_unnamed({"saved": 0, "last_saved_path": None}, str(tmp_path), timeout=60.0)
    assert "not read within" not in caplog.text


class _Cut(Exception):
    pass


def _main_thread_waits_in(function: str) -> bool:
    """Whether the main thread is asleep (in threading's Condition.wait: on its lock, a C call) within ``function``."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    if frame is None or frame.f_code.co_name != "wait" or frame.f_code.co_filename != threading.__file__:
        return False
    while frame is not None and frame.f_code.co_name != function:
        frame = frame.f_back
    return frame is not None


def test_a_stop_signal_handed_to_another_thread_cuts_the_wait_for_a_newest_read_that_hangs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The run's end waits up to 15 s for the newest checkpoint's read (a store that stopped answering never ends
    it). The launcher's stop raises from a handler that runs on the main thread when it next runs Python code: a
    signal the kernel handed to another thread was handled only when that one wait ended. Made of short waits
    (psflow.waits.wait_woken), it is cut at once; the read here hangs to the safety net, which fails the test."""
    from psflow.status import final_snapshot as module

    hang_over, hang_ended = threading.Event(), threading.Event()

    def hangs(checkpoint_dir: str | None) -> Resumed | None:
        hang_over.wait(LIMIT)  # the safety net
        hang_ended.set()
        return None

    def cut(signum: int, frame: object) -> None:
        raise _Cut

    def other_thread() -> None:
        wait_until(lambda: _main_thread_waits_in("newest_if_unnamed"), "the main thread waiting for the read",
                   limit=LIMIT)
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)

    monkeypatch.setattr(module, "resumed_from", hangs)
    previous = signal.signal(signal.SIGUSR1, cut)
    thread = threading.Thread(target=other_thread, name="signalled", daemon=True)
    try:
        with pytest.raises(_Cut):
            thread.start()
            module.newest_if_unnamed({"saved": 0, "last_saved_path": None}, str(tmp_path), timeout=LIMIT)
        assert not hang_ended.is_set()  # cut by the handler, not after the read's end
    finally:
        hang_over.set()
        thread.join(LIMIT)
        signal.signal(signal.SIGUSR1, previous)
