"""Synchronous aggregation and bounded staleness, with threads standing in for workers."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np
import pytest

from psflow.optim import OptimizerSpec
from psflow.ps.global_step import GlobalStep
from psflow.ps.optimizers import make_optimizer
from psflow.ps.staleness import StalenessClock
from psflow.ps.store import ParameterStore, PartitionState
from psflow.ps.sync import Contribution, SyncAggregator, SyncConfig, SyncResult
from psflow.rpc.api import InvalidRequest, PreconditionFailed

W = [f"/job:worker/task:{i}" for i in range(4)]


def setup(replicas: int, total: int, **kw: Any) -> tuple[SyncAggregator, PartitionState, GlobalStep]:
    store = ParameterStore()
    part = store.create("w", 0, (3, 1), 0, 3, "float32", {"name": "zeros"},
                        make_optimizer(OptimizerSpec("sgd", {"learning_rate": 1.0})))
    step = GlobalStep()
    cfg = SyncConfig(mode="sync", replicas_to_aggregate=replicas, total_num_replicas=total, **kw)
    return SyncAggregator(cfg, store, task_name="/job:ps/task:0", advance=step.increment,
                          current=lambda: step.value), part, step


def sparse(part: PartitionState, worker: str, rows: list[int], values: list[float]) -> Contribution:
    return Contribution(worker, [(part, np.array(rows, np.int64), np.array(values, np.float32)[:, None])])


def in_thread(fn: Any, *args: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn(*args)
        except Exception as e:  # noqa: BLE001
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_first_gradient_waits_second_completes_the_averaged_step() -> None:
    agg, part, step = setup(2, 2)
    t, out = in_thread(agg.contribute, 0, sparse(part, W[0], [0, 1], [2.0, 4.0]))
    time.sleep(0.1)
    assert t.is_alive() and step.value == 0  # waiting for the second replica
    second = agg.contribute(0, sparse(part, W[1], [1], [6.0]))
    t.join(5)
    assert second == SyncResult(1, accepted=True, completed=True)
    assert out["result"] == SyncResult(1, accepted=True, completed=False)
    # averaged over 2 replicas for every row: row0 2/2, row1 (4+6)/2, row2 untouched
    np.testing.assert_allclose(part.value[:, 0], [-1.0, -5.0, 0.0])


def test_per_row_averaging_matches_sparse_conditional_accumulator() -> None:
    agg, part, _ = setup(2, 2, averaging="per_row")
    t, _ = in_thread(agg.contribute, 0, sparse(part, W[0], [0, 1], [1.0, 2.0]))
    agg.contribute(0, sparse(part, W[1], [1, 2], [4.0, 6.0]))
    t.join(5)
    np.testing.assert_allclose(-part.value[:, 0], [1.0, 3.0, 6.0])  # TF 2.21: [1, 3, 6]


def test_sparse_sum_sums_rows_and_averages_dense() -> None:
    agg, part, _ = setup(2, 2, averaging="sparse_sum")
    t, _ = in_thread(agg.contribute, 0, sparse(part, W[0], [0, 1], [1.0, 2.0]))
    agg.contribute(0, sparse(part, W[1], [1, 2], [4.0, 6.0]))
    t.join(5)
    np.testing.assert_allclose(-part.value[:, 0], [1.0, 6.0, 6.0])
    agg, part, _ = setup(2, 2, averaging="sparse_sum")
    dense = [Contribution(w, [(part, None, np.full((3, 1), v, np.float32))]) for w, v in ((W[0], 2.0), (W[1], 4.0))]
    t, _ = in_thread(agg.contribute, 0, dense[0])
    agg.contribute(0, dense[1])
    t.join(5)
    np.testing.assert_allclose(-part.value[:, 0], [3.0, 3.0, 3.0])  # dense gradients are still averaged


def test_stale_gradients_dropped_and_counted_backups_absorb() -> None:
    agg, part, step = setup(2, 3)
    t, _ = in_thread(agg.contribute, 0, sparse(part, W[0], [0], [1.0]))
    agg.contribute(0, sparse(part, W[1], [0], [1.0]))
    t.join(5)
    late = agg.contribute(0, sparse(part, W[2], [0], [100.0]))  # the backup, one step late
    assert late == SyncResult(1, accepted=False, completed=False)
    assert agg.stats()["stale_dropped"] == 1 and step.value == 1
    np.testing.assert_allclose(part.value[0, 0], -1.0)


def test_tag_far_ahead_refused_and_a_second_gradient_of_a_worker_dropped_after_the_step() -> None:
    agg, part, step = setup(2, 2)
    with pytest.raises(InvalidRequest, match="ahead of step 0"):
        agg.contribute(5, sparse(part, W[0], [0], [1.0]))
    t, out = in_thread(agg.contribute, 0, sparse(part, W[0], [0], [1.0]))
    time.sleep(0.05)
    # W[0] killed after this push and restarted: its new process redoes the batch for step 0
    t2, out2 = in_thread(agg.contribute, 0, sparse(part, W[0], [0], [1.0]))
    time.sleep(0.05)
    assert t2.is_alive()  # waits for the step like any contribution
    assert agg.contribute(0, sparse(part, W[1], [1], [2.0])) == SyncResult(1, accepted=True, completed=True)
    t.join(5)
    t2.join(5)
    assert out2["result"] == SyncResult(1, accepted=False, completed=False)  # dropped, not applied twice
    np.testing.assert_allclose(part.value[:, 0], [-0.5, -1.0, 0.0])
    assert agg.stale_dropped == 1 and step.value == 1


def test_a_worker_already_at_the_next_step_is_not_waited_for() -> None:
    """W[0]'s gradient for step 0 reached another ps task (which completed step 0) but not this
    one: it was killed between its pushes. Its restarted process pushes step 1 here."""
    agg, part, step = setup(2, 2)
    t, out = in_thread(agg.contribute, 0, sparse(part, W[1], [1], [2.0]))
    time.sleep(0.05)
    t2, out2 = in_thread(agg.contribute, 1, sparse(part, W[0], [0], [4.0]))
    t.join(5)
    assert out["result"] == SyncResult(1, accepted=True, completed=False)  # step 0 applied with W[1] alone, by W[0]
    np.testing.assert_allclose(part.value[:, 0], [0.0, -2.0, 0.0])  # 2.0 / 1 contribution
    assert t2.is_alive()  # now an ordinary contribution to step 1, waiting for W[1]
    assert agg.contribute(1, sparse(part, W[1], [2], [6.0])) == SyncResult(2, accepted=True, completed=True)
    t2.join(5)
    assert out2["result"] == SyncResult(2, accepted=True, completed=False)
    np.testing.assert_allclose(part.value[:, 0], [-2.0, -2.0, -3.0])


def test_with_backups_a_worker_ahead_waits_for_the_others_of_the_step() -> None:
    agg, part, step = setup(2, 3)
    t, out = in_thread(agg.contribute, 1, sparse(part, W[2], [2], [1.0]))  # the backup, one step ahead here
    time.sleep(0.05)
    assert t.is_alive() and step.value == 0  # still needs 2 of W[0], W[1] for step 0
    t0, _ = in_thread(agg.contribute, 0, sparse(part, W[0], [0], [2.0]))
    assert agg.contribute(0, sparse(part, W[1], [1], [4.0])).completed
    t0.join(5)
    time.sleep(0.05)
    assert step.value == 1 and t.is_alive()  # W[2] now waits in step 1
    t1, _ = in_thread(agg.contribute, 1, sparse(part, W[0], [0], [2.0]))
    t.join(5)
    t1.join(5)
    assert step.value == 2 and out["result"].accepted


def test_timeout_fail_names_missing_worker_and_stops_later_pushes() -> None:
    agg, part, step = setup(3, 3, timeout=0.3, on_timeout="fail")
    t, out = in_thread(agg.contribute, 0, sparse(part, W[0], [0], [1.0]))
    t2, out2 = in_thread(agg.contribute, 0, sparse(part, W[1], [0], [1.0]))
    t.join(5)
    t2.join(5)
    for o in (out, out2):
        assert isinstance(o["error"], PreconditionFailed)
        assert "with 2 of 3 gradients; missing: /job:worker/task:2" in str(o["error"])
    with pytest.raises(PreconditionFailed, match="timed out"):
        agg.contribute(0, sparse(part, W[2], [0], [1.0]))
    assert step.value == 0 and part.value[0, 0] == 0.0


def test_a_dead_worker_is_absorbed_by_a_backup_but_not_without_one() -> None:
    # 2 of 3 aggregated: worker 0 finished (left), worker 1 died; worker 2 alone completes the step after the timeout.
    agg, part, step = setup(2, 3, timeout=0.3, on_timeout="fail")
    agg.leave(W[0])
    assert agg.contribute(0, sparse(part, W[2], [0], [2.0])).step == 1
    assert step.value == 1
    # 3 of 3 (no backup): the same silence is an error naming the missing worker.
    agg, part, step = setup(3, 3, timeout=0.3, on_timeout="fail")
    agg.leave(W[0])
    with pytest.raises(PreconditionFailed, match="missing: /job:worker/task:1"):
        agg.contribute(0, sparse(part, W[2], [0], [2.0]))


def test_timeout_proceed_applies_what_arrived() -> None:
    agg, part, step = setup(2, 2, timeout=0.2, on_timeout="proceed")
    started = time.monotonic()
    result = agg.contribute(0, sparse(part, W[0], [0], [3.0]))
    assert time.monotonic() - started < 3
    assert result.step == 1 and step.value == 1
    np.testing.assert_allclose(part.value[0, 0], -3.0)  # averaged over the 1 that arrived


def test_a_leaving_worker_is_not_waited_for() -> None:
    agg, part, step = setup(2, 2)
    t, out = in_thread(agg.contribute, 0, sparse(part, W[0], [0], [2.0]))
    time.sleep(0.05)
    agg.leave(W[1])  # out of data
    t.join(5)
    assert out["result"].step == 1
    assert agg.contribute(1, sparse(part, W[0], [0], [2.0])).completed  # alone from now on
    assert step.value == 2


def test_ssp_holds_a_worker_at_most_k_ahead() -> None:
    clock = StalenessClock(SyncConfig(mode="ssp", total_num_replicas=2, staleness=2, timeout=10), task_name="ps0")
    assert clock.advance(W[0], 1).min_clock == 0
    assert clock.advance(W[0], 2).min_clock == 0
    t, out = in_thread(clock.advance, W[0], 3)  # 3 - 0 > 2: must wait
    time.sleep(0.1)
    assert t.is_alive()
    assert clock.advance(W[1], 1).min_clock == 1
    t.join(5)
    assert out["result"].min_clock == 1


def test_ssp_declares_a_silent_worker_lost() -> None:
    clock = StalenessClock(SyncConfig(mode="ssp", total_num_replicas=2, staleness=0, timeout=0.2,
                                      on_timeout="proceed"), task_name="ps0")
    started = time.monotonic()
    assert clock.advance(W[0], 1).min_clock == 1  # worker 1 never moves; dropped after the timeout
    assert time.monotonic() - started < 3
    assert clock.stats()["ssp_lost"] == [W[1]]


def test_sync_config_validation() -> None:
    with pytest.raises(ValueError, match="replicas_to_aggregate must be in 1..total_num_replicas \\(2\\)"):
        SyncConfig(mode="sync", replicas_to_aggregate=3, total_num_replicas=2)
    with pytest.raises(ValueError, match="unknown sync setting"):
        SyncConfig.from_json({"mode": "sync", "bogus": 1})
    assert SyncConfig.from_json(SyncConfig(mode="ssp", staleness=3).to_json()).staleness == 3


def test_abort_fails_the_waiting_push_and_reset_starts_over_at_the_restored_step() -> None:
    agg, part, step = setup(2, 2)
    agg.leave(W[1])  # finished before the ps death; rewound by the restore, it trains again
    agg.leave(W[1])
    assert agg.contribute(0, sparse(part, W[0], [0], [2.0])) == SyncResult(1, accepted=True, completed=True)
    agg.reset()  # W[1] is live again
    t, out = in_thread(agg.contribute, 1, sparse(part, W[0], [1], [4.0]))
    time.sleep(0.1)
    assert t.is_alive()  # waits for W[1] again
    agg.abort("/job:ps/task:0: the cluster is being restored")
    t.join(5)
    assert isinstance(out["error"], PreconditionFailed) and "being restored" in str(out["error"])
    with pytest.raises(PreconditionFailed, match="being restored"):
        agg.contribute(1, sparse(part, W[1], [1], [4.0]))
    before = part.value.copy()
    step.set(7)  # the restored global_step
    agg.reset()
    with pytest.raises(InvalidRequest, match="ahead of step 7"):
        agg.contribute(9, sparse(part, W[0], [1], [4.0]))
    t, out = in_thread(agg.contribute, 7, sparse(part, W[0], [1], [4.0]))
    done = agg.contribute(7, sparse(part, W[1], [2], [6.0]))
    t.join(5)
    assert done == SyncResult(8, accepted=True, completed=True)
    # the abandoned contribution (row 1, 4.0 before the abort) was not applied; only step 7's sums
    np.testing.assert_allclose(part.value[:, 0] - before[:, 0], [0.0, -2.0, -3.0])


@pytest.mark.parametrize("path", ["c", "numpy"])
@pytest.mark.parametrize("sorted_share", [0.5, 1.0], ids=["mixed", "as-clients-send"])
@pytest.mark.parametrize("width", [None, 1, 3, 8])
@pytest.mark.parametrize("most_pieces, row_space", [(4, 40), (30, 5)], ids=["few", "long-runs"])
def test_sum_rows_equals_add_at_bit_for_bit(width: int | None, most_pieces: int, row_space: int, sorted_share: float,
                                            path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The C merge (every piece sorted and distinct) and the numpy sums give np.add.at's float64 sums exactly."""
    from psflow.ps import sync_sums as sync_module
    from psflow.ps.sync_sums import sum_rows as _sum_rows

    if path == "c" and sync_module._KERNELS is None:
        if os.environ.get("PSFLOW_REQUIRE_NATIVE") == "1":
            pytest.fail("psflow.ps._kernels (merge_sum) is not built")
        pytest.skip("psflow.ps._kernels is not built")
    if path == "numpy":
        monkeypatch.setattr(sync_module, "_KERNELS", None)
    rng = np.random.default_rng(7)
    shape = () if width is None else (width,)
    for _ in range(30):
        pieces = []
        for _ in range(int(rng.integers(1, most_pieces))):
            k = int(rng.integers(1, 60))
            rows = rng.integers(0, row_space, k).astype(np.int64)  # unsorted, with repeats
            if rng.random() < sorted_share:
                rows = np.unique(rows)  # what clients send: sorted, unique
            # magnitudes 1e-8..1e8: float64 sums then round, so the order of the additions shows
            scale = 10.0 ** rng.integers(-8, 9, (rows.size,) + (1,) * len(shape))
            pieces.append((rows, (rng.standard_normal((rows.size, *shape)) * scale).astype(np.float32)))
        uniq, sums = _sum_rows(pieces)
        all_rows = np.concatenate([r for r, _ in pieces])
        want_rows, inverse = np.unique(all_rows, return_inverse=True)
        want = np.zeros((want_rows.size, *shape))
        np.add.at(want, inverse.reshape(-1), np.concatenate([v for _, v in pieces]).astype(np.float64))
        assert uniq.tobytes() == want_rows.tobytes()
        assert sums.dtype == np.float64 and sums.tobytes() == want.tobytes()


