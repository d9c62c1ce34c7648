"""Incremental checkpoints (issue 29): a full checkpoint plus increments restores bit for bit what a full
checkpoint of the same step holds, onto any number of ps tasks; a failed save keeps the marks; rotation
keeps every checkpoint a kept increment needs. The ps tasks are in-process ParameterServices (no sockets)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from framed_ps import FramedPs, ps_cluster, same_arrays

import psflow.ps.lazy_rows as lazy_rows
from psflow.checkpoint.chain import checkpoint_chain
from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.restore import restore
from psflow.checkpoint.save import CheckpointManager
from psflow.checkpoint.variables import read_variables
from psflow.errors import CheckpointError
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, fixed_size_partitioner, replica_device_setter

pytestmark = pytest.mark.timeout(120)

OPTIMIZERS = {"adagrad": OptimizerSpec("adagrad", {"learning_rate": 0.5}),
              "adam": OptimizerSpec("adam", {"learning_rate": 0.01})}


class _Cluster(FramedPs):
    """A ParameterClient's surface over ``num_ps`` in-process services, calls through the real frame encoding."""

    def __init__(self, num_ps: int, optimizer: str = "adagrad", average: bool = False) -> None:
        cluster = ps_cluster(num_ps)
        vs = VariableSet(replica_device_setter(cluster=cluster))
        vs.get_variable("emb", (64, 3), partitioner=fixed_size_partitioner(3),
                        initializer={"name": "random_normal", "seed": 3})
        vs.get_variable("w", (4, 2), initializer={"name": "constant", "value": 0.5},
                        moving_average_decay=0.9 if average else None)
        vs.get_variable("b", ())
        super().__init__(cluster, vs.placements(), OPTIMIZERS[optimizer])

    def train(self, rng: np.random.Generator, rows: list[int] | None = None) -> None:
        """One step: sparse gradients on a few rows of ``emb`` (``rows`` or random ones), dense on ``w`` and ``b``."""
        wanted = np.array(rows if rows is not None else rng.choice(64, 5, replace=False), dtype=np.int64)
        per_task: dict[int, tuple[list[list[str]], dict[str, np.ndarray]]] = {t: ([], {}) for t in self.channels}
        for part in self.layout["emb"].partitions:
            local = wanted[(wanted >= part.row_start) & (wanted < part.row_stop)] - part.row_start
            if local.size:
                key = f"emb/part_{part.index}"
                entries, arrays = per_task[part.task]
                entries.append([key, "sparse"])
                arrays[f"g/{key}"] = rng.standard_normal((local.size, 3)).astype(np.float32)
                arrays[f"i/{key}"] = local
        for name, shape in (("w", (4, 2)), ("b", (1,))):
            part = self.layout[name].partitions[0]
            entries, arrays = per_task[part.task]
            entries.append([f"{name}/part_0", "dense"])
            arrays[f"g/{name}/part_0"] = np.asarray(rng.standard_normal(shape), dtype=np.float32)
        for task, (entries, arrays) in per_task.items():
            self.channels[task].call("Push", {"grads": entries, "step": task == 0, "step_hint": self.global_step()},
                                     arrays)


@pytest.mark.parametrize("optimizer,average,lazy", [("adagrad", False, False), ("adagrad", True, True),
                                                    ("adam", False, False)])
