"""Several workers' summary hooks over one in-process cluster, each behind LeaderOnlyHook and writing while the test
says it holds the chief lease: the shared set-up of the summary take-over tests (tests/unit/train/test_summary_*,
test_lease_won_again_between_calls.py), and reading back what TensorBoard draws (:func:`loss_steps`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from psflow.coord import Lease
from psflow.train.hooks import SummarySaverHook
from psflow.train.leader_hooks import LeaderOnlyHook
from psflow.train.summary import SummaryWriter


def lease_of(name: str) -> Lease:
    """The chief lease as ``name`` holds it (epoch 7, never expiring)."""
    return Lease("chief", name, f"{name}#1", 7, 10.0, float("inf"))


def worker_session(client: Any, checkpoint_dir: str | None) -> Any:
    """What a summary hook reads of a worker's session (its client, the step it knows, the checkpoint directory)."""
    return SimpleNamespace(client=client, join_result=None, global_step=0, checkpoint_dir=checkpoint_dir)


def summary_holders(client: Any, logdir: Path, names: Iterable[str], leadership: Callable[[str], Any], *,
                    checkpoint_dir: str | None = None) -> tuple[dict[str, SummaryWriter], dict[str, Any],
                                                                  dict[str, Any]]:
    """Each of ``names``' writer (in ``logdir``), summary hook (a point a step, behind LeaderOnlyHook with
    ``leadership(name)``) and session; no hook's session created yet (``after_create_session``: the test's)."""
    names = list(names)
    writers = {name: SummaryWriter(str(logdir)) for name in names}
    hooks = {name: LeaderOnlyHook(SummarySaverHook(writers[name], save_steps=1), leadership(name)) for name in names}
    sessions = {name: worker_session(client, checkpoint_dir) for name in names}
    return writers, hooks, sessions


def loss_steps(logdir: Path) -> list[int]:
    """The steps of ``train/loss`` as TensorBoard's own EventAccumulator reads ``logdir`` (skipped without it)."""
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = accumulator.EventAccumulator(str(logdir))
    acc.Reload()
    return [e.step for e in acc.Scalars("train/loss")]
