"""docs/architecture.md names only what exists, and its picture is what scripts/layers_diagram.py draws.

Every ``psflow.x.y`` dotted name in the page resolves to a module, or to a name defined in one (a class's
method included), read from the source (nothing imported); every ``psflow/x/y.py`` path is a file of the
tree. docs/layers.svg is the script's output byte for byte, and the script draws pyproject.toml's layers
contract (a package of the contract without a job written in the script is refused there).
"""

from __future__ import annotations

import ast
import re
import runpy
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"
DOTTED = re.compile(r"\bpsflow(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"\bpsflow/[\w/]+\.(?:py|c|pyi)\b")
NAME = re.compile(r"`([A-Z]\w*)(?:\.(\w+))?`")  # `ClassName` or `ClassName.method`


@cache
def _tree(module: Path) -> ast.Module:
    return ast.parse(module.read_text())


def _module_file(parts: list[str]) -> Path | None:
    base = REPO.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _defines(body: list[ast.stmt], name: str) -> ast.stmt | None:
    """The statement of ``body`` that binds ``name`` (a def, a class, an assignment or an import)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return node
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name).split(".")[0] == name for a in node.names):
                return node
        if isinstance(node, (ast.If, ast.Try)):  # names bound under `if TYPE_CHECKING:` or `try: import`
            inner = _defines(node.body, name)
            if inner is not None:
                return inner
    return None


def resolve(dotted: str) -> bool:
    """Whether ``dotted`` is a psflow module, or a module's name, or a method of a module's class."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = _module_file(parts[:cut])
        if module is None:
            continue
        rest = parts[cut:]
        body: list[ast.stmt] = _tree(module).body
        for i, name in enumerate(rest):
            node = _defines(body, name)
            if node is None:
                return False
            if i + 1 < len(rest):
                if not isinstance(node, ast.ClassDef):
                    return False
                body = node.body
        return True
    return False


def _all_defined() -> set[str]:
    """Every class, function and class method name defined anywhere in psflow (for the page's bare names)."""
    names: set[str] = set()
    for path in (REPO / "psflow").rglob("*.py"):
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names.update(f"{node.name}.{m.name}" for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return names


def test_every_dotted_name_in_the_page_exists() -> None:
    names = sorted(set(DOTTED.findall(DOC.read_text())))
    assert names, "docs/architecture.md names no psflow.x module: did the pattern break?"
    missing = [n for n in names if not resolve(n)]
    assert not missing, f"docs/architecture.md names what psflow does not have: {missing}"


def test_every_path_in_the_page_exists() -> None:
    paths = sorted(set(PATH.findall(DOC.read_text())))
    assert len(paths) > 5
    missing = [p for p in paths if not (REPO / p).is_file()]
    assert not missing, f"docs/architecture.md names files that are not in the tree: {missing}"


def test_every_class_and_method_named_in_the_page_exists() -> None:
    defined = _all_defined()
    named = {m.group(1) + (f".{m.group(2)}" if m.group(2) else "") for m in NAME.finditer(DOC.read_text())}
    named -= {"TF_CONFIG"}  # an environment variable, not a class
    missing = sorted(n for n in named if n not in defined)
    assert not missing, f"docs/architecture.md names classes or methods psflow does not define: {missing}"


@pytest.mark.parametrize("bad", ["psflow.ps.no_such_module", "psflow.ps.service.NoSuchClass",
                                 "psflow.ps.service.ParameterService.no_such_method"])
def test_a_name_that_does_not_exist_is_caught(bad: str) -> None:
    assert not resolve(bad)
    assert resolve("psflow.ps.service.ParameterService") and resolve("psflow.ps.protocol")


def test_the_layers_picture_is_the_scripts_output_of_the_contract() -> None:
    script = runpy.run_path(str(REPO / "scripts" / "layers_diagram.py"))
    assert (REPO / "docs" / "layers.svg").read_text() == script["diagram"](), (
        "docs/layers.svg differs from what scripts/layers_diagram.py writes: run it and commit both")
    packages = {p for layer in script["layers"]() for p in layer}
    assert {"cli", "train", "ps", "rpc", "errors"} <= packages


def test_the_page_shows_the_picture_and_the_readme_links_the_page() -> None:
    assert "(layers.svg)" in DOC.read_text()
    assert "(docs/architecture.md)" in (REPO / "README.md").read_text()
