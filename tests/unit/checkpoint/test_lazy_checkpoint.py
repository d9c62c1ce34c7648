"""Full checkpoints of lazy tables store only the built rows (issue 29): every reader gives what an eager
table's checkpoint gives, bit for bit, and a restored partition stays lazy with its other rows unbuilt.

Each test trains the same few rows on a lazy cluster and on an eager one (the same layout with laziness off)
and compares: the saved variables and slots (read_variables), a restore onto 1 and 2 ps tasks (resharded),
increments chained on the full checkpoint, export, the evaluator's reader (load_checkpoint_model) and
warm start's (which sends only the saved rows where the model's initializer is the checkpoint's, keeping the
table lazy, and gives the values the whole-variable load gives); and, for every optimizer and for constant
initializers as well as random ones, a run resumed on other ps tasks and partitions, then rotated to a new full
checkpoint, moving averages included. The ps tasks are in-process ParameterServices, called through the real
frame encoding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from framed_ps import FramedPs, ps_cluster, same_arrays
from safetensors.numpy import load_file, save_file

import psflow.ps.lazy_rows as lazy_rows
import psflow.ps.shard_snapshot as shard_snapshot
from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.restore import restore
from psflow.checkpoint.save import CheckpointManager
from psflow.checkpoint.variables import read_variables
from psflow.checkpoint.warm_start import load_values, read_warm_start, warm_start
from psflow.errors import CheckpointError
from psflow.export import export_model, load_checkpoint_model
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, fixed_size_partitioner, replica_device_setter

pytestmark = pytest.mark.timeout(120)

ROWS = 4096
TOUCHED = [3, 17, 1500, 2048, 2049, 4000]
OPTIMIZERS = {"adagrad": OptimizerSpec("adagrad", {"learning_rate": 0.5, "initial_accumulator_value": 0.7}),
              "sgd": OptimizerSpec("sgd", {"learning_rate": 0.5}),
              "momentum": OptimizerSpec("momentum", {"learning_rate": 0.5, "momentum": 0.9}),
              "rmsprop": OptimizerSpec("rmsprop", {"learning_rate": 0.05, "centered": True}),
              "ftrl": OptimizerSpec("ftrl", {"learning_rate": 0.2, "initial_accumulator_value": 0.4,
                                             "l1_regularization_strength": 0.01}),
              "adam": OptimizerSpec("adam", {"learning_rate": 0.01})}


class _Cluster(FramedPs):
    """A ParameterClient's surface over ``num_ps`` in-process services: logistic regression's ``weights`` (a
    random initializer, 2 partitions) and ``bias``, and a 2-column ``emb`` (optionally averaged)."""

    def __init__(self, num_ps: int, optimizer: str, *, average: bool = False, emb: bool = True,
                 constant: bool = False, parts: tuple[int, int] = (2, 3), seed: int = 0) -> None:
        """``constant``: constant initializers (zeros, 0.25) in place of random ones; ``parts``: the two tables'
        partitions; ``seed``: added to the random initializers' seeds."""
        cluster = ps_cluster(num_ps)
        vs = VariableSet(replica_device_setter(cluster=cluster))
        vs.get_variable("weights", (ROWS, 1), partitioner=fixed_size_partitioner(parts[0]),
                        initializer={"name": "zeros"} if constant else
                        {"name": "random_normal", "stddev": 0.3, "seed": 5 + seed})
        vs.get_variable("bias", (1,))
        if emb:
            vs.get_variable("emb", (ROWS, 2), partitioner=fixed_size_partitioner(parts[1]),
                            initializer={"name": "constant", "value": 0.25} if constant else
                            {"name": "truncated_normal", "stddev": 0.1, "seed": 9 + seed},
                            moving_average_decay=0.9 if average else None)
        super().__init__(cluster, vs.placements(), OPTIMIZERS[optimizer])

    def parts(self, name: str) -> list[Any]:
        """The ps-side PartitionStates of variable ``name``, by partition index."""
        out = []
        for part in self.layout[name].partitions:
            out.append(self.services[part.task].store.get(f"{name}/part_{part.index}"))
        return out

    def train(self, seed: int, rows: list[int]) -> None:
        """One step: sparse gradients on ``rows`` of the tables, dense on ``bias``."""
        rng = np.random.default_rng(seed)
        wanted = np.array(rows, dtype=np.int64)
        per_task: dict[int, tuple[list[list[str]], dict[str, np.ndarray]]] = {t: ([], {}) for t in self.channels}
        for name in ("weights", "emb"):
            if name not in self.layout:
                continue
            width = tuple(self.layout[name].var.shape)[1]
            for part in self.layout[name].partitions:
                local = wanted[(wanted >= part.row_start) & (wanted < part.row_stop)] - part.row_start
                if local.size:
                    key = f"{name}/part_{part.index}"
                    entries, arrays = per_task[part.task]
                    entries.append([key, "sparse"])
                    arrays[f"g/{key}"] = rng.standard_normal((local.size, width)).astype(np.float32)
                    arrays[f"i/{key}"] = local
        part = self.layout["bias"].partitions[0]
        entries, arrays = per_task[part.task]
        entries.append(["bias/part_0", "dense"])
        arrays["g/bias/part_0"] = rng.standard_normal((1,)).astype(np.float32)
        for task, (entries, arrays) in per_task.items():
            self.channels[task].call("Push", {"grads": entries, "step": task == 0, "step_hint": self.global_step()},
                                     arrays)


