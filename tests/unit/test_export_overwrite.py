"""``psflow export`` into a directory that holds an export already: the new export whole, or no export at all.

An export writes model.safetensors, then moving_averages.safetensors (a checkpoint with moving averages), then
model.json, each atomically. Over an earlier export, a write that fails part-way (a full disk, a Ctrl-C) must not
leave the new variables beside the earlier model.json (its global_step, its averages): that directory loads as a
valid model that was never trained. Checkpoints are real ones (CheckpointManager over in-process ps services).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
from framed_ps import FramedPs, ps_cluster

import psflow.export as export
from psflow import storage
from psflow.checkpoint.save import CheckpointManager
from psflow.errors import CheckpointError
from psflow.export import export_model, load_model
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter

pytestmark = pytest.mark.timeout(120)

FEATURES = 16


class _Ps(FramedPs):
    """One in-process ps task holding logistic regression's ``weights`` (averaged or not) and ``bias``."""

    def __init__(self, *, average: bool) -> None:
        cluster = ps_cluster(1)
        vs = VariableSet(replica_device_setter(cluster=cluster))
        vs.get_variable("weights", (FEATURES, 1), moving_average_decay=0.9 if average else None)
        vs.get_variable("bias", (1,))
        super().__init__(cluster, vs.placements(), OptimizerSpec("sgd", {"learning_rate": 0.5}))

    def train(self, seed: int) -> None:
        grads = np.random.default_rng(seed).standard_normal(FEATURES + 1).astype(np.float32)
        self.channels[0].call("Push", {"grads": [["weights/part_0", "dense"], ["bias/part_0", "dense"]],
                                       "step": True, "step_hint": self.global_step()},
                              {"g/weights/part_0": grads[:FEATURES, None], "g/bias/part_0": grads[FEATURES:]})


def _checkpoints(tmp_path: Path, *, average: bool) -> tuple[str, str]:
    """Two checkpoints of one run: after 1 step, after 3."""
    ps, manager = _Ps(average=average), CheckpointManager(str(tmp_path / f"ckpt-{average}"))
    ps.train(1)
    first = manager.save(ps).path  # type: ignore[arg-type]
    ps.train(2)
    ps.train(3)
    return first, manager.save(ps).path  # type: ignore[arg-type]


def _failing(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """storage.write_atomically fails on the file ``name`` (as on a full disk); other files are written."""
    write = storage.write_atomically

    def failing(path: str, data: bytes | memoryview, **kw: bool) -> None:
        if os.path.basename(path) == name:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        write(path, data, **kw)

    monkeypatch.setattr(export.storage, "write_atomically", failing)


@pytest.mark.parametrize("average, fails", [(True, export.AVERAGES_FILE), (True, "model.json"),
                                            (False, "model.json")])
def test_an_export_that_fails_over_an_earlier_one_leaves_no_model_that_loads(
        tmp_path: Path, average: bool, fails: str) -> None:
    first, second = _checkpoints(tmp_path, average=average)
    out = str(tmp_path / "model")
    export_model(first, out)
    earlier = load_model(out)
    assert earlier.global_step == 1
    with pytest.MonkeyPatch.context() as patch, pytest.raises(OSError, match="No space left"):
        _failing(patch, fails)
        export_model(second, out)
    with pytest.raises(CheckpointError, match=f"{out}: not an exported psflow model"):
        load_model(out)  # on HEAD: step 1's model.json over step 3's variables, loaded as step 1's model
    export_model(second, out)  # the next export succeeds and is the second checkpoint's, whole
    again = load_model(out, moving_averages=average)
    assert again.global_step == 3
    assert not np.array_equal(again.values["bias"], earlier.values["bias"])


def test_an_export_without_averages_over_one_with_them_leaves_no_averages_file(tmp_path: Path) -> None:
    _, averaged = _checkpoints(tmp_path, average=True)
    _, plain = _checkpoints(tmp_path, average=False)
    out = tmp_path / "model"
    export_model(averaged, str(out))
    assert (out / export.AVERAGES_FILE).exists()
    export_model(plain, str(out))
    assert sorted(os.listdir(out)) == ["model.json", "model.safetensors"]  # on HEAD: the earlier averages stayed
    with pytest.raises(CheckpointError, match="holds no moving averages"):
        load_model(str(out), moving_averages=True)


def test_an_export_that_fails_over_an_earlier_one_in_an_object_store_leaves_no_model_that_loads(
        tmp_path: Path, object_store: str) -> None:
    first, second = _checkpoints(tmp_path, average=True)
    out = f"{object_store}/model"
    export_model(first, out)
    assert load_model(out, moving_averages=True).global_step == 1
    with pytest.MonkeyPatch.context() as patch, pytest.raises(OSError, match="No space left"):
        _failing(patch, "model.json")
        export_model(second, out)
    with pytest.raises(CheckpointError, match="not an exported psflow model"):
        load_model(out)
    export_model(second, out)
    assert load_model(out, moving_averages=True).global_step == 3
