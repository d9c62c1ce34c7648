"""A dynamic table's totals over its shares: never a part of them presented as the whole.

Before: :func:`table_totals` skipped a ps task that did not answer (a stand-in: exited after training, killed, or
a replicated shard none of whose members answered), so ``metrics.json``'s ``dynamic_tables`` and the console's
``dynamic table 'w': N rows`` line gave one share's rows, evictions and bytes short, as if complete. Every dynamic
table spans every ps task (ids spread by :func:`~psflow.placement.hashing.owner_of` over all of them), so a task
not read holds a share of each table: its totals are not known (None), and ``shares_unread`` names the task and why.
"""

from __future__ import annotations

from typing import Any

import pytest

from psflow.cli.train import _print_summary
from psflow.ps.dynamic import DynamicTableStats, table_totals


def _reply(task: int, rows: int) -> dict[str, Any]:
    return {"task": f"/job:ps/task:{task}", "ready": True, "partitions": {f"w/part_{task}": [rows, 2]},
            "dynamic_tables": {f"w/part_{task}": {"rows": rows, "evicted_capacity": 1, "memory_bytes": 100}}}


def test_every_share_read_sums() -> None:
    assert table_totals([_reply(0, 3), _reply(1, 4)]) == {"w": {"rows": 7, "evicted_capacity": 2, "memory_bytes": 200}}


@pytest.mark.parametrize("stand_in", [
    {"task": "/job:ps/task:1", "ready": False, "exited": True, "error": "/job:ps/task:1 was killed by SIGKILL"},
    {"task": "/job:ps/task:1", "ready": False, "error": "UNAVAILABLE: connection refused"},
    {"task": "/job:ps/task:1", "ready": False, "unread_shard": 1, "error": "no member of shard 1 answered Stats"},
])
def test_a_task_not_read_makes_every_tables_totals_not_known(stand_in: dict[str, Any]) -> None:
    totals = table_totals([_reply(0, 3), stand_in])
    assert totals == {"w": {"rows": None, "evicted_capacity": None, "memory_bytes": None,
                            "shares_unread": [{"task": "/job:ps/task:1", "error": stand_in["error"]}]}}


def test_the_console_line_says_the_totals_are_not_known(capsys: pytest.CaptureFixture[str]) -> None:
    metrics = {"global_step": 5, "examples": 10, "examples_this_run": 10, "wall_seconds": 1.0, "examples_per_sec": 10.0,
               "dynamic_tables": table_totals([_reply(0, 3), {"task": "/job:ps/task:1", "ready": False,
                                                               "error": "killed"}])}
    _print_summary(metrics)
    err = capsys.readouterr().err
    assert "psflow: dynamic table 'w': totals not known: the share on /job:ps/task:1 was not read (killed)" in err
    assert "0 rows" not in err


def test_a_task_restarted_empty_after_training_makes_every_tables_totals_not_known() -> None:
    """A ps task killed after training and started again, which nobody restores (no chief is left: the launcher's
    final_model reads the final checkpoint instead), answers ``Stats`` with no share of any table (ready False, no
    partitions, no ``error``): its share is not known, not zero. Before, the totals were ps task 0's share alone
    (a real run with tests/integration/ps_lost_after_training: 'weights' 63 rows of a9a's 123 ids, as the whole)."""
    from psflow.ps.service import ParameterService

    empty = ParameterService(1, holds_global_step=False).stats_reply().as_dict()
    assert empty["task"] == "/job:ps/task:1" and not empty["ready"] and "dynamic_tables" not in empty
    totals = table_totals([_reply(0, 3), empty])
    assert totals["w"]["rows"] is None and totals["w"]["memory_bytes"] is None, totals
    (unread,) = totals["w"]["shares_unread"]
    assert unread["task"] == "/job:ps/task:1" and "not ready" in unread["error"], unread


def test_a_ready_task_holding_no_share_leaves_the_totals_known() -> None:
    """A dynamic table pinned to one ps task (``variables.device``: device_setter) has no share on the others: a
    ready task whose Stats name no table held none (two registered services), and the totals are the shares read."""
    from psflow.optim import OptimizerSpec
    from psflow.placement import VariableSet, replica_device_setter
    from psflow.ps.service import ParameterService
    from psflow.rpc.framing import Frame

    variables = VariableSet(replica_device_setter(2))
    with variables.device("/job:ps/task:0"):
        variables.get_variable("emb", (0, 2), dynamic={}, initializer={"name": "zeros"})
    variables.get_variable("bias", (1,), initializer={"name": "zeros"})
    meta = {"layout": [p.to_json() for p in variables.placements()],
            "optimizer": OptimizerSpec("adagrad", {"learning_rate": 0.5}).to_json(), "chief": True}
    stats = []
    for task in range(2):
        service = ParameterService(task, holds_global_step=task == 0)
        service.register(Frame(meta, {}))
        stats.append(service.stats_reply().as_dict())
    assert stats[1]["ready"] and "dynamic_tables" not in stats[1]
    totals = table_totals(stats)
    assert totals["emb"]["rows"] == 0 and "shares_unread" not in totals["emb"], totals


_LOST = {"task": "/job:ps/task:0", "ready": False, "exited": True, "error": "/job:ps/task:0 was killed by SIGKILL"}


def test_every_task_unread_still_reports_each_table_the_run_declared() -> None:
    """``--ps 1`` with that task lost after training: no Stats names a share, so the table names come from the run
    (``tables``). Before, ``dynamic_tables`` was {} (missing from metrics.json, no console line): a silent omission."""
    totals = table_totals([_LOST], tables=["w", "deep/emb"])
    counters = {name: None for name in DynamicTableStats.__dataclass_fields__}
    unread = [{"task": "/job:ps/task:0", "error": _LOST["error"]}]
    assert totals == {"w": {**counters, "shares_unread": unread}, "deep/emb": {**counters, "shares_unread": unread}}


def test_a_declared_table_pinned_to_the_unread_task_is_reported_beside_those_read() -> None:
    """A table pinned to ps task 0 (lost) has no share on the ready task 1: known only from ``tables``."""
    reply = {"task": "/job:ps/task:1", "ready": True, "dynamic_tables": {"w/part_1": {"rows": 4, "memory_bytes": 100}}}
    totals = table_totals([_LOST, reply], tables=["w", "pinned"])
    assert totals["w"] == {"rows": None, "memory_bytes": None, "shares_unread": [{"task": "/job:ps/task:0",
                                                                                   "error": _LOST["error"]}]}
    assert totals["pinned"]["rows"] is None and totals["pinned"]["shares_unread"] == totals["w"]["shares_unread"]


def test_declared_tables_every_share_read_are_the_sums_and_nothing_more() -> None:
    assert table_totals([_reply(0, 3), _reply(1, 4)], tables=["w"]) == table_totals([_reply(0, 3), _reply(1, 4)])


def test_the_console_says_each_table_of_a_run_with_every_task_unread(capsys: pytest.CaptureFixture[str]) -> None:
    metrics = {"global_step": 5, "examples": 10, "examples_this_run": 10, "wall_seconds": 1.0, "examples_per_sec": 10.0,
               "dynamic_tables": table_totals([_LOST], tables=["w"])}
    _print_summary(metrics)
    err = capsys.readouterr().err
    assert ("psflow: dynamic table 'w': totals not known: the share on /job:ps/task:0 was not read "
            "(/job:ps/task:0 was killed by SIGKILL)") in err, err
