"""A ps task's dynamic tables (issue #14): created at Register, read and updated by id, saved and loaded whole."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load as safetensors_load

from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.dynamic import DynamicTableError, share_spec, table_totals
from psflow.ps.protocol import LeaveRequest
from psflow.ps.service import ParameterService
from psflow.rpc.api import InvalidRequest, PreconditionFailed
from psflow.rpc.framing import Frame

ADAGRAD = OptimizerSpec("adagrad", {"learning_rate": 0.5})


def _service(num_ps: int = 2, **options: object) -> ParameterService:
    variables = VariableSet(replica_device_setter(num_ps))
    variables.get_variable("emb", (0, 2), dynamic=dict(options), initializer={"name": "constant", "value": 0.5})
    service = ParameterService(0, holds_global_step=True)
    meta = {"layout": [p.to_json() for p in variables.placements()], "optimizer": ADAGRAD.to_json(), "chief": True}
    assert service.register(Frame(meta, {}))[0]["created"]
    return service


def _pull(service: ParameterService, ids: np.ndarray, *, create: bool) -> np.ndarray:
    meta, arrays = service.pull(Frame({"vars": [["emb/part_0", "r"]], "create": create}, {"r": ids}))
    return arrays["emb/part_0"]


def test_share_specs_divide_the_capacity_and_refuse_bad_options_by_name() -> None:
    spec = share_spec("emb", 4, {"capacity_rows": 10, "capacity_bytes": 7001, "admit_after": 3}, optimizer=None,
                      initializer={"name": "zeros"}, num_shares=3)
    assert (spec.capacity_rows, spec.capacity_bytes, spec.admit_after, spec.dim) == (4, 2334, 3, 4)
    with pytest.raises(DynamicTableError, match=r"dynamic table 'emb': capacity_rows must be an int >= 1, got 0"):
        share_spec("emb", 4, {"capacity_rows": 0}, optimizer=None, initializer={"name": "zeros"}, num_shares=2)
    with pytest.raises(DynamicTableError, match=r"dynamic table 'emb': unknown options \['capacity'\]"):
        share_spec("emb", 4, {"capacity": 5}, optimizer=None, initializer={"name": "zeros"}, num_shares=2)


def test_register_refuses_a_bad_table_by_name_and_keeps_nothing() -> None:
    variables = VariableSet(replica_device_setter(1))
    variables.get_variable("emb", (0, 2), dynamic={"policy": "fifo"})
    service = ParameterService(0, holds_global_step=True)
    meta = {"layout": [p.to_json() for p in variables.placements()], "optimizer": ADAGRAD.to_json(), "chief": True}
    with pytest.raises(InvalidRequest, match=r"variable 'emb': dynamic table 'emb': policy must be one of"):
        service.register(Frame(meta, {}))
    assert not service.registered and service.store.keys() == []


def test_training_reads_create_rows_and_other_reads_do_not() -> None:
    service = _service(1)
    ids = np.array([7, -3, 7], dtype=np.int64)
    np.testing.assert_array_equal(_pull(service, ids, create=False), np.zeros((3, 2), np.float32))
    np.testing.assert_array_equal(_pull(service, ids, create=True), np.full((3, 2), 0.5, np.float32))
    totals = table_totals([service.get_stats(Frame({}, {}))[0]])
    assert totals["emb"]["rows"] == 2 and totals["emb"]["absent_reads"] == 3 and totals["emb"]["admitted"] == 2
    with pytest.raises(InvalidRequest, match=r"dynamic table 'emb' partition 0 is read by ids, never whole"):
        service.pull(Frame({"vars": [["emb/part_0", None]]}, {}))


def test_a_saved_share_loads_back_and_a_bad_snapshot_changes_nothing() -> None:
    service = _service(1, admit_after=1)
    _pull(service, np.array([1, 2, 3], dtype=np.int64), create=True)
    grads = np.ones((3, 2), np.float32)
    service.push(Frame({"grads": [["emb/part_0", "sparse"]], "step": True},
                       {"i/emb/part_0": np.array([1, 2, 3], dtype=np.int64), "g/emb/part_0": grads}))
    meta, arrays = service.handlers()["SaveShard"](Frame({"path": None}, {}))
    (part,) = meta["partitions"]
    assert part["rows"] == 3 and part["slots"] == ["accumulator"] and "ids" in part["dynamic"]
    tensors = safetensors_load(arrays["shard"].tobytes())
    np.testing.assert_array_equal(tensors["emb/part_0@ids"], [1, 2, 3])
    snapshot = {"ids": tensors["emb/part_0@ids"], "values": tensors["emb/part_0"],
                "slot/accumulator": tensors["emb/part_0:accumulator"], "last_step": tensors["emb/part_0@last_step"],
                "frequency": tensors["emb/part_0@frequency"], "step": tensors["emb/part_0@step"]}
    fresh = _service(1)
    load = fresh.handlers()["LoadShard"]
    bad = {f"d/emb/part_0/{k}": v for k, v in snapshot.items()}
    bad["d/emb/part_0/ids"] = np.array([3, 2, 1], dtype=np.int64)
    with pytest.raises(InvalidRequest, match=r"dynamic table 'emb': snapshot: ids must be strictly increasing"):
        load(Frame({"parts": ["emb/part_0"]}, bad))
    assert len(fresh.store.get("emb/part_0").table or []) == 0
    load(Frame({"parts": ["emb/part_0"]}, {f"d/emb/part_0/{k}": v for k, v in snapshot.items()}))
    np.testing.assert_array_equal(_pull(fresh, np.array([1, 2, 3], dtype=np.int64), create=False), tensors["emb/part_0"])


#: Stats fields that move with time or memory, not with what was applied.
_NOT_COUNTS = {"uptime", "cpu_seconds", "cpu_seconds_since_init", "read_seconds", "apply_seconds", "memory_bytes",
               "sync_waiting_seconds"}


def _counts(service: ParameterService) -> dict[str, Any]:
    """Every figure of the task's ``Stats`` (what metrics.json and /metrics report of it), flattened."""
    def flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            if isinstance(v, dict):
                out.update(flat(v, f"{prefix}{k}."))
            elif k not in _NOT_COUNTS:
                out[f"{prefix}{k}"] = v
        return out

    return flat(service.get_stats(Frame({}, {}))[0])


