"""The evaluator beside a run resumed from a finished run's final checkpoint: it never ends on that checkpoint
while a newer one is in the directory.

Real processes: ``psflow train`` trains and resumes; the evaluator runs here, in a thread.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support import A9A, A9A_T, REPO, wait_until
from test_evaluator import _kill, _trained

import psflow.launch.evaluator as evaluator_module
from psflow.launch.evaluator import Evaluation, run_evaluator
from psflow.train.config import TrainConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


def test_an_evaluator_reading_the_old_final_checkpoint_while_a_resumed_run_comes_and_ends_evaluates_its_final_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The evaluator is still reading the finished run's final checkpoint (ckpt-000000020) when a run resumed
    from it (--max-steps 60) writes ckpt-000000040 and ckpt-000000060 (final) and releases the directory's lock.
    It ended on ckpt-000000020 (no lock any more: 'no run resumed from it is going') and never evaluated the
    resumed run's final checkpoint, as test_evaluator's resumed-run test did once on a loaded machine. The
    evaluation of the first checkpoint is held until the resumed run exited: every order is the same."""
    ckpt = _trained(tmp_path)
    evaluating, resumed_ended = threading.Event(), threading.Event()
    evaluate = evaluator_module._evaluate
    held: list[str] = []

    def held_first(path: str, *args: object, **kwargs: object) -> Evaluation:
        if not held:  # the first evaluation: the old final checkpoint, read until the resumed run exited
            held.append(path)
            evaluating.set()
            assert resumed_ended.wait(timeout=300), "the resumed run did not end"
        return evaluate(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(evaluator_module, "_evaluate", held_first)
    config = TrainConfig.flat(train=(str(A9A),), eval=(str(A9A_T),), num_features=124, checkpoint_dir=str(ckpt))
    stop = threading.Event()
    result: list[list[tuple[int, bool]]] = []
    thread = threading.Thread(target=lambda: result.append(
        [(e.global_step, e.final) for e in run_evaluator(config, poll_secs=0.05, stop=stop)]))
    resumed: subprocess.Popen[bytes] | None = None
    try:
        thread.start()
        wait_until(evaluating.is_set, "the evaluator began reading the old final checkpoint")
        assert Path(held[0]).name == "ckpt-000000020", held
        resumed = subprocess.Popen(
            [sys.executable, "-m", "psflow", "train", "--train", str(A9A), "--num-features", "124", "--ps", "1",
             "--workers", "1", "--quiet", "--max-steps", "60", "--save-checkpoints-steps", "20", "--max-to-keep", "100",
             "--checkpoint-dir", str(ckpt), "--output", str(tmp_path / "resumed")],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "resumed.err", "wb"), stdin=subprocess.DEVNULL,
            cwd=str(REPO), start_new_session=True)
        assert resumed.wait(timeout=240) == 0, (tmp_path / "resumed.err").read_text()[-3000:]
        assert not (ckpt / "checkpoint.lock").exists()  # the resumed run released the directory
        resumed_ended.set()
        thread.join(timeout=120)
        ended_by_itself = not thread.is_alive()
    finally:
        resumed_ended.set()
        stop.set()
        thread.join(timeout=30)
        if resumed is not None:
            _kill([resumed])
    assert ended_by_itself and result, result
    assert result[0][0] == (20, True) and result[0][-1] == (60, True), result
