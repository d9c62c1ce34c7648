"""A model named by a file (an export's model.json, a checkpoint's manifest) is data: its module is imported only
when the user names it too (issue 30, item 1); a user's own module that is missing its class or does not parse is
one line naming the module, the file and the line."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from psflow.export import load_model
from psflow.models.api import ModelConfig, ModelError
from psflow.models.registry import model_class, trusted_model

pytestmark = pytest.mark.timeout(60)

#: A module whose top level leaves a trace when it runs (the attack: code in the directory predict runs in).
EVIL = "import pathlib\npathlib.Path(__file__).with_name('RAN').write_text('ran')\nclass X:\n    pass\n"


@pytest.fixture
def modules(tmp_path: Path) -> Iterator[Path]:
    """A directory for test modules; every module imported from it is forgotten afterwards."""
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if (getattr(sys.modules[name], "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]
    if str(tmp_path) in sys.path:
        sys.path.remove(str(tmp_path))


def _export(directory: Path, model: str) -> Path:
    """A hand-written export of logistic regression (8 features) whose model.json names ``model``."""
    out = directory / "export"
    out.mkdir()
    save_file({"weights": np.zeros((8, 1), np.float32), "bias": np.zeros(1, np.float32)}, str(out / "model.safetensors"))
    meta = {"format": "psflow-model", "format_version": 2, "model": model,
            "model_config": ModelConfig(num_features=8).to_dict(),
            "data": {"format": "libsvm", "schema": None, "num_features": 8}, "variables": {}, "global_step": 7}
    (out / "model.json").write_text(json.dumps(meta))
    return out


def test_a_module_named_only_by_model_json_is_never_imported(modules: Path) -> None:
    (modules / "evilmod_a.py").write_text(EVIL)
    export = _export(modules, "evilmod_a:X")
    with pytest.raises(ModelError) as refused:
        load_model(str(export), search_path=str(modules))
    assert str(refused.value) == (
        f"{export / 'model.json'} names the model 'evilmod_a:X': psflow imports a module a file names (which runs "
        "its code) only when you name it yourself: if you trust module 'evilmod_a', pass --model evilmod_a:X")
    assert not (modules / "RAN").exists() and "evilmod_a" not in sys.modules
    # Another model named on the command line does not open the door either.
    with pytest.raises(ModelError, match=r"names the model 'evilmod_a:X'; --model names 'other:Y': "):
        load_model(str(export), search_path=str(modules), model="other:Y")
    assert not (modules / "RAN").exists()


@pytest.mark.parametrize("how", [{"model": "evilmod_b:X"}, {"trust_model_module": True}])
def test_the_user_naming_the_module_or_trusting_the_file_imports_it(modules: Path, how: dict[str, object]) -> None:
    (modules / "evilmod_b.py").write_text(EVIL)
    export = _export(modules, "evilmod_b:X")
    with pytest.raises(ModelError, match=r"evilmod_b:X is not a subclass of psflow.models.Model"):
        load_model(str(export), search_path=str(modules), **how)  # type: ignore[arg-type]
    assert (modules / "RAN").read_text() == "ran"  # imported: the user asked for it


def test_built_in_models_need_no_naming() -> None:
    for name in ("logistic", "fm", "psflow.models.logistic:LogisticRegression"):
        assert trusted_model(name, "model.json") == name
    assert trusted_model("nosuch", "model.json") == "nosuch"  # no module path: model_class refuses it by name
    assert trusted_model("mod:Class", "model.json", named="mod:Class") == "mod:Class"
    with pytest.raises(ModelError, match=r"model.json names the model 'mod:Class': "):
        trusted_model("mod:Class", "model.json", named="logistic")


def test_a_module_without_the_class_says_so(modules: Path) -> None:
    (modules / "plain_mod.py").write_text("class Other:\n    pass\n")
    with pytest.raises(ModelError) as refused:
        model_class("plain_mod:Missing", search_path=str(modules))
    assert str(refused.value) == (f"model 'plain_mod:Missing': module 'plain_mod' ({modules / 'plain_mod.py'}) "
                                  "has no class 'Missing'")


def test_a_module_that_does_not_parse_names_the_file_and_line(modules: Path) -> None:
    (modules / "broken_mod.py").write_text("import os\n\ndef (\n")
    with pytest.raises(ModelError) as refused:
        model_class("broken_mod:X", search_path=str(modules))
    assert str(refused.value).startswith(
        f"model 'broken_mod:X': module 'broken_mod' does not parse: {modules / 'broken_mod.py'}:3: ")
    assert "\n" not in str(refused.value)


def test_a_module_that_raises_as_it_runs_names_the_file_and_line(modules: Path) -> None:
    (modules / "raising_mod.py").write_text("x = 1\nraise RuntimeError('no GPU here')\n")
    with pytest.raises(ModelError) as refused:
        model_class("raising_mod:X", search_path=str(modules))
    assert str(refused.value) == (f"model 'raising_mod:X': importing module 'raising_mod' raised RuntimeError at "
                                  f"{modules / 'raising_mod.py'}:2: no GPU here")
