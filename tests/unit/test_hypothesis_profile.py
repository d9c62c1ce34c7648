"""No hypothesis test depends on the machine's speed: CI's 2 busy cores must not fail a correct test.

tests/conftest.py loads a profile without hypothesis's 200 ms deadline per example and without its too_slow
health check; a test's own ``@settings(deadline=...)`` or ``suppress_health_check=[...]`` replaces the
profile's value, so none may bring either back.
"""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import HealthCheck, settings

TESTS = Path(__file__).resolve().parents[1]


def test_the_profile_has_no_deadline_and_no_too_slow_check() -> None:
    assert settings.default.deadline is None
    assert HealthCheck.too_slow in settings.default.suppress_health_check


def _settings_calls(tree: ast.AST) -> list[ast.Call]:
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name == "settings":
                calls.append(node)
    return calls


def test_no_test_brings_a_speed_bound_back() -> None:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for call in _settings_calls(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            for keyword in call.keywords:
                where = f"{path.relative_to(TESTS)}:{call.lineno}"
                if keyword.arg == "deadline" and not (isinstance(keyword.value, ast.Constant)
                                                      and keyword.value.value is None):
                    found.append(f"{where}: deadline={ast.unparse(keyword.value)}")
                if keyword.arg == "suppress_health_check" and "too_slow" not in ast.unparse(keyword.value):
                    found.append(f"{where}: suppress_health_check={ast.unparse(keyword.value)} lacks too_slow")
    assert found == []