def _sync_or_async_service(sync: dict[str, object] | None) -> ParameterService:
    variables = VariableSet(replica_device_setter(1))
    variables.get_variable("emb", (0, 2), dynamic={}, initializer={"name": "constant", "value": 0.5})
    variables.get_variable("b", (2,), initializer={"name": "zeros"})
    service = ParameterService(0, holds_global_step=True)
    meta = {"layout": [p.to_json() for p in variables.placements()], "optimizer": ADAGRAD.to_json(), "chief": True,
            "sync": sync}
    assert service.register(Frame(meta, {}))[0]["created"]
    return service


def _push_pull(service: ParameterService, lookups: list[int], **changed: object) -> None:
    """A worker's PushPull: a gradient for ids 1 and 2 and the bias, then a training lookup of ``lookups``."""
    meta: dict[str, object] = {"grads": [["emb/part_0", "sparse"], ["b/part_0", "dense"]], "step": True,
                               "vars": [["emb/part_0", "r"]], "create": True, "examples": 4,
                               "worker": "/job:worker/task:0", "incarnation": 5}
    arrays = {"i/emb/part_0": np.array([1, 2], np.int64), "g/emb/part_0": np.ones((2, 2), np.float32),
              "g/b/part_0": np.ones(2, np.float32), "r": np.array(lookups, np.int64)}
    for key, value in changed.items():
        (arrays if isinstance(value, np.ndarray) else meta)[key.replace("__", "/")] = value
    service.push_pull(Frame(meta, arrays))


@pytest.mark.parametrize("refused, error", [
    ({"incarnation": 4}, r"push from an earlier process of /job:worker/task:0 \(incarnation 4 < 5\)"),
    ({"generation": 7}, r"push of generation 7 refused: the cluster was restored"),
    ({"g__b__part_0": np.ones(3, np.float32)}, r"variable 'b' partition 0 .* pushed gradient has \(3,\)"),
    ({"g__emb__part_0": np.full((2, 2), np.nan, np.float32)}, r"the gradient of id 1 is not finite"),
], ids=["earlier process", "before a restore", "bad shape", "non-finite table gradient"])
def test_a_refused_push_counts_nothing_and_its_lookups_are_not_made(refused: dict[str, object], error: str) -> None:
    """What a task reports (Stats: metrics.json, /metrics) is what it applied. A PushPull's lookup goes with its
    push: the push refused (bad input, an earlier process, one from before a restore), the lookup is not made,
    so no sighting, admission or read counts, and neither does the push (rows, bytes, examples, loss, staleness).
    A lookup made by a Pull counts once made, whether or not the step's push lands later (docs/dynamic_tables.md)."""
    service = _sync_or_async_service(None)
    _push_pull(service, [1, 2])  # the worker's process (incarnation 5) is known; ids 1 and 2 have rows
    before = _counts(service)
    with pytest.raises((InvalidRequest, PreconditionFailed), match=error):
        _push_pull(service, [100, 101], **refused)
    assert _counts(service) == before
    _push_pull(service, [100, 101])  # the same call, accepted: counted
    after = _counts(service)
    assert (after["pushes"], after["examples"], after["dynamic_tables.emb/part_0.admitted"]) == (2, 8, 4), after


