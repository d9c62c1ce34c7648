"""The ``psflow`` command's argument parser: a usage error is one line naming the flag, exit status 1."""

from __future__ import annotations

import argparse
from typing import NoReturn

__all__ = ["CommandParser"]


class CommandParser(argparse.ArgumentParser):
    """Usage errors as one line naming the flag, exit status 1 (as every other error); ``--help`` has the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(1, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
