"""``psflow server``'s --tls-* flags: parsing, and one line naming the flag and file for each bad input."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from certs import HostFiles, ca_and_host_certs, write_host_files

from psflow.cli.main import build_parser, main
from psflow.cli.tls_flags import tls_config
from psflow.train.config import ConfigError

PS = "/job:ps/task:0"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, HostFiles]:
    """``a`` and ``b`` signed by one CA; ``rogue`` by another."""
    base = tmp_path_factory.mktemp("pki")
    files = write_host_files(base / "ca", {"a": "127.0.0.1", "b": "127.0.0.1"})
    files |= write_host_files(base / "other", {"rogue": "127.0.0.1"}, ca_name="another-ca")
    return files


def _args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["server", *flags])


def _tls(*flags: str, task: str = PS, serves: bool = True) -> object:
    return tls_config(_args(*flags), task=task, serves=serves)


def test_no_flag_no_tls() -> None:
    assert _tls() is None


def test_the_files_are_read_into_the_config(pki: dict[str, HostFiles]) -> None:
    a = pki["a"]
    tls = tls_config(_args(*a.flags()), task=PS, serves=True)
    assert tls is not None
    assert tls.cert_chain == a.cert.read_bytes() and tls.private_key == a.key.read_bytes()
    assert tls.root_certificates == a.ca.read_bytes() and tls.require_client_auth
    assert "BEGIN" not in repr(tls)  # no key material in a repr
    plain = tls_config(_args(*a.flags(require_client_auth=False)), task=PS, serves=True)
    assert plain is not None and not plain.require_client_auth


def test_a_client_that_does_not_serve_may_have_only_the_ca(pki: dict[str, HostFiles]) -> None:
    tls = tls_config(_args("--tls-ca", str(pki["a"].ca)), task="/job:client/task:0", serves=False)
    assert tls is not None and tls.cert_chain is None and tls.root_certificates == pki["a"].ca.read_bytes()


def test_the_flags_are_psflow_servers_only() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--train", "x", "--tls-cert", "c.pem"])


def _refused(flags: list[str], *expected: str, serves: bool = True, task: str = PS) -> str:
    with pytest.raises(ConfigError) as e:
        tls_config(_args(*flags), task=task, serves=serves)
    message = str(e.value)
    assert "\n" not in message
    for part in expected:
        assert part in message, message
    return message


def test_missing_and_unreadable_files_are_named(pki: dict[str, HostFiles], tmp_path: Path) -> None:
    a = pki["a"]
    missing = tmp_path / "nope.crt"
    _refused(["--tls-cert", str(missing), "--tls-key", str(a.key)], f"--tls-cert {missing}", "cannot read",
             "No such file")
    _refused(["--tls-cert", str(a.cert), "--tls-key", str(tmp_path)], f"--tls-key {tmp_path}", "cannot read")
    _refused([*a.flags(), "--tls-ca", str(missing)], f"--tls-ca {missing}", "cannot read")
    _refused(["--tls-cert", "", "--tls-key", str(a.key)], "--tls-cert : cannot read")  # an empty path is no path


def test_files_that_are_not_pem_are_named(pki: dict[str, HostFiles], tmp_path: Path) -> None:
    a = pki["a"]
    der = tmp_path / "cert.der"
    der.write_bytes(b"\x30\x82\x01\x0a" + bytes(range(256)))
    _refused(["--tls-cert", str(der), "--tls-key", str(a.key)], f"--tls-cert {der}", "not a PEM certificate")
    broken = tmp_path / "broken.crt"
    broken.write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")
    _refused(["--tls-cert", str(broken), "--tls-key", str(a.key)], f"--tls-cert {broken}", "does not parse")
    _refused(["--tls-cert", str(a.cert), "--tls-key", str(a.cert)], f"--tls-key {a.cert}", "not a PEM private key")
    _refused(["--tls-cert", str(a.cert), "--tls-key", str(a.key), "--tls-ca", str(a.key)], f"--tls-ca {a.key}",
             "not a PEM certificate")
    garbled = tmp_path / "garbled.key"
    garbled.write_text("-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n")
    _refused(["--tls-cert", str(a.cert), "--tls-key", str(garbled)], f"--tls-key {garbled}", "does not load")


def test_a_key_that_does_not_match_the_certificate_is_named(pki: dict[str, HostFiles]) -> None:
    a, b = pki["a"], pki["b"]
    _refused(["--tls-cert", str(a.cert), "--tls-key", str(b.key)], f"--tls-key {b.key}", "does not match",
             f"--tls-cert {a.cert}")


def test_an_encrypted_key_is_refused(pki: dict[str, HostFiles], tmp_path: Path) -> None:
    _, certs = ca_and_host_certs({"e": "127.0.0.1"}, encrypt_keys=b"passphrase")
    cert, key = tmp_path / "e.crt", tmp_path / "e.key"
    cert.write_bytes(certs["e"][0])
    key.write_bytes(certs["e"][1])
    _refused(["--tls-cert", str(cert), "--tls-key", str(key)], f"--tls-key {key}", "encrypted")


def test_certificate_and_key_go_together(pki: dict[str, HostFiles]) -> None:
    a = pki["a"]
    _refused(["--tls-cert", str(a.cert)], "--tls-cert needs --tls-key")
    _refused(["--tls-key", str(a.key), "--tls-ca", str(a.ca)], "--tls-key needs --tls-cert")


def test_a_task_that_serves_needs_its_certificate(pki: dict[str, HostFiles]) -> None:
    _refused(["--tls-ca", str(pki["a"].ca)], PS, "serves", "--tls-cert FILE and --tls-key FILE")
    _refused(["--tls-ca", str(pki["a"].ca), "--tls-require-client-auth"], "/job:client/task:0",
             "--tls-require-client-auth", "--tls-cert", serves=False, task="/job:client/task:0")


def test_client_auth_needs_the_ca(pki: dict[str, HostFiles]) -> None:
    a = pki["a"]
    _refused(["--tls-cert", str(a.cert), "--tls-key", str(a.key), "--tls-require-client-auth"],
             "--tls-require-client-auth needs --tls-ca")


def test_tls_with_the_tcp_carrier_is_refused(pki: dict[str, HostFiles]) -> None:
    _refused([*pki["a"].flags(), "--transport", "tcp"], "--transport tcp", "no TLS", "--transport grpc")


def test_psflow_server_prints_one_line_and_exits_1(pki: dict[str, HostFiles], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The command's expected-error path: before anything starts, one line naming the flag and file."""
    monkeypatch.setenv("PSFLOW_TOKEN", "unit-token")
    monkeypatch.setenv("GRPC_VERBOSITY", "NONE")  # main() sets it otherwise: restored after the test
    monkeypatch.delenv("TF_CONFIG", raising=False)
    cluster = tmp_path / "cluster.json"
    cluster.write_text('{"ps": ["127.0.0.1:1"]}')
    a, b = pki["a"], pki["b"]
    code = main(["server", "--cluster", str(cluster), "--job", "ps", "--task", "0",
                 "--tls-cert", str(a.cert), "--tls-key", str(b.key), "--tls-ca", str(a.ca)])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"psflow server: error: --tls-key {b.key}: does not match"), err