def test_a_push_whose_sync_step_timed_out_counts_nothing() -> None:
    """Sync, --on-timeout fail: the push's step timed out (the other worker never came), so nothing of it was applied;
    the step's timeout is counted, the push, its examples and its lookup are not."""
    service = _sync_or_async_service({"mode": "sync", "replicas_to_aggregate": 2, "total_num_replicas": 2,
                                      "timeout": 0.05, "on_timeout": "fail"})
    before = _counts(service)
    with pytest.raises(PreconditionFailed, match=r"sync step 0 timed out after 0\.1 s with 1 of 2 gradients"):
        _push_pull(service, [100, 101], tag=0)
    after = _counts(service)
    assert after.pop("sync_timeouts") == before.pop("sync_timeouts") + 1
    # (the step as it stopped: state, not counts; it failed, so it waits for nobody)
    assert after.pop("sync_contributed") == ["/job:worker/task:0"]
    assert after.pop("sync_failed").startswith("sync step 0 timed out")
    before.pop("sync_contributed"), before.pop("sync_failed")
    assert after == before


def test_stats_of_a_sync_step_that_timed_out_say_it_failed_not_that_it_waits() -> None:
    """Sync, --on-timeout fail: once the step timed out, every push is refused until a restore, and Stats (psflow
    status, the status page) said the step was still "waiting N s for" the missing worker, N growing. Stats now
    carry the refusal's own words (which step, after how long, k of N gradients, missing whom), and no wait."""
    service = _sync_or_async_service({"mode": "sync", "replicas_to_aggregate": 2, "total_num_replicas": 2,
                                      "timeout": 0.05, "on_timeout": "fail"})
    assert service.get_stats(Frame({}, {}))[0]["sync_failed"] is None  # (a Stats call, as the collector makes)
    with pytest.raises(PreconditionFailed) as refused:
        _push_pull(service, [100, 101], tag=0)
    stats = service.get_stats(Frame({}, {}))[0]
    assert stats["sync_failed"] == str(refused.value) == ("sync step 0 timed out after 0.1 s with 1 of 2 gradients; "
                                                         "missing: /job:worker/task:1")
    assert (stats["sync_waiting_for"], stats["sync_waiting_seconds"]) == ([], None)
    assert stats["sync_contributed"] == ["/job:worker/task:0"]  # what arrived before it failed


def test_a_leave_after_a_sync_step_timed_out_applies_nothing() -> None:
    """The worker the timed-out step waited for leaves (its data ended) after the timeout: the step failed, its one
    push was refused, and stays refused until a restore. The Leave applied that failed step all the same (fewer
    workers left to wait for): global_step moved, the refused push's gradient and examples were in the model and its
    counts, behind a refusal the pushing worker had already met and died of."""
    service = _sync_or_async_service({"mode": "sync", "replicas_to_aggregate": 2, "total_num_replicas": 2,
                                      "timeout": 0.05, "on_timeout": "fail"})
    with pytest.raises(PreconditionFailed, match=r"sync step 0 timed out"):
        _push_pull(service, [100, 101], tag=0)
    before = _counts(service)
    service.leave(LeaveRequest("/job:worker/task:1").to_frame())
    after = _counts(service)
    assert after.pop("live_replicas") == before.pop("live_replicas") - 1  # it left: not waited for any more
    assert (before.pop("finished"), after.pop("finished")) == ([], ["/job:worker/task:1"])
    assert after == before
    with pytest.raises(PreconditionFailed, match=r"sync step 0 timed out"):  # the step's failure stays
        _push_pull(service, [100, 101], tag=0)
