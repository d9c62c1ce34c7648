"""The ps protocol (psflow/ps/protocol/, issue 27 item 1): one typed message per call, the only place that
spells a wire key; messages survive the wire unchanged, share their arrays, and a malformed field is
refused naming it."""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re
from collections.abc import Iterator

import numpy as np
import pytest

from psflow.cluster import ClusterSpec
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps import protocol as p
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import InvalidRequest
from psflow.rpc.framing import Frame, decode, encode

pytestmark = pytest.mark.timeout(60)

PSFLOW = pathlib.Path(__file__).resolve().parents[3] / "psflow"
PROTOCOL = PSFLOW / "ps" / "protocol"
WORD = re.compile(r"[a-z][a-z0-9_]*")
#: Array name prefixes: a gradient's values and rows, a pull's rows, a loaded value, slot, table, a RunStep output,
#: and the stacked ones (a push's values and rows, a pull's rows, a pull reply's values).
PREFIXES = ("g/", "i/", "r/", "v/", "s/", "d/", "o/", "gs/", "is/", "rs/", "vs/")
#: Words the protocol uses as keys that are also keys of other psflow documents or plain names elsewhere
#: (the manifest, status.json, the Stats counters a status page reads, configs, CLI choices), so finding
#: them outside the protocol says nothing. Every other word the protocol spells must appear nowhere else.
SHARED = {
    "accepted", "async", "bytes", "checkpoint_dir", "chief", "client", "create", "created", "dense", "epoch", "error",
    "examples", "failed", "failed_in_a_row", "failures", "finished", "generation", "global_step", "holder", "ids",
    "labels", "last_saved_path", "last_saved_step", "learning_rate", "lineage", "loss", "mode", "num_shards",
    "optimizer", "partitions", "path", "ready", "run_over", "saved", "sha256", "shard", "sparse", "step", "sync", "task",
    "token", "values", "worker", "writer",
    # replicated shards (issue 28): a member's role and view are also the Stats "replication" counters' keys and
    # values (status pages, metrics), "seq" and "state" plain words of other documents
    "applied_seq", "backup", "backups", "deposed", "entries", "has_state", "joining", "lag", "primary", "role", "seq",
    "state", "unreplicated",
    # a replicated shard's count of applied pushes: SaveShard's and LoadShard's field, the manifest's shard record
    # and the Stats "replication" counter's key; the same per client process ("pushes_applied_by")
    "pushes_applied", "pushes_applied_by",
    # incremental checkpoints (issue 29): SaveShard's "marks" (its reply) is also the manifest's shard record key
    # (and a replica's lazy-row marks), "since" and "full" plain words of other documents (the manifest's kind)
    "marks", "since", "full",
}


def _constants(path: pathlib.Path) -> Iterator[str]:
    """The string constants of a module, f-string parts included, docstrings and ``__all__`` excluded."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skipped.add(id(first.value))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            skipped.update(id(n) for n in ast.walk(node.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            yield node.value


def _outside_protocol() -> list[pathlib.Path]:
    return [f for f in sorted(PSFLOW.rglob("*.py")) if PROTOCOL not in f.parents]


def test_no_other_psflow_module_spells_a_wire_key() -> None:
    spelled = {c for f in PROTOCOL.glob("*.py") for c in _constants(f) if WORD.fullmatch(c)}
    keys = spelled - SHARED
    # the keys of the push's tags, of the pulls and of the checkpoint calls are among them
    assert {"grads", "vars", "step_hint", "read_step", "incarnation", "position", "positions", "clock", "defer_ready",
            "min_clock", "pull_step", "parts", "values_only", "restored_step", "lineage_if_unset", "outcome",
            "step_floor", "drained", "init_count", "layout", "averages", "final_checkpoint"} <= keys
    found = {}
    for path in _outside_protocol():
        for constant in _constants(path):
            if constant in keys or constant.startswith(PREFIXES):
                found.setdefault(str(path.relative_to(PSFLOW.parent)), set()).add(constant)
    assert not found, f"wire keys spelled outside psflow/ps/protocol/: {found}"


def test_the_scan_sees_a_key_in_code_but_not_in_a_docstring(tmp_path: pathlib.Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""Sends ``step_hint``."""\n\ndef f(meta):\n    return meta.get("step_hint"), f"g/{meta}"\n')
    assert set(_constants(module)) == {"step_hint", "g/"}


