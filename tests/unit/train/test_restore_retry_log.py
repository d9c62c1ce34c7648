"""While the chief's restore keeps failing (here: the checkpoint directory cannot be listed, as an object store's
outage makes it), ClusterRecovery.wait retries at every poll (up to 4 a second) until its timeout. It logged
"restore failed: ...; retrying" at each: thousands of identical lines over a long wait. Now the first failure is
logged, then one line at most every RESTORE_RETRY_LOG_EVERY s saying how many failed since, and the count that
no line told yet when the wait gives up."""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from pathlib import Path

import pytest
from two_ps_in_process import SGD, restart_ps, train_a_step, two_ps_cluster

from psflow.checkpoint.pointer import CheckpointListingError
from psflow.checkpoint.save import CheckpointManager
from psflow.coord import Lease
from psflow.ps.protocol import StatsReply
from psflow.train import recovery as recovery_module
from psflow.train.chief import join_cluster
from psflow.train.recovery import ClusterRecovery, RecoveryError

pytestmark = pytest.mark.timeout(60)


def _lease() -> Lease:
    return Lease("chief", "/job:worker/task:0", "/job:worker/task:0#1", 7, 10.0, time.monotonic() + 60.0)


def _failing_recovery(tmp_path: Path) -> tuple[ClusterRecovery, list[int]]:
    client, services = two_ps_cluster()
    join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path))
    CheckpointManager(str(tmp_path)).save(client)
    train_a_step(client)
    restart_ps(client, services, 1)  # came back empty: the chief restores
    recovery = ClusterRecovery(client, SGD, checkpoint_dir=str(tmp_path), leader=_lease, timeout=1.5)
    tries: list[int] = []

    def unlisted(lease: Lease | None) -> str | None:
        tries.append(1)
        raise CheckpointListingError(f"checkpoint directory {tmp_path}: not listed: service unavailable")

    recovery._checkpoint = unlisted  # type: ignore[method-assign]
    return recovery, tries


def _failure_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "psflow.recovery" and "restore failed" in r.getMessage()]


def test_a_restore_failing_at_every_poll_is_logged_once_then_summed_up(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    recovery, tries = _failing_recovery(tmp_path)
    with caplog.at_level(logging.INFO, logger="psflow.recovery"), pytest.raises(RecoveryError):
        recovery.wait()
    assert len(tries) >= 3, tries  # retried at every poll
    lines = _failure_lines(caplog)
    assert len(lines) == 2, lines  # the first, and what no line told when the wait gave up
    assert lines[0] == (f"/job:worker/task:0: restore failed: checkpoint directory {tmp_path}: not listed: "
                        "service unavailable; retrying")
    assert re.fullmatch(rf"/job:worker/task:0: restore failed {len(tries) - 1} more times? in \d+ s \({len(tries)} "
                        r"in all; the last: checkpoint directory .*: not listed: service unavailable\)", lines[1]), lines[1]


def test_each_summary_counts_the_failures_since_the_line_before(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recovery_module, "RESTORE_RETRY_LOG_EVERY", 0.0)  # a line at every failure
    recovery, tries = _failing_recovery(tmp_path)
    with caplog.at_level(logging.INFO, logger="psflow.recovery"), pytest.raises(RecoveryError):
        recovery.wait()
    lines = _failure_lines(caplog)
    assert len(lines) == len(tries)
    counts = [int(m.group(1)) for m in (re.search(r"restore failed (\d+) more time", line) for line in lines[1:]) if m]
    assert counts == [1] * (len(tries) - 1), lines
    assert lines[-1].endswith(f"({len(tries)} in all; the last: checkpoint directory {tmp_path}: not listed: "
                              "service unavailable); retrying"), lines[-1]


def test_the_failures_before_a_restore_that_worked_are_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    recovery, tries = _failing_recovery(tmp_path)
    unlisted = recovery._checkpoint
    real = ClusterRecovery._checkpoint.__get__(recovery)

    def fails_three_times(lease: Lease | None) -> str | None:
        return unlisted(lease) if len(tries) < 3 else real(lease)

    recovery._checkpoint = fails_three_times  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="psflow.recovery"):
        assert recovery.wait()[0]
    lines = _failure_lines(caplog)
    assert len(lines) == 2, lines
    assert re.fullmatch(r"/job:worker/task:0: restore failed 2 more times in \d+ s \(3 in all; the last: .*\)", lines[1])


def test_the_failures_before_the_cluster_came_back_as_it_was_are_counted(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """The wait's third end: every task ready again at this worker's generation (each came back with its state, as a
    replicated shard's promoted backup does), no restore needed. The failures since the first line are told then too."""
    recovery, tries = _failing_recovery(tmp_path)
    recovery.generation = 0  # the generation this worker trains in: the cluster's before the loss
    real = recovery._states

    def back_as_it_was() -> dict[int, StatsReply | None]:
        states = real()
        if len(tries) < 3:
            return states
        return {t: dataclasses.replace(s, ready=True) if s is not None else None for t, s in states.items()}

    recovery._states = back_as_it_was  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="psflow.recovery"):
        assert recovery.wait() == (False, None)
    lines = _failure_lines(caplog)
    assert len(lines) == 2, lines
    assert re.fullmatch(r"/job:worker/task:0: restore failed 2 more times in \d+ s \(3 in all; the last: .*\)", lines[1])
