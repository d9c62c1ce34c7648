"""The in-graph client's result names the checkpoint it restored at start, whichever of its two paths restored it.

Reviewing c17ff60: the client restores before its session either itself (``_restore_initialized_cluster``: a ps
task kept its state, or ps task 0's journal bounds this run's values past the checkpoint) or leaves it to its
session's join (a fresh cluster: a resumed run's restore at generation 0; and, since c17ff60, a journal naming
another run, which the join judges after its Register and restores within the run at a new generation). The result's
``restored`` (metrics.json's client entry) named only the first: a join that restored reported None. The client's
parts are fakes here (no sockets); test_restore_heard_floor.py runs both paths on a real in-process shard.
"""

from __future__ import annotations

from typing import Any

import pytest

import psflow.train.in_graph_client as client_module
from psflow.cluster import ClusterSpec
from psflow.train.chief import JoinResult
from psflow.train.config import TrainConfig

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:3"]})


class _Client:
    def connect(self) -> None:
        pass

    def ps_stats(self) -> Any:
        return type("Stats", (), {"generation": 7})()

    def leave(self) -> None:
        pass

    def report_done(self, **kwargs: Any) -> list[str]:
        return []

    def close(self) -> None:
        pass


class _Session:
    """The session: entering it is its join, which restored ``joined`` (None: it restored nothing). ``restores``:
    the restores told to its hooks (``restored``)."""

    global_step = 500

    def __init__(self, joined: str | None) -> None:
        self.join_result = JoinResult(True, joined, 500, None, {}, generation=7)
        self.restores: list[tuple[str | None, int | None]] = []
        self.hooks: list[Any] = []  # (no evaluation hook: the result's eval_not_done is [])

    def restored(self, checkpoint: str | None, step: int | None) -> None:
        self.restores.append((checkpoint, step))

    def __enter__(self) -> _Session:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _run(monkeypatch: pytest.MonkeyPatch, before: str | None, joined: str | None,
         session: _Session | None = None) -> Any:
    class Driver:
        steps = examples = 0

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

    monkeypatch.setattr(client_module, "Session", lambda *a, **k: type("S", (), {
        "connect": lambda self: None, "close": lambda self: None})())
    monkeypatch.setattr(client_module, "build_model", lambda config, cluster: (None, type("V", (), {
        "placements": lambda self: {}})()))
    monkeypatch.setattr(client_module, "ParameterClient", lambda *a, **k: _Client())
    monkeypatch.setattr(client_module, "make_session", lambda *a, **k: session or _Session(joined))
    own = None if before is None else client_module.RestoreAtStart(before, 400, 12800, 16000)
    monkeypatch.setattr(client_module, "_restore_initialized_cluster", lambda config, client: own)
    monkeypatch.setattr(client_module, "InGraphDriver", Driver)
    monkeypatch.setattr(client_module, "_train", lambda *a: (0, "end of data"))
    return client_module.run_in_graph_client(TrainConfig.flat(train=("unused",), num_features=3), CLUSTER)


@pytest.mark.parametrize(("before", "joined", "reported"), [
    (None, "/ckpt/ckpt-000000500", "/ckpt/ckpt-000000500"),  # the join restored (a journal of another run, a resume)
    ("/ckpt/ckpt-000000500", None, "/ckpt/ckpt-000000500"),  # the client restored; the join found the tasks ready
    (None, None, None),  # a fresh cluster, nothing restored
], ids=["by-the-join", "by-the-client", "none"])
def test_the_result_names_the_checkpoint_restored_at_start(monkeypatch: pytest.MonkeyPatch, before: str | None,
                                                           joined: str | None, reported: str | None) -> None:
    assert _run(monkeypatch, before, joined)["restored"] == reported


def test_the_client_s_own_restore_is_told_to_the_hooks_and_reported_with_its_discard(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its own restore (before the session, whose join then restored nothing) goes to the hooks at the checkpoint's
    step (the summaries' START: 27a9824's after_restore), and the result's ``restore`` says what it threw away
    (psflow.launch.restore_loss). Before, the hooks heard nothing and the result had no ``restore``."""
    session = _Session(None)
    result = _run(monkeypatch, "/ckpt/ckpt-000000400", None, session)
    assert session.restores == [("/ckpt/ckpt-000000400", 400)]
    assert result["restore"] == {"checkpoint": "/ckpt/ckpt-000000400", "checkpoint_step": 400,
                                 "examples_restored": 12800, "examples_before": 16000, "examples_discarded": 3200}


def test_the_join_s_restore_is_not_told_again_and_its_discard_is_not_known(monkeypatch: pytest.MonkeyPatch,
                                                                           tmp_path: Any) -> None:
    """The join's restore wrote its own START (SummarySaverHook.after_create_session); what the model held
    before it is not known (the ps tasks were empty)."""
    from psflow.checkpoint.manifest import MANIFEST_NAME, Manifest

    checkpoint = tmp_path / "ckpt-000000300"
    checkpoint.mkdir()
    (checkpoint / MANIFEST_NAME).write_text(Manifest(global_step=300, variables={}, shards=[], examples=9600).to_json())
    session = _Session(str(checkpoint))
    result = _run(monkeypatch, None, str(checkpoint), session)
    assert session.restores == []
    assert result["restore"] == {"checkpoint": str(checkpoint), "checkpoint_step": 300, "examples_restored": 9600,
                                 "examples_before": None, "examples_discarded": None}