def _cluster(lazy: bool, monkeypatch: pytest.MonkeyPatch, num_ps: int, optimizer: str, **kw: Any) -> _Cluster:
    monkeypatch.setattr(lazy_rows, "LAZY_MIN_BYTES", 1 if lazy else 1 << 40)
    cluster = _Cluster(num_ps, optimizer, **kw)
    lazy = lazy and optimizer != "adam"  # Adam's sparse update moves every row: its tables are always eager
    assert all((p.lazy is not None) == lazy for name in ("weights", "emb") if name in cluster.layout
               for p in cluster.parts(name))
    return cluster


def _trained(lazy: bool, monkeypatch: pytest.MonkeyPatch, num_ps: int, optimizer: str, **kw: Any) -> _Cluster:
    cluster = _cluster(lazy, monkeypatch, num_ps, optimizer, **kw)
    cluster.train(1, TOUCHED)
    cluster.train(2, TOUCHED[::2])
    return cluster


def _save(cluster: _Cluster, directory: Path, **kw: Any) -> str:
    return CheckpointManager(str(directory), **kw).save(cluster).path  # type: ignore[arg-type]


def _stored_rows(path: str, name: str) -> int:
    """Rows of ``name``'s value tensors in the checkpoint's shards, all partitions together."""
    manifest = read_manifest(path)
    total = 0
    for part in manifest.variables[name]["partitions"]:
        total += load_file(str(Path(path) / part["shard"]))[f"{name}/part_{part['index']}"].shape[0]
    return total


@pytest.mark.parametrize("optimizer,average", [("adagrad", False), ("ftrl", True), ("sgd", False),
                                               ("momentum", True), ("rmsprop", False)])
def test_a_full_shard_holds_only_the_built_rows_and_reads_as_an_eager_tables(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, optimizer: str, average: bool) -> None:
    eager = _save(_trained(False, monkeypatch, 2, optimizer, average=average), tmp_path / "eager")
    lazy = _save(_trained(True, monkeypatch, 2, optimizer, average=average), tmp_path / "lazy")
    assert _stored_rows(eager, "weights") == ROWS and _stored_rows(eager, "emb") == ROWS
    assert _stored_rows(lazy, "weights") == len(TOUCHED) and _stored_rows(lazy, "emb") == len(TOUCHED)
    parts = read_manifest(lazy).variables["emb"]["partitions"]
    assert sum(p["built"] for p in parts) == len(TOUCHED)
    assert all(p["initializer"]["name"] == "truncated_normal" for p in parts)
    lazy_bytes = sum(s["bytes"] for s in read_manifest(lazy).shards)
    assert lazy_bytes * 20 < sum(s["bytes"] for s in read_manifest(eager).shards)
    same_arrays(read_variables(lazy, slots=True), read_variables(eager, slots=True))
    if average:
        same_arrays(read_variables(lazy, moving_averages=True), read_variables(eager, moving_averages=True))


