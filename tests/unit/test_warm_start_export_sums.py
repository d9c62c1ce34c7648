"""A warm start from a directory ``psflow export`` wrote reads its model.safetensors only once the bytes read are the
file its model.json names (psflow/checkpoint/warm_start.py ``read_warm_start``; the check is the one ``psflow
predict`` makes, psflow/checkpoint/export_files.py).

Before, the warm start read model.safetensors with no look at model.json: a warm start during another export into
the directory trained on whichever variables were there (a second export's beside the first's model.json), and
a damaged file (cut short, a bit flipped) was trained on or raised safetensors' own error. Now each is refused,
naming the directory and the file, before anything is sent to a ps task. Checkpoints and exports are real ones
(tests/unit/test_export_overwrite.py's in-process ps task, psflow.export.export_model).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from test_export_overwrite import _checkpoints
from test_export_sums import MIX, _after_reading

from psflow.checkpoint.warm_start import read_warm_start
from psflow.errors import CheckpointError
from psflow.export import export_model

pytestmark = pytest.mark.timeout(120)


def test_a_whole_export_warm_starts_with_its_values(tmp_path: Path) -> None:
    _, second = _checkpoints(tmp_path, average=False)
    out = str(tmp_path / "model")
    export_model(second, out)
    values = read_warm_start(out)
    assert sorted(values) == ["bias", "weights"] and values["weights"].shape == (16, 1)


def test_a_warm_start_during_another_export_is_refused_naming_the_file(tmp_path: Path) -> None:
    """model.json of step 1 read, then a second export replaces model.safetensors with step 3's variables."""
    first, second = _checkpoints(tmp_path, average=False)
    out = str(tmp_path / "model")
    export_model(first, out)
    with _after_reading("model.json", lambda: export_model(second, out)), \
            pytest.raises(CheckpointError, match=re.escape(f"{out}: model.safetensors") + ".*" + re.escape(MIX)):
        read_warm_start(out)  # before: step 3's variables, read as the export of step 1
    again = read_warm_start(out)  # the second export, whole
    assert sorted(again) == ["bias", "weights"]


@pytest.mark.parametrize("damage", [lambda b: b[:-1], lambda b: b[:-1] + bytes([b[-1] ^ 1]), lambda b: b[: len(b) // 2]],
                         ids=["cut-short-by-one", "one-bit", "truncated"])
def test_a_damaged_model_safetensors_is_refused_naming_it(tmp_path: Path, damage: Callable[[bytes], bytes]) -> None:
    _, second = _checkpoints(tmp_path, average=False)
    out = tmp_path / "model"
    export_model(second, str(out))
    file = out / "model.safetensors"
    file.write_bytes(damage(file.read_bytes()))
    with pytest.raises(CheckpointError, match=re.escape(f"{out}: model.safetensors") + ".*" + re.escape(MIX)):
        read_warm_start(str(out))


def test_an_export_being_rewritten_without_its_model_json_is_refused(tmp_path: Path) -> None:
    """An export into a directory removes its model.json first: model.safetensors alone is no export (yet)."""
    _, second = _checkpoints(tmp_path, average=False)
    out = tmp_path / "model"
    export_model(second, str(out))
    (out / "model.json").unlink()
    with pytest.raises(CheckpointError, match=re.escape(f"{out}") + r".*model\.json"):
        read_warm_start(str(out))
    # the file itself, named by the user, is read as a plain safetensors file (unchecked: no model.json names it)
    assert sorted(read_warm_start(str(out / "model.safetensors"))) == ["bias", "weights"]


def test_an_export_without_sums_an_older_psflow_wrote_still_warm_starts(tmp_path: Path) -> None:
    _, second = _checkpoints(tmp_path, average=False)
    out = tmp_path / "model"
    export_model(second, str(out))
    meta = json.loads((out / "model.json").read_text())
    del meta["files"]
    (out / "model.json").write_text(json.dumps(meta))
    values = read_warm_start(str(out))
    assert np.isfinite(values["weights"]).all()


def test_a_malformed_files_field_is_refused_naming_model_json(tmp_path: Path) -> None:
    _, second = _checkpoints(tmp_path, average=False)
    out = tmp_path / "model"
    export_model(second, str(out))
    meta = json.loads((out / "model.json").read_text())
    meta["files"]["model.safetensors"] = {"size": "big"}
    (out / "model.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=re.escape(str(out / "model.json")) + r".*field 'files'"):
        read_warm_start(str(out))
