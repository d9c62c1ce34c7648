"""The ``psflow`` command's argument parser: a usage error is one line naming the flag, exit status 1; flags are
matched whole."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

__all__ = ["CommandParser"]


class CommandParser(argparse.ArgumentParser):
    """Usage errors as one line naming the flag, exit status 1 (as every other error); ``--help`` has the usage.

    A flag is matched whole (``allow_abbrev`` off, also for every subcommand's parser, which argparse makes of this
    class): argparse's default took any unique prefix, so ``--sync`` was read as ``--sync-timeout`` (failing with an
    error naming a flag the user never typed) and a prefix with a value set a longer flag silently. An unknown flag
    is named as unrecognized."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(1, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
