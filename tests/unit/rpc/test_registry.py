"""Carriers by name (psflow.rpc.registry): lazy, no import side effects, a clear error for an unknown name.

Also the layering the registry exists for: the interface (psflow.rpc.api)
imports no carrier library, and no psflow module imports the gRPC server
module for a type.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import psflow
from psflow.rpc import registry
from psflow.rpc.api import ConnectConfig, ServeConfig

pytestmark = pytest.mark.timeout(120)

PSFLOW = Path(psflow.__file__).parent


def test_known_carriers_are_listed_sorted() -> None:
    assert registry.carrier_names() == ["grpc", "tcp"]
    assert registry.carrier_names(server=True) == ["grpc", "tcp"]


def test_an_unknown_carrier_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"^unknown carrier 'quic' \(known: grpc, tcp\)$"):
        registry.open_channel("quic", "/job:ps/task:0", "127.0.0.1:1", "psflow.Test", ConnectConfig())
    with pytest.raises(ValueError, match=r"^unknown carrier 'quic' \(known: grpc, tcp\)$"):
        registry.serve("quic", ServeConfig("/job:ps/task:0", "127.0.0.1:0", {}))


@pytest.mark.parametrize("target", ["psflow.rpc.tcp", "psflow.rpc.tcp:", ":open_channel", "a:b:c"])
def test_a_target_must_name_module_and_callable(target: str) -> None:
    with pytest.raises(ValueError, match="must be 'module:callable'"):
        registry.register_carrier("x", client=target)
    assert "x" not in registry.carrier_names()


def test_registering_imports_nothing_and_the_name_is_then_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "CLIENT_CARRIERS", dict(registry.CLIENT_CARRIERS))
    registry.register_carrier("later", client="psflow_no_such_carrier:open_channel")
    assert "later" in registry.carrier_names()
    with pytest.raises(ModuleNotFoundError, match="psflow_no_such_carrier"):  # imported on first use only
        registry.open_channel("later", "/job:ps/task:0", "127.0.0.1:1", "psflow.Test", ConnectConfig())


def test_the_tcp_carrier_refuses_tls_before_anything_is_opened() -> None:
    from psflow.rpc.tls import TlsConfig
    tls = TlsConfig(root_certificates=b"not used")
    with pytest.raises(ValueError, match=r"/job:ps/task:1: the tcp transport has no TLS"):
        registry.open_channel("tcp", "/job:ps/task:1", "127.0.0.1:1", "psflow.Test", ConnectConfig(tls=tls))
    with pytest.raises(ValueError, match=r"/job:ps/task:1: the tcp transport has no TLS"):
        registry.serve("tcp", ServeConfig("/job:ps/task:1", "127.0.0.1:0", {"psflow.Test": {}}, tls=tls))


@pytest.mark.parametrize("module", ["psflow.rpc.api", "psflow.rpc.registry", "psflow.rpc.inprocess",
                                    "psflow.rpc.tcp_server"])
def test_the_interface_and_the_registry_do_not_import_grpc(module: str) -> None:
    code = f"import sys, {module}; print('grpc' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False", f"importing {module} imports grpc"


def test_no_psflow_module_imports_the_grpc_server_module() -> None:
    """Handler and Reply live in psflow.rpc.api; the gRPC server is reached through the registry."""
    offenders = []
    for path in sorted(PSFLOW.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if any(n == "psflow.rpc.grpc_server" for n in names):
                offenders.append(f"{path.relative_to(PSFLOW.parent)}:{node.lineno}")
    assert not offenders, f"import Handler/Reply from psflow.rpc.api, a server through psflow.rpc.registry: {offenders}"
