"""A reader of an export (load_model, ``psflow predict``) during another export into the same directory, or two
exports at once: never one export's model.json with another's variables or averages.

Each file an export writes is replaced atomically, but nothing outside model.json ties them together: a reader
whose model.json read comes before a second export replaces model.safetensors (or moving_averages.safetensors)
read step 3's variables as the model of step 1. model.json now records each file's size and sha256, and
load_model checks the bytes it loads against them. The interleavings are made exact by a hook on the reader's
file reads that runs the second export at that point. Checkpoints are real ones (test_export_overwrite's).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy
from safetensors.numpy import save_file
from test_export_overwrite import _checkpoints

import psflow.export as export
from psflow import storage
from psflow.cli.main import main
from psflow.errors import CheckpointError
from psflow.export import export_model, load_model

pytestmark = pytest.mark.timeout(120)


@contextmanager
def _after_reading(name: str, then: Callable[[], None]) -> Iterator[None]:
    """Runs ``then`` once, right after the reader has read the file ``name`` (through psflow.storage, or
    safetensors' own local read), before the reader's next read."""
    fired = threading.Event()
    read_bytes, load_file = storage.read_bytes, safetensors.numpy.load_file

    def hooked(read: Callable[..., Any]) -> Callable[..., Any]:
        def reading(path: Any, *args: Any, **kw: Any) -> Any:
            got = read(path, *args, **kw)
            if os.path.basename(str(path)) == name and not fired.is_set():
                fired.set()  # first: the export ``then`` runs reads through this hook too
                then()
            return got
        return reading

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(storage, "read_bytes", hooked(read_bytes))
        patch.setattr(safetensors.numpy, "load_file", hooked(load_file))
        yield
    assert fired.is_set(), f"the reader never read {name}"


MIX = "written by another export meanwhile, or damaged: export again"


@pytest.mark.parametrize("average, moving_averages, between", [
    (False, False, "model.json"),                      # model.json of step 1, then step 3's variables
    (True, False, "model.json"),
    (True, True, "model.json"),
    (True, True, "model.safetensors"),                 # step 1's model.json and variables, step 3's averages
])
def test_a_reader_during_another_export_never_loads_a_mix(tmp_path: Path, average: bool, moving_averages: bool,
                                                          between: str) -> None:
    first, second = _checkpoints(tmp_path, average=average)
    out = str(tmp_path / "model")
    export_model(first, out)
    earlier = load_model(out, moving_averages=moving_averages)
    assert earlier.global_step == 1
    late = "model.safetensors" if between == "model.json" else export.AVERAGES_FILE
    with _after_reading(between, lambda: export_model(second, out)), \
            pytest.raises(CheckpointError, match=re.escape(f"{out}: {late}") + ".*" + re.escape(MIX)):
        load_model(out, moving_averages=moving_averages)  # on HEAD: loaded, global_step 1, step 3's values
    later = load_model(out, moving_averages=moving_averages)  # read again: the second export, whole
    assert later.global_step == 3
    assert not np.array_equal(later.values["bias"], earlier.values["bias"])


def test_two_exports_at_once_leave_one_whole_or_a_directory_that_is_refused(tmp_path: Path) -> None:
    """The second export's files land between the first's variables and its model.json: step 1's model.json
    names step 1's variables, the directory holds step 3's."""
    first, second = _checkpoints(tmp_path, average=True)
    out = str(tmp_path / "model")
    write = storage.write_atomically
    fired = threading.Event()

    def writing(path: str, data: bytes | memoryview, **kw: bool) -> None:
        write(path, data, **kw)
        if os.path.basename(path) == export.AVERAGES_FILE and not fired.is_set():
            fired.set()
            export_model(second, out)  # whole, then the first export's model.json over it

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(storage, "write_atomically", writing)
        export_model(first, out)
    assert json.loads((Path(out) / "model.json").read_text())["global_step"] == 1
    with pytest.raises(CheckpointError, match=re.escape(f"{out}: model.safetensors") + ".*" + re.escape(MIX)):
        load_model(out)
    export_model(second, out)
    assert load_model(out, moving_averages=True).global_step == 3


def test_model_json_records_each_file_s_size_and_sha256(tmp_path: Path) -> None:
    _, second = _checkpoints(tmp_path, average=True)
    out = tmp_path / "model"
    export_model(second, str(out))
    files = json.loads((out / "model.json").read_text())["files"]
    assert sorted(files) == ["model.safetensors", export.AVERAGES_FILE]
    for name, recorded in files.items():
        data = (out / name).read_bytes()
        assert recorded == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    export_model(second, str(out), moving_averages=True)  # averages in place: one file
    assert sorted(json.loads((out / "model.json").read_text())["files"]) == ["model.safetensors"]


@pytest.mark.parametrize("name, damage", [
    ("model.safetensors", lambda b: b[:-1]),                                        # cut short: its size
    ("model.safetensors", lambda b: b[:-1] + bytes([b[-1] ^ 1])),                   # one bit: its sum
    (export.AVERAGES_FILE, lambda b: b[:-1] + bytes([b[-1] ^ 1])),
])
def test_a_damaged_file_is_refused_naming_it(tmp_path: Path, name: str, damage: Callable[[bytes], bytes],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    _, second = _checkpoints(tmp_path, average=True)
    out = tmp_path / "model"
    export_model(second, str(out))
    (out / name).write_bytes(damage((out / name).read_bytes()))
    (tmp_path / "d.libsvm").write_text("1 3:1\n")
    assert main(["predict", str(out), str(tmp_path / "d.libsvm"), "--moving-averages"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"psflow predict: error: {out}: {name} ") and err.count("\n") == 1, err
    assert MIX in err, err


def test_an_export_without_sums_still_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An export written by a psflow before the sums (model.json without ``files``)."""
    save_file({"weights": np.zeros((8, 1), np.float32), "bias": np.zeros(1, np.float32)},
              str(tmp_path / "model.safetensors"))
    (tmp_path / "model.json").write_text(json.dumps({
        "format": "psflow-model", "format_version": 2, "model": "logistic", "global_step": 7,
        "model_config": {"num_features": 8}, "data": {"format": "libsvm", "num_features": 8}}))
    (tmp_path / "d.libsvm").write_text("1 3:1\n")
    assert main(["predict", str(tmp_path), str(tmp_path / "d.libsvm")]) == 0
    assert capsys.readouterr().out == "0.5\n"
    assert load_model(str(tmp_path)).global_step == 7


@pytest.mark.parametrize("files, says", [
    (5, "field 'files' is int 5"),
    ({"model.safetensors": {"size": "1", "sha256": "ab"}}, "field 'files' says 'model.safetensors' is"),
    ({"model.safetensors": {"size": 1}}, "field 'files' says 'model.safetensors' is"),
])
def test_a_files_field_of_another_shape_is_one_line(tmp_path: Path, files: Any, says: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    save_file({"weights": np.zeros((8, 1), np.float32), "bias": np.zeros(1, np.float32)},
              str(tmp_path / "model.safetensors"))
    (tmp_path / "model.json").write_text(json.dumps({
        "format": "psflow-model", "format_version": 2, "model": "logistic", "global_step": 7,
        "model_config": {"num_features": 8}, "files": files}))
    (tmp_path / "d.libsvm").write_text("1 3:1\n")
    assert main(["predict", str(tmp_path), str(tmp_path / "d.libsvm")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"psflow predict: error: {tmp_path / 'model.json'}: {says}") and err.count("\n") == 1, err
    assert "not a model.json psflow export wrote" in err


def test_a_reader_during_another_export_in_an_object_store_never_loads_a_mix(tmp_path: Path,
                                                                               object_store: str) -> None:
    first, second = _checkpoints(tmp_path, average=True)
    out = f"{object_store}/model"
    export_model(first, out)
    assert load_model(out, moving_averages=True).global_step == 1
    with _after_reading("model.safetensors", lambda: export_model(second, out)), \
            pytest.raises(CheckpointError, match=re.escape(f"{out}: {export.AVERAGES_FILE}") + ".*" + re.escape(MIX)):
        load_model(out, moving_averages=True)
    with _after_reading("model.json", lambda: export_model(first, out)), \
            pytest.raises(CheckpointError, match=re.escape(f"{out}: model.safetensors") + ".*" + re.escape(MIX)):
        load_model(out)
    assert load_model(out, moving_averages=True).global_step == 1