def test_stats_name_the_workers_the_step_waits_for() -> None:
    # The status page shows why a sync step is waiting: who contributed, who it still waits for, since when.
    agg, part, step = setup(2, 3)
    idle = agg.stats()
    assert idle["sync_contributed"] == [] and idle["sync_waiting_for"] == [] and idle["sync_waiting_seconds"] is None
    t, _ = in_thread(agg.contribute, 0, sparse(part, W[0], [0], [2.0]))
    deadline = time.monotonic() + 10
    while agg.stats()["sync_contributed"] != [W[0]] and time.monotonic() < deadline:
        time.sleep(0.01)
    waiting = agg.stats()
    assert waiting["sync_contributed"] == [W[0]]
    assert waiting["sync_waiting_for"] == [W[1], W[2]]  # any one of them completes the step (2 of 3)
    assert waiting["sync_waiting_seconds"] >= 0
    agg.leave(W[2])
    assert agg.stats()["sync_waiting_for"] == [W[1]]
    agg.contribute(0, sparse(part, W[1], [0], [2.0]))
    t.join(5)
    assert agg.stats()["sync_contributed"] == [] and step.value == 1


def test_merge_sum_kernel_checks_and_falls_back() -> None:
    """merge_sum: -1 (caller sums with numpy) for a piece that is not strictly increasing; ValueError for bad buffers."""
    from psflow.ps import sync_sums as sync_module

    kernels = sync_module._KERNELS
    if kernels is None:
        if os.environ.get("PSFLOW_REQUIRE_NATIVE") == "1":
            pytest.fail("psflow.ps._kernels (merge_sum) is not built")
        pytest.skip("psflow.ps._kernels is not built")
    rows = np.array([1, 4, 2, 4], np.int64)
    values = np.array([[1.0], [2.0], [3.0], [-0.5]], np.float32)
    out_rows, out_sums = np.empty(4, np.int64), np.empty((4, 1), np.float64)
    assert kernels.merge_sum(rows, values, np.array([0, 2, 4], np.int64), out_rows, out_sums, True) == 3
    assert out_rows[:3].tolist() == [1, 2, 4] and out_sums[:3, 0].tolist() == [1.0, 3.0, 1.5]
    assert kernels.merge_sum(rows, values, np.array([0, 4], np.int64), out_rows, out_sums, True) == -1
    for bounds, message in (([0, 3], "rise from 0 to n"), ([0, 3, 2, 4], "rise from 0 to n"), ([0], "at least two")):
        with pytest.raises(ValueError, match=message):
            kernels.merge_sum(rows, values, np.array(bounds, np.int64), out_rows, out_sums, True)
    with pytest.raises(ValueError, match="float64"):
        kernels.merge_sum(rows, values, np.array([0, 4], np.int64), out_rows, out_sums.astype(np.float32), True)
    with pytest.raises(ValueError, match="shaped like values"):
        kernels.merge_sum(rows, values, np.array([0, 4], np.int64), out_rows, out_sums[:3], True)