@pytest.mark.parametrize("saved_ps,restored_ps", [(1, 1), (1, 2), (2, 1)])
def test_a_restore_keeps_the_partitions_lazy_and_gives_the_eager_values(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, saved_ps: int, restored_ps: int) -> None:
    want = read_variables(_save(_trained(False, monkeypatch, saved_ps, "adagrad", average=True), tmp_path / "e"),
                          slots=True)
    lazy = _save(_trained(True, monkeypatch, saved_ps, "adagrad", average=True), tmp_path / "l")
    for lazy_target in (True, False):
        target = _cluster(lazy_target, monkeypatch, restored_ps, "adagrad", average=True)
        target.train(7, [5, 6, 1500, 3000])  # rows built before the restore, some not in the checkpoint
        restore(target, lazy)  # type: ignore[arg-type]
        if lazy_target:  # only the checkpoint's built rows are built now: memory follows the work
            for name in ("weights", "emb"):
                parts = target.parts(name)
                assert all(p.lazy is not None for p in parts)
                assert sum(p.lazy.count for p in parts) == len(TOUCHED)
        same_arrays(read_variables(_save(target, tmp_path / f"again-{lazy_target}"), slots=True), want)


@pytest.mark.parametrize("constant", [False, True])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_a_run_resumed_on_other_ps_tasks_and_partitions_then_rotated_reads_as_the_eager_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, optimizer: str, constant: bool) -> None:
    """Saved (a full checkpoint, an increment), restored onto 1 ps task and other partitions, trained and saved
    again past a rotation (a new full checkpoint): each checkpoint, moving averages too, reads as the eager run's."""
    got: dict[bool, list[dict[str, np.ndarray]]] = {}
    for lazy in (False, True):
        cluster = _trained(lazy, monkeypatch, 2, optimizer, average=True, constant=constant)
        manager = CheckpointManager(str(tmp_path / f"a-{lazy}"), max_to_keep=2, full_every=2)
        saved = [manager.save(cluster).path]  # type: ignore[arg-type]
        cluster.train(3, [9, 3000])
        saved.append(manager.save(cluster).path)  # type: ignore[arg-type]
        target = _cluster(lazy, monkeypatch, 1, optimizer, average=True, constant=constant, parts=(3, 2))
        target.train(7, [5, 6, 1500, 3000])  # rows built before the restore, some not in the checkpoint
        restore(target, saved[-1])  # type: ignore[arg-type]
        manager = CheckpointManager(str(tmp_path / f"b-{lazy}"), max_to_keep=2, full_every=2)
        for seed, rows in ((4, [3, 11, 4001]), (5, [11, 12]), (6, [13])):
            target.train(seed, rows)
            saved.append(manager.save(target).path)  # type: ignore[arg-type]
        assert [read_manifest(p).kind for p in saved] == ["full", "increment", "full", "increment", "full"]
        got[lazy] = [read_variables(p, slots=True) for p in saved] + [read_variables(saved[-1], moving_averages=True)]
    for eager, lazy_read in zip(got[False], got[True], strict=True):
        same_arrays(lazy_read, eager)