def _wire(frame: Frame) -> Frame:
    return decode(encode(frame.meta, frame.arrays))


def _layout() -> tuple[object, ...]:
    vs = VariableSet(replica_device_setter(cluster=ClusterSpec({"ps": ["a:1"]})))
    vs.get_variable("w", (5, 2))
    return tuple(vs.placements())


def test_a_push_and_its_tags_cross_the_wire_unchanged_and_share_their_arrays() -> None:
    values, rows = np.ones((2, 3), np.float32), np.array([4, 1], np.int64)
    dense = np.zeros(3, np.float32)
    push = p.PushRequest([("emb/part_0", values, rows), ("b/part_0", dense, None)],
                         p.WorkerTag("/job:worker/task:1", 17, 3, '{"files": []}'), p.StepTag(9, 4, None, 11),
                         step=True, examples=64, loss=0.25)
    frame = push.to_frame()
    assert np.shares_memory(frame.arrays["g/emb/part_0"], values) and frame.arrays["i/emb/part_0"] is rows
    back = p.PushRequest.from_frame(_wire(frame))
    assert back.worker == push.worker and back.steps == push.steps
    assert (back.step, back.examples, back.loss) == (True, 64, 0.25)
    assert [(k, g.tolist(), None if r is None else r.tolist()) for k, g, r in back.grads] == [
        ("emb/part_0", values.tolist(), [4, 1]), ("b/part_0", dense.tolist(), None)]


def test_a_push_pull_keeps_the_push_step_hint_and_the_pull_rows() -> None:
    ids = np.array([2, 0], np.int64)
    request = p.PushPullRequest(p.PushRequest([], p.WorkerTag("w"), p.StepTag(step_hint=12)),
                                p.PullRequest([("emb/part_0", ids), ("b/part_0", None)], create=True, step_hint=12))
    back = p.PushPullRequest.from_frame(_wire(request.to_frame()))
    assert back.push.steps.step_hint == 12 and back.pull.create and back.pull.step_hint == 12
    assert [(k, None if r is None else r.tolist()) for k, r in back.pull.parts] == [("emb/part_0", [2, 0]),
                                                                                   ("b/part_0", None)]
    reply = p.PushPullReply(p.PushReply(5, accepted=False, completed=False, aggregated=True),
                            p.PullReply(4, {"emb/part_0": np.ones((2, 2), np.float32)}))
    got = p.PushPullReply.from_frame(_wire(reply.to_frame()))
    assert got.push == p.PushReply(5, False, False, None, True) and got.pull.step == 4
    assert got.pull.values["emb/part_0"].shape == (2, 2)


def test_an_async_push_reply_is_the_step_alone() -> None:
    assert p.PushReply(3).to_frame().meta == {"step": 3}
    assert p.PushReply(3, min_clock=2).to_frame().meta == {"step": 3, "min_clock": 2}


