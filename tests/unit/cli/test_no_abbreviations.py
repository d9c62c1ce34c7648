"""A flag is matched whole: ``--sync`` is not taken for ``--sync-timeout``.

argparse's default matches any unique prefix of a long option. ``psflow train ... --sync`` (a TensorFlow user's
guess at sync mode) then read as ``--sync-timeout`` and failed with "argument --sync-timeout: expected one
argument", naming a flag the user never typed; a prefix followed by a value would have set that flag silently. Every
``psflow`` parser (the command's and each subcommand's) takes whole flags only, and names the one it does not know.
"""

from __future__ import annotations

import argparse

import pytest

from psflow.cli.main import build_parser

pytestmark = pytest.mark.timeout(60)


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.extend(_parsers(sub))
    return found


def test_a_prefix_is_not_taken_for_a_longer_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        build_parser().parse_args(["train", "--train", "data.txt", "--sync"])
    assert raised.value.code == 1
    err = capsys.readouterr().err
    assert "unrecognized arguments: --sync" in err, err
    assert "--sync-timeout" not in err, err


def test_a_prefix_with_a_value_does_not_set_the_longer_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--train", "data.txt", "--sync-time", "5"])
    assert "--sync-time" in capsys.readouterr().err


def test_every_psflow_parser_takes_whole_flags_only() -> None:
    parsers = _parsers(build_parser())
    assert len(parsers) > 5
    assert [p.prog for p in parsers if p.allow_abbrev] == []


def test_whole_flags_still_parse() -> None:
    args = build_parser().parse_args(["train", "--train", "data.txt", "--mode", "sync", "--sync-timeout", "5"])
    assert args.mode == "sync" and args.sync_timeout == 5