def test_full_plus_five_increments_equals_a_full_checkpoint(tmp_path: Path, optimizer: str, average: bool,
                                                            lazy: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if lazy:
        monkeypatch.setattr(lazy_rows, "LAZY_MIN_BYTES", 1)
    cluster, rng = _Cluster(2, optimizer, average), np.random.default_rng(7)
    if lazy:
        assert cluster.services[0].store.get("emb/part_0").lazy is not None
    manager = CheckpointManager(str(tmp_path / "inc"), max_to_keep=10, full_every=10)
    saved = []
    for _ in range(6):
        for _ in range(2):
            cluster.train(rng)
        saved.append(manager.save(cluster).path)  # type: ignore[arg-type]
    manifests = [read_manifest(p) for p in saved]
    assert [m.kind for m in manifests] == ["full"] + ["increment"] * 5
    assert [m.base for m in manifests[1:]] == [Path(p).name for p in saved[:-1]]
    assert [p for p, _ in checkpoint_chain(saved[-1])] == saved
    changed = [part.get("changed") for part in manifests[-1].variables["emb"]["partitions"]]
    # Two steps of 5 rows: not the partitions' rows (Adam's sparse update moves every row: saved whole).
    assert all(isinstance(n, int) and n <= 10 for n in changed) if optimizer == "adagrad" else not any(changed)
    full = CheckpointManager(str(tmp_path / "full"), full_every=1).save(cluster).path  # type: ignore[arg-type]
    assert read_manifest(full).kind == "full"
    want = read_variables(full, slots=True)
    same_arrays(read_variables(saved[-1], slots=True), want)
    inc_bytes = sum(s["bytes"] for s in manifests[-1].shards)
    full_bytes = sum(s["bytes"] for s in read_manifest(full).shards)
    assert inc_bytes < full_bytes if optimizer == "adagrad" else inc_bytes == full_bytes
    # Restored onto another number of ps tasks (1 and 3), every variable and slot is the full checkpoint's.
    for num_ps in (1, 3):
        other = _Cluster(num_ps, optimizer, average)
        restore(other, saved[-1])  # type: ignore[arg-type]
        assert other.global_step() == manifests[-1].global_step
        again = CheckpointManager(str(tmp_path / f"again{num_ps}")).save(other).path  # type: ignore[arg-type]
        same_arrays(read_variables(again, slots=True), want)


def _changed_rows(path: str) -> set[int]:
    """The rows of ``emb`` an increment holds (global indices)."""
    from safetensors.numpy import load_file

    manifest = read_manifest(path)
    rows: set[int] = set()
    for part in manifest.variables["emb"]["partitions"]:
        tensors = load_file(str(Path(path) / part["shard"]))
        local = tensors[f"emb/part_{part['index']}@changed_rows"]
        rows.update(int(r) + part["row_start"] for r in local)
    return rows


def test_a_failed_increment_keeps_the_marks_and_a_crash_leaves_the_previous_restorable(tmp_path: Path) -> None:
    cluster, rng = _Cluster(2), np.random.default_rng(1)
    directory = str(tmp_path)
    phase = {"fail": ""}

    def fault(name: str) -> None:
        if name == phase["fail"] == "manifest_written":
            raise CheckpointError("disk full (test)")
        if name == phase["fail"] == "shards_written":
            raise KeyboardInterrupt  # stands in for the process dying here

    manager = CheckpointManager(directory, full_every=10, fault=fault)
    first = manager.save(cluster).path  # type: ignore[arg-type]
    cluster.train(rng, rows=[1, 40])
    phase["fail"] = "manifest_written"
    with pytest.raises(CheckpointError):
        manager.save(cluster)  # type: ignore[arg-type]
    assert latest_checkpoint(directory) == first
    phase["fail"] = ""
    cluster.train(rng, rows=[2, 50])
    second = manager.save(cluster).path  # type: ignore[arg-type]
    assert read_manifest(second).kind == "increment" and read_manifest(second).base == Path(first).name
    assert _changed_rows(second) == {1, 2, 40, 50}  # the failed save's rows are still marked
    cluster.train(rng, rows=[3])
    third = manager.save(cluster).path  # type: ignore[arg-type]
    assert _changed_rows(third) == {3}  # a complete save is the next base
    cluster.train(rng, rows=[4])
    phase["fail"] = "shards_written"
    with pytest.raises(KeyboardInterrupt):
        manager.save(cluster)  # type: ignore[arg-type]
    assert latest_checkpoint(directory) == third
    want = read_variables(third, slots=True)
    restored = _Cluster(1)
    restore(restored, third)  # type: ignore[arg-type]
    same_arrays(read_variables(CheckpointManager(str(tmp_path / "x")).save(restored).path, slots=True),  # type: ignore[arg-type]
          want)


def test_rotation_keeps_every_checkpoint_a_kept_increment_needs(tmp_path: Path) -> None:
    cluster, rng = _Cluster(2), np.random.default_rng(2)
    directory = str(tmp_path)
    manager = CheckpointManager(directory, max_to_keep=2, full_every=3)
    names = []
    present = []
    for _ in range(7):
        cluster.train(rng)
        names.append(Path(manager.save(cluster).path).name)  # type: ignore[arg-type]
        present.append(sorted(p.name for p in tmp_path.glob("ckpt-*")))
    kinds = [read_manifest(str(tmp_path / n)).kind if (tmp_path / n).exists() else None for n in names]
    assert kinds[-1] == "full" and kinds[-2] == "increment"
    # saves: f1 i2 i3 f4 i5 i6 f7; the newest 2 are kept, with what their chains need.
    assert present[2] == sorted(names[:3])        # i2, i3 kept; i2's and i3's base f1 too
    assert present[3] == sorted(names[:4])        # i3 (needs f1, i2) and f4
    assert present[4] == sorted(names[3:5])       # f4, i5
    assert present[5] == sorted(names[3:6])       # i5, i6 (their chain: f4)
    assert present[6] == sorted(names[3:7])       # i6 (needs f4, i5) and f7
    pointer = json.loads((tmp_path / "checkpoint").read_text())
    assert pointer["latest"] == names[-1]
    for name in present[-1]:  # every checkpoint left is restorable
        read_variables(str(tmp_path / name), slots=True)


def test_an_increment_whose_base_is_gone_is_refused_naming_it(tmp_path: Path) -> None:
    import shutil

    cluster, rng = _Cluster(1), np.random.default_rng(3)
    manager = CheckpointManager(str(tmp_path), full_every=5)
    first = manager.save(cluster).path  # type: ignore[arg-type]
    cluster.train(rng)
    second = manager.save(cluster).path  # type: ignore[arg-type]
    shutil.rmtree(first)
    with pytest.raises(CheckpointError, match="increment of .*missing"):
        read_variables(second)
