"""Optional extras (psflow/extras.py): a feature whose library is missing stops with one line naming the extra.

A missing library is simulated with ``sys.modules[name] = None`` (``import name`` then raises
ModuleNotFoundError): in this process for matplotlib and kazoo, in a child process for PyTorch
(psflow.torch's modules may already be imported here, with PyTorch).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support import A9A, REPO

from psflow.cli.main import main
from psflow.coord import BackendUnavailableError, CoordinationConfig
from psflow.extras import MissingExtraError, extra_for, require
from psflow.train.config import ConfigError


def _block(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def test_require_imports_an_installed_module() -> None:
    assert require("json", "plots", "plots") is sys.modules["json"]


def test_require_names_the_extra_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    _block(monkeypatch, "matplotlib", "kazoo", "kazoo.client")
    with pytest.raises(MissingExtraError) as info:
        require("matplotlib", "plots", "plots", plural=True)
    assert str(info.value) == "plots need matplotlib: pip install 'psflow[plots]'"
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ImportError)
    assert (info.value.name, info.value.extra) == ("matplotlib", "plots") and extra_for(info.value) == "plots"
    with pytest.raises(MissingExtraError, match=r"^--coordination zookeeper needs kazoo: pip install 'psflow\[zookeeper\]'$"):
        require("kazoo.client", "zookeeper", "--coordination zookeeper")  # a submodule: the top package is named


def test_a_broken_installed_library_is_not_called_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "psflow_test_broken_lib").mkdir()
    (tmp_path / "psflow_test_broken_lib" / "__init__.py").write_text("import psflow_test_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as info:
        require("psflow_test_broken_lib", "plots", "plots")
    assert not isinstance(info.value, MissingExtraError) and info.value.name == "psflow_test_no_such_dependency"
    assert extra_for(info.value) is None


def test_psflow_report_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    _block(monkeypatch, "matplotlib", "matplotlib.pyplot")
    assert main(["report", str(tmp_path)]) == 1
    assert capsys.readouterr().err == "psflow report: error: plots need matplotlib: pip install 'psflow[plots]'\n"


def test_psflow_train_with_zookeeper_coordination_without_kazoo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    _block(monkeypatch, "kazoo", "kazoo.client")
    code = main(["train", "--train", str(A9A), "--num-features", "124", "--coordination", "zookeeper",
                 "--zookeeper", "127.0.0.1:9", "--output", str(tmp_path / "run")])
    assert code == 1
    assert capsys.readouterr().err == (
        "psflow train: error: --coordination zookeeper needs kazoo: pip install 'psflow[zookeeper]'\n")
    assert not (tmp_path / "run").exists()  # refused before anything started


def test_zookeeper_backend_without_kazoo_is_unavailable_with_the_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    _block(monkeypatch, "kazoo", "kazoo.client", "kazoo.protocol", "kazoo.protocol.states")
    from psflow.coord.zookeeper import ZooKeeperBackend

    with pytest.raises(BackendUnavailableError, match=r"^--coordination zookeeper needs kazoo: pip install 'psflow\[zookeeper\]'$"):
        ZooKeeperBackend(CoordinationConfig("zookeeper", "127.0.0.1:9"))


def test_psflow_train_with_a_torch_model_without_pytorch(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "from psflow.cli.main import main\n"
            f"sys.exit(main(['train', '--train', {str(A9A)!r}, '--model', 'wide_deep', '--output', {str(tmp_path / 'run')!r}]))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=str(REPO))
    assert r.returncode == 1, r
    assert r.stderr == "psflow train: error: model 'wide_deep' needs torch: pip install 'psflow[torch]'\n", r
    code = "import sys; sys.modules['torch'] = None\nimport psflow.torch\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=str(REPO))
    assert r.returncode == 1 and "MissingExtraError: psflow.torch needs torch: pip install 'psflow[torch]'" in r.stderr, r