def test_increments_on_a_lazy_full_checkpoint_export_the_evaluator_and_warm_start_read_the_eager_values(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    got: dict[bool, list[str]] = {}
    for lazy in (False, True):
        cluster = _trained(lazy, monkeypatch, 2, "adagrad", emb=False)
        manager = CheckpointManager(str(tmp_path / f"run-{lazy}"), max_to_keep=10, full_every=10)
        saved = [manager.save(cluster).path]  # type: ignore[arg-type]
        for step in range(3):
            cluster.train(10 + step, [100 + step, 3, 2100 + step])
            saved.append(manager.save(cluster).path)  # type: ignore[arg-type]
        assert [read_manifest(p).kind for p in saved] == ["full"] + ["increment"] * 3
        got[lazy] = saved
    for eager, lazy in zip(got[False], got[True], strict=True):
        same_arrays(read_variables(lazy, slots=True), read_variables(eager, slots=True))
    restored = _cluster(True, monkeypatch, 1, "adagrad", emb=False)
    restore(restored, got[True][-1])  # type: ignore[arg-type]
    parts = restored.parts("weights")
    assert all(p.lazy is not None for p in parts)
    assert sum(p.lazy.count for p in parts) == len(set(TOUCHED) | {100, 101, 102, 2100, 2101, 2102})
    same_arrays(read_variables(_save(restored, tmp_path / "again"), slots=True), read_variables(got[False][-1], slots=True))
    for lazy in (False, True):
        export_model(got[lazy][-1], str(tmp_path / f"export-{lazy}"))
    same_arrays(load_file(str(tmp_path / "export-True" / "model.safetensors")),
          load_file(str(tmp_path / "export-False" / "model.safetensors")))
    evaluated = {lazy: load_checkpoint_model(got[lazy][0]).values for lazy in (False, True)}
    same_arrays(evaluated[True], evaluated[False])
    same_arrays(read_warm_start(got[True][0]), read_warm_start(got[False][0]))


@pytest.mark.parametrize("saved_ps,target_ps,optimizer,constant,average,seed,trained,increment", [
    (2, 1, "adagrad", False, True, 0, False, False),   # the same initializers: only the saved rows sent
    (1, 2, "ftrl", True, False, 0, False, True),       # constant initializers, read through an increment
    (2, 2, "momentum", False, True, 0, True, False),   # rows built on the target before: the checkpoint's values
    (2, 1, "adagrad", False, False, 1, False, False),  # another seed: every row sent, the table built whole
    (1, 1, "adam", False, True, 0, False, False),      # an eager target (Adam's): written whole
])
def test_a_warm_start_from_a_lazy_checkpoint_keeps_the_table_lazy_and_gives_the_whole_loads_values(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, saved_ps: int, target_ps: int, optimizer: str,
        constant: bool, average: bool, seed: int, trained: bool, increment: bool) -> None:
    """--warm-start from a checkpoint whose tables hold their built rows only: each ps task ends with the values,
    slots and moving averages the old whole-variable load (load_values of read_variables) gave, bit for bit, and
    where the model's initializer is the checkpoint's its lazy partitions have built only the checkpoint's rows."""
    source = _trained(True, monkeypatch, saved_ps, "adagrad", average=average, constant=constant)
    manager = CheckpointManager(str(tmp_path / "source"), max_to_keep=5, full_every=5)
    manager.save(source)  # type: ignore[arg-type]
    built = set(TOUCHED)
    if increment:
        source.train(3, [9, 3000])
        built |= {9, 3000}
        manager.save(source)  # type: ignore[arg-type]
    got = {}
    for new in (False, True):
        target = _cluster(True, monkeypatch, target_ps, optimizer, average=average, constant=constant,
                          parts=(3, 2), seed=seed)
        if trained:
            target.train(7, [5, 6, 1500])  # rows built before: they get the checkpoint's values, slots kept
        if new:
            assert warm_start(target, str(tmp_path / "source")) == ["bias", "emb", "weights"]  # type: ignore[arg-type]
        else:  # the old path: every variable read whole and sent whole
            load_values(target, read_warm_start(str(tmp_path / "source")), "warm start")  # type: ignore[arg-type]
        after = _save(target, tmp_path / f"after-{new}")
        got[new] = {**read_variables(after, slots=True),
                    **{f"{k}@average": v for k, v in read_variables(after, moving_averages=True).items()}}
        if new:
            for name in ("weights", "emb"):
                parts = target.parts(name)
                if optimizer == "adam" or seed:  # eager, or built whole: the old behaviour
                    assert all(p.lazy is None for p in parts), name
                else:
                    assert all(p.lazy is not None for p in parts), name
                    count = sum(p.lazy.count for p in parts)
                    assert count == len(built | ({5, 6, 1500} if trained else set())), name
    same_arrays(got[True], got[False])


def test_a_checkpoint_holding_every_row_still_restores_lazily_built_rows_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = _trained(True, monkeypatch, 1, "adagrad")
    monkeypatch.setattr(shard_snapshot, "_built_copy", lambda part: None)  # as before: every row stored
    old = _save(cluster, tmp_path / "old")
    monkeypatch.undo()
    assert _stored_rows(old, "emb") == ROWS and "built" not in read_manifest(old).variables["emb"]["partitions"][0]
    target = _cluster(True, monkeypatch, 2, "adagrad")
    restore(target, old)  # type: ignore[arg-type]
    same_arrays(read_variables(_save(target, tmp_path / "again"), slots=True), read_variables(old, slots=True))


def test_a_lazy_checkpoint_missing_its_initializer_or_initial_rows_is_refused_naming_file_and_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _save(_trained(True, monkeypatch, 1, "adagrad"), tmp_path / "ckpt")
    manifest_file = Path(path) / "manifest.json"
    original = manifest_file.read_text()
    data = json.loads(original)
    del data["variables"]["emb"]["partitions"][1]["initializer"]
    manifest_file.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"shard-00000-of-00001\.safetensors: variable 'emb' partition 1 .*"
                                              r"no initializer"):
        read_variables(path)
    manifest_file.write_text(original)
    shard = Path(path) / "shard-00000-of-00001.safetensors"
    tensors = load_file(str(shard))
    del tensors["emb/part_1@initial/accumulator"]
    save_file(tensors, str(shard))
    import hashlib

    data = json.loads(original)
    data["shards"][0]["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()
    manifest_file.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"shard-00000-of-00001\.safetensors: variable 'emb' partition 1 "
                                              r"has no tensor 'emb/part_1@initial/accumulator'"):
        read_variables(path, slots=True)


