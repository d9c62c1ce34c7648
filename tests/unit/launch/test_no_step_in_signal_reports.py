"""Reports of a signal where no global_step was read say so (run_end.at_global_step's words), never
'global_step None': an --in-process run interrupted before its end was taken (psflow.cli.train), and the line a
process held to its exit tells a signal after an end with no global_step (launcher_signals)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from psflow.launch import launcher_signals
from psflow.launch.launcher_signals import LaunchInterrupted
from psflow.train.config import TrainConfig
from psflow.train.faults import FaultInjection

NO_STEP = "with no global_step read (no ps task had answered one)"


def test_an_in_process_run_interrupted_before_its_end_says_no_global_step_was_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from psflow.cli.train import _in_process
    from psflow.launch import in_process

    def interrupted(*_args: Any, **_kwargs: Any) -> dict[str, Any]:
        raise LaunchInterrupted(signal.SIGTERM)  # before any end: ending.final is None

    monkeypatch.setattr(in_process, "run_in_process", interrupted)
    train = tmp_path / "train.libsvm"
    train.write_text("1 1:1\n")
    config = TrainConfig.flat(train=(str(train),), format="libsvm", num_features=4)
    with pytest.raises(LaunchInterrupted) as raised:
        _in_process(config, str(tmp_path / "out"), FaultInjection())
    assert raised.value.report.startswith(f"interrupted by SIGTERM {NO_STEP} after 0.0 s\n"), raised.value.report
    assert "None" not in raised.value.report


def test_the_held_line_of_an_end_with_no_global_step_says_so() -> None:
    held = launcher_signals._Held()
    held.end({"phase": "interrupted", "global_step": None}, None)
    assert held.line.startswith(f"arrived after the run had been interrupted {NO_STEP}: its end stands"), held.line
    held.end({"phase": "finished", "global_step": 9}, None)
    assert held.line.startswith("arrived after the run had finished at global_step 9: its end stands"), held.line