def test_register_and_the_checkpoint_calls_round_trip() -> None:
    layout = _layout()
    register = p.RegisterRequest(layout, OptimizerSpec("sgd", {"learning_rate": 0.5}), SyncConfig(), "w0",  # type: ignore[arg-type]
                                 chief=True, defer_ready=True)
    assert p.RegisterRequest.from_frame(_wire(register.to_frame())) == register
    assert "incarnation" not in register.to_frame().meta  # a client that does not say: the same frame as before
    process = dataclasses.replace(register, incarnation=1_700_000_000_123_456_789)
    assert p.RegisterRequest.from_frame(_wire(process.to_frame())) == process
    with pytest.raises(InvalidRequest, match="'incarnation' must be a non-negative integer"):
        p.RegisterRequest.from_frame(Frame({**register.to_frame().meta, "incarnation": -1}))
    status = p.CheckpointStatusRequest("run-1", p.SaveOutcome(False, 7, "", "disk full", "w0"))
    assert p.CheckpointStatusRequest.from_frame(_wire(status.to_frame())) == status
    load = p.LoadShardRequest.build({"w/part_0": np.ones((5, 2), np.float32)},
                                    {"w/part_0": {"accum": np.zeros((5, 2), np.float32)}},
                                    {"t/part_0": {"slot/accum": np.zeros((1, 2), np.float32)}},
                                    ["w/part_0", "t/part_0"], global_step=3, positions={"w0": "{}"}, examples=9,
                                    restored_step=3, reply_within_ms=60000)
    back = p.LoadShardRequest.from_frame(_wire(load.to_frame()))
    assert (back.parts, back.global_step, back.positions, back.examples, back.restored_step,
            back.reply_within_ms) == (["w/part_0", "t/part_0"], 3, {"w0": "{}"}, 9, 3, 60000)
    assert set(back.slots("w/part_0")) == {"accum"} and set(back.table("t/part_0")) == {"slot/accum"}
    assert back.value("w/part_0") is not None and back.value("t/part_0") is None and back.has_slots()
    for message in (p.FenceRequest(7, holder="chief-a"), p.SaveShardRequest("/ckpt/s0", 0, 2, 7, "chief-a"),
                    p.SetReadyRequest("w0", 12, 30), p.BeginRestoreRequest(12, 7, "chief-a"),
                    p.ReaderPositionsRequest("w1", 99), p.DoneRequest("w0", 5, True, "ckpt-000000010")):
        assert type(message).from_frame(_wire(message.to_frame())) == message  # type: ignore[attr-defined]


def test_stats_keeps_typed_state_apart_from_counters() -> None:
    stats = p.StatsReply("/job:ps/task:0", 40, 32, 1, True, True, 2, "sync", ("w0",), 0.1, {"pushes": 40})
    back = p.StatsReply.from_frame(_wire(stats.to_frame()))
    assert back == stats and back.as_dict()["pushes"] == 40


@pytest.mark.parametrize("message, meta, arrays, field", [
    (p.PushRequest, {"grads": "x"}, {}, "'grads' must be a list"),
    (p.PushRequest, {"grads": [["w/part_0", "dense"]]}, {}, "gradient array missing"),
    (p.PushRequest, {"grads": [], "examples": True}, {}, "'examples' must be a non-negative integer"),
    (p.PushRequest, {"grads": [], "read_step": "3"}, {}, "'read_step' must be an integer"),
    (p.PushRequest, {"grads": [], "generation": -1}, {}, "'generation' must be a non-negative integer"),
    (p.PushRequest, {"grads": [], "incarnation": 5}, {}, "'incarnation' must be a non-negative integer sent with"),
    (p.PushRequest, {"grads": [], "worker": 3}, {}, "'worker' must be a task name"),
    (p.PushRequest, {"grads": [], "position": 3}, {}, "'position' must be a string"),
    (p.PullRequest, {"vars": [["w/part_0", "r"]]}, {}, "rows array 'r' missing"),
    (p.PullRequest, {"vars": [], "step_hint": 1.5}, {}, "'step_hint' must be an integer"),
    (p.LoadShardRequest, {"parts": [], "positions": {"w0": 3}}, {}, "positions must map"),
    (p.SetReadyRequest, {"generation": "x"}, {}, "'generation' must be a non-negative integer"),
    (p.CheckpointStatusRequest, {"lineage_if_unset": ""}, {}, "lineage must be a non-empty string"),
    (p.DoneRequest, {"worker": "w0", "incarnation": 1, "checkpoint_dir": "yes"}, {}, "'checkpoint_dir' must be true"),
    (p.FenceRequest, {"token": -1}, {}, "'token' must be a non-negative integer"),
])
def test_a_malformed_field_is_refused_naming_it(message: type, meta: dict[str, object],
                                                arrays: dict[str, np.ndarray], field: str) -> None:
    with pytest.raises(InvalidRequest, match=field):
        message.from_frame(Frame(dict(meta), arrays))
