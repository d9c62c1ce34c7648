"""The README's CLI reference is ``psflow train``'s parser: every flag a row, every choice listed (issue 30, item 8).

The table is read from README.md (its "CLI reference (`psflow train`)" section): the flags of a row are the
``--flags`` of its first cell, and a ``--flag {a,b,c}`` there lists that flag's choices. A flag added to the
parser without a row, a row naming a flag the parser lacks, or a choice left out of a row fails here.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from psflow.cli.main import build_parser

pytestmark = pytest.mark.timeout(60)

README = Path(__file__).resolve().parents[3] / "README.md"
SECTION = "### CLI reference (`psflow train`)"
FLAG = re.compile(r"(--[a-z][a-z0-9-]*)(?: \{([^}]*)\})?")


def _table_first_cells() -> list[str]:
    text = README.read_text(encoding="utf-8")
    assert SECTION in text, f"README.md has no section {SECTION!r}"
    lines = text.split(SECTION, 1)[1].lstrip("\n").splitlines()
    rows = []
    for line in lines[2:]:  # the header and the |---| line
        if not line.startswith("|"):
            break
        rows.append(line.split(" | ", 1)[0].lstrip("| "))
    return rows


def _readme_flags() -> dict[str, set[str] | None]:
    """Each flag of the table's first cells: its listed choices, or None where the row lists none."""
    flags: dict[str, set[str] | None] = {}
    for cell in _table_first_cells():
        for flag, choices in FLAG.findall(cell):
            listed = set(choices.split(",")) if choices else None
            flags[flag] = listed if flags.get(flag) is None else flags[flag]
    return flags


def _train_actions() -> dict[str, argparse.Action]:
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    train = sub.choices["train"]
    return {option: action for action in train._actions if action.help != argparse.SUPPRESS
            for option in action.option_strings if option.startswith("--") and option != "--help"}


def test_the_table_is_read() -> None:
    rows = _table_first_cells()
    assert len(rows) >= 40 and rows[0].startswith("`--train")
    assert _readme_flags()["--mode"] == {"async", "sync", "ssp"}


def test_every_flag_of_psflow_train_has_a_row_and_every_row_a_flag() -> None:
    parser, readme = set(_train_actions()), set(_readme_flags())
    assert not parser - readme, f"flags of psflow train without a row in README.md's CLI table: {sorted(parser - readme)}"
    assert not readme - parser, f"rows of README.md's CLI table naming no flag of psflow train: {sorted(readme - parser)}"


def test_a_row_lists_every_choice_of_its_flag() -> None:
    readme = _readme_flags()
    for flag, action in _train_actions().items():
        if action.choices is None:
            continue
        choices = {str(c) for c in action.choices}
        assert readme.get(flag) == choices, (f"README.md's CLI table: want `{flag} {{{','.join(map(str, action.choices))}}}`"
                                             f", it lists {readme.get(flag)}")
