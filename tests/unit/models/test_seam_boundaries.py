"""The runtime names no model's variables; models never import the runtime."""

from __future__ import annotations

import re
from pathlib import Path

PSFLOW = Path(__file__).resolve().parents[3] / "psflow"


def test_no_module_outside_the_models_names_their_variables() -> None:
    offenders = [f"{path.relative_to(PSFLOW.parent)}:{n}" for path in PSFLOW.rglob("*.py")
                 if PSFLOW / "models" not in path.parents
                 for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"\"(weights|bias)\"", line)]
    assert offenders == []


def test_models_do_not_import_the_runtime() -> None:
    runtime = re.compile(r"^\s*(from|import) psflow\.(train|launch|rpc|server|coord)\b", re.M)
    offenders = [str(path.name) for path in (PSFLOW / "models").glob("*.py") if runtime.search(path.read_text())]
    assert offenders == []
