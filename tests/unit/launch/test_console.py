"""Expected errors are one line; gRPC's C-core stays quiet unless --verbose, set before grpc is imported."""

from __future__ import annotations

import subprocess
import sys

from psflow.data import BadRecordError, DataError
from psflow.launch.console import expected_errors, quiet_grpc, wants_verbose
from psflow.rpc.api import ListenError, RpcError
from psflow.train.config import ConfigError


def test_quiet_grpc_sets_none_unless_verbose_and_a_value_set_wins() -> None:
    env: dict[str, str] = {}
    quiet_grpc(env, verbose=False)
    assert env == {"GRPC_VERBOSITY": "NONE"}
    env = {}
    quiet_grpc(env, verbose=True)
    assert env == {}
    env = {"GRPC_VERBOSITY": "debug", "GRPC_TRACE": "http"}
    quiet_grpc(env, verbose=False)
    assert env == {"GRPC_VERBOSITY": "debug", "GRPC_TRACE": "http"}


def test_wants_verbose_reads_the_flag_and_its_abbreviations_before_a_double_dash() -> None:
    assert wants_verbose(["train", "--train", "x", "--verbose"])
    assert wants_verbose(["train", "--verb"])
    assert not wants_verbose(["train", "--ver"])  # too short to be sure (argparse would refuse it too)
    assert not wants_verbose(["train", "--", "--verbose"])
    assert not wants_verbose(["train", "--quiet"])


def test_expected_errors_are_the_users_to_fix() -> None:
    expected = expected_errors()
    assert all(issubclass(e, expected) for e in (DataError, BadRecordError, ConfigError, ListenError))
    assert not issubclass(RpcError, expected) and not issubclass(ValueError, expected)


def test_the_cli_module_does_not_import_grpc() -> None:
    """main() must set GRPC_VERBOSITY before grpc is imported (gRPC reads it then, once)."""
    code = "import sys, psflow.launch.cli; print('grpc' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False", "a module-level import of psflow.launch.cli imports grpc: import it in the " \
                                        "function that uses it (see the module docstring)"