def test_an_increment_holding_a_restored_lazy_partition_whole_puts_back_the_rows_it_did_not_save(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    got: dict[bool, list[str]] = {}
    for lazy in (False, True):
        cluster = _cluster(lazy, monkeypatch, 1, "adagrad", emb=False)
        manager = CheckpointManager(str(tmp_path / f"run-{lazy}"), max_to_keep=10, full_every=10)
        first = manager.save(cluster).path  # type: ignore[arg-type]
        cluster.train(1, TOUCHED)
        trained = manager.save(cluster).path  # type: ignore[arg-type]
        restore(cluster, first)  # type: ignore[arg-type]  # every row back to its initial value
        cluster.train(2, [7])
        cluster.train(3, [7])
        last = manager.save(cluster).path  # type: ignore[arg-type]
        assert [read_manifest(p).kind for p in (first, trained, last)] == ["full", "increment", "increment"]
        got[lazy] = [first, trained, last]
    parts = read_manifest(got[True][-1]).variables["weights"]["partitions"]
    assert [p.get("built") for p in parts] == [1, 0]  # whole, as built rows: row 7 alone
    for eager, lazy_path in zip(got[False], got[True], strict=True):
        same_arrays(read_variables(lazy_path, slots=True), read_variables(eager, slots=True))
    target = _cluster(True, monkeypatch, 2, "adagrad", emb=False)
    restore(target, got[True][-1])  # type: ignore[arg-type]
    assert sum(p.lazy.count for p in target.parts("weights")) == 1
    same_arrays(read_variables(_save(target, tmp_path / "again"), slots=True), read_variables(got[False][-1], slots=True))


@pytest.mark.parametrize("rows,why", [(np.array([5, 3]), "not sorted distinct local rows"),
                                      (np.array([3, 2048]), "not sorted distinct local rows"),
                                      (np.array([3]), "1 rows loaded, but a value of shape")])
def test_a_load_of_saved_rows_that_do_not_fit_the_partition_is_refused_and_changes_nothing(
        monkeypatch: pytest.MonkeyPatch, rows: np.ndarray, why: str) -> None:
    from psflow.ps.protocol import LoadShardRequest
    from psflow.rpc.api import InvalidRequest

    cluster = _trained(True, monkeypatch, 1, "adagrad", emb=False)
    part = cluster.parts("weights")[0]
    before, count = part.value.copy(), part.lazy.count
    record = {"initializer": {"name": "random_normal", "stddev": 0.3, "seed": 5}, "shape": [ROWS, 1]}
    value = np.zeros((2, 1), np.float32)
    request = LoadShardRequest.build({"weights/part_0": value}, {"weights/part_0": {"accumulator": value}}, {},
                                     ["weights/part_0"],
                                     {"weights/part_0": (rows.astype(np.int64), record,
                                                         {"accumulator": np.zeros((1,), np.float32)})},
                                     restored_step=0)
    with pytest.raises(InvalidRequest, match=f"variable 'weights' partition 0 .*{why}"):
        cluster.call(0, request)
    assert part.value.tobytes() == before.tobytes() and part.lazy.count == count
