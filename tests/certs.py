"""Test certificates: a CA and per-host certificates it signs (the ``cryptography`` package, a test dependency).

Shared by the TLS tests, so that nobody pastes a certificate builder into their own file.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass(frozen=True)
class HostFiles:
    """One host's PEM files on disk: its certificate, its key and the CA that signed it."""

    cert: Path
    key: Path
    ca: Path

    def flags(self, *, require_client_auth: bool = True) -> list[str]:
        """``psflow server``'s TLS flags for these files."""
        flags = ["--tls-cert", str(self.cert), "--tls-key", str(self.key), "--tls-ca", str(self.ca)]
        return [*flags, "--tls-require-client-auth"] if require_client_auth else flags


def ca_and_host_certs(hosts: dict[str, str], *, ca_name: str = "psflow-test-ca",
                      encrypt_keys: bytes | None = None) -> tuple[bytes, dict[str, tuple[bytes, bytes]]]:
    """A CA certificate, and for each name a (certificate, key) PEM pair signed by it whose only
    subject alternative name is that host's IP address. ``encrypt_keys``: the keys' passphrase."""
    x509: Any = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def build(subject: str, public: Any, signer: Any, extensions: list[tuple[Any, bool]]) -> Any:
        b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
             .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name)])).public_key(public)
             .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=1)))
        for ext, critical in extensions:
            b = b.add_extension(ext, critical=critical)
        return b.sign(signer, hashes.SHA256())

    encryption: Any = (serialization.NoEncryption() if encrypt_keys is None
                       else serialization.BestAvailableEncryption(encrypt_keys))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = build(ca_name, ca_key.public_key(), ca_key, [(x509.BasicConstraints(ca=True, path_length=None), True)])
    out = {}
    for name, ip in hosts.items():
        key = ec.generate_private_key(ec.SECP256R1())
        cert = build(name, key.public_key(), ca_key,
                     [(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), False),
                      (x509.BasicConstraints(ca=False, path_length=None), True)])
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
        out[name] = (cert.public_bytes(serialization.Encoding.PEM), key_pem)
    return ca.public_bytes(serialization.Encoding.PEM), out


def write_host_files(directory: Path, hosts: dict[str, str], *, ca_name: str = "psflow-test-ca") -> dict[str, HostFiles]:
    """:func:`ca_and_host_certs` written under ``directory`` (``ca.crt``, ``NAME.crt``, ``NAME.key``)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, certs = ca_and_host_certs(hosts, ca_name=ca_name)
    ca_path = directory / "ca.crt"
    ca_path.write_bytes(ca)
    files = {}
    for name, (cert, key) in certs.items():
        (directory / f"{name}.crt").write_bytes(cert)
        (directory / f"{name}.key").write_bytes(key)
        (directory / f"{name}.key").chmod(0o600)
        files[name] = HostFiles(directory / f"{name}.crt", directory / f"{name}.key", ca_path)
    return files
