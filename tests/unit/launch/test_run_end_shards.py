"""The end's replication figures where a replicated shard's members do not all answer (psflow.launch.run_end):
a shard whose primary is silent is reported from the backup that answers (its own role, the primary its view
names); a shard none of whose members answers is named unread (``shards_unread``) and the run's totals are not
known (None), never summed as if it had lost nothing. Members are in-process stand-ins answering recorded
``Stats`` replies (the real runs: tests/integration/test_ps_lost_not_restarted.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from psflow.cluster.spec import ClusterSpec
from psflow.launch.run_end import RunEnd
from psflow.rpc.api import RpcError

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"], "ps_backup": ["127.0.0.1:3", "127.0.0.1:4"],
                       "worker": ["127.0.0.1:5"]})
ACKED = [["/job:worker/task:0", 7, [31, 30]]]  # the worker's acknowledged pushes per shard, as every member heard


def _member(task: str, shard: int, role: str, applied: int, **more: Any) -> dict[str, Any]:
    entry = {"shard": shard, "task": task, "role": role, "epoch": 1, "primary": f"/job:ps/task:{shard}",
             "backups": [f"/job:ps_backup/task:{shard}"], "pushes_applied": applied, "pushes_acknowledged": applied,
             "acked_by_process": ACKED, "applied_by_process": [["/job:worker/task:0", 7, applied]],
             "counts_exact": True}
    return {"task": task, "ready": True, "replication": entry, **more}


REPLIES = {
    "/job:ps/task:0": _member("/job:ps/task:0", 0, "primary", 31, global_step=61, examples=7808),
    "/job:ps_backup/task:0": _member("/job:ps_backup/task:0", 0, "backup", 31),
    "/job:ps/task:1": _member("/job:ps/task:1", 1, "primary", 30),
    "/job:ps_backup/task:1": _member("/job:ps_backup/task:1", 1, "backup", 30),
}


class _Reply:
    def __init__(self, task: str, meta: Mapping[str, Any] | None) -> None:
        self.task, self.meta = task, meta

    def result(self) -> _Reply:
        if self.meta is None:
            raise RpcError(f"{self.task}: Stats: UNAVAILABLE: connection refused")
        return self


class _Member:
    """A shard member's channel: answers its recorded ``Stats``, or nothing (``silent``)."""

    def __init__(self, task: str, silent: bool) -> None:
        self.task, self.silent = task, silent

    def call_async(self, method: str, meta: Mapping[str, Any] | None = None, **_: Any) -> _Reply:
        assert method == "Stats"
        return _Reply(self.task, None if self.silent else REPLIES[self.task])

    def close(self) -> None:
        pass


def _end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *silent: str) -> RunEnd:
    lc = SimpleNamespace(cluster=CLUSTER, resilience=None, token=None)
    end = RunEnd(lc, str(tmp_path), started=0.0)
    monkeypatch.setattr(end, "_channels", lambda timeout: {t: _Member(t, t in silent) for t in REPLIES})
    return end


def test_every_member_answering_reports_each_shard_from_its_primary(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    end = _end(tmp_path, monkeypatch)
    final = end._snapshot("finished", end.read_shards(1.0), 1.0, {})
    assert [(s["shard"], s["primary"], s["role"]) for s in final["shards"]] == [
        (0, "/job:ps/task:0", "primary"), (1, "/job:ps/task:1", "primary")]
    assert (final["pushes_acknowledged"], final["pushes_applied"], final["updates_lost"]) == (61, 61, 0)
    assert "shards_unread" not in final


def test_a_shard_whose_primary_is_silent_is_reported_from_its_backup(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    end = _end(tmp_path, monkeypatch, "/job:ps/task:1")
    stats = end.read_shards(1.0)
    assert [s["task"] for s in stats] == ["/job:ps/task:0", "/job:ps_backup/task:1"]
    final = end._snapshot("finished", stats, 1.0, {})
    # The view's primary (silent, not yet replaced) and the role of the member the figures come from.
    assert [(s["shard"], s["primary"], s["role"]) for s in final["shards"]] == [
        (0, "/job:ps/task:0", "primary"), (1, "/job:ps/task:1", "backup")]
    assert (final["pushes_acknowledged"], final["pushes_applied"], final["updates_lost"]) == (61, 61, 0)
    assert "shards_unread" not in final


def test_a_shard_no_member_answers_for_is_named_unread_not_counted_as_nothing_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the shard was left out of ``shards`` and of the totals (pushes_acknowledged 31 of 61, updates_lost
    0), nothing saying it was not read."""
    end = _end(tmp_path, monkeypatch, "/job:ps/task:1", "/job:ps_backup/task:1")
    stats = end.read_shards(1.0)
    assert [s["task"] for s in stats] == ["/job:ps/task:0", "/job:ps/task:1"]
    assert stats[1]["ready"] is False  # a finished run's model is then the final checkpoint's (final_model)
    final = end._snapshot("finished", stats, 1.0, {})
    assert [s["shard"] for s in final["shards"]] == [0]
    assert [(u["shard"], u["task"]) for u in final["shards_unread"]] == [(1, "/job:ps/task:1")]
    assert final["shards_unread"][0]["error"] == (
        "no member of shard 1 answered Stats (/job:ps/task:1: /job:ps/task:1: Stats: UNAVAILABLE: connection "
        "refused; /job:ps_backup/task:1: /job:ps_backup/task:1: Stats: UNAVAILABLE: connection refused)")
    assert (final["pushes_acknowledged"], final["pushes_applied"], final["updates_lost"]) == (None, None, None)
    assert final["global_step"] == 61  # shard 0's primary holds it


def test_a_capture_names_an_unread_shard_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed or interrupted run's end (RunEnd.capture) reads the members the same way."""
    end = _end(tmp_path, monkeypatch, "/job:ps/task:0", "/job:ps_backup/task:0")
    end.lc.tasks = []
    stats, _, _ = end.capture()
    assert [(s["task"], s.get("unread_shard")) for s in stats] == [("/job:ps/task:1", None), ("/job:ps/task:0", 0)]
    final = end._snapshot("failed", stats, 1.0, {})
    assert [u["shard"] for u in final["shards_unread"]] == [0] and final["updates_lost"] is None
    assert final["global_step"] is None  # its holder, shard 0, was not read
