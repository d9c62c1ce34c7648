"""``psflow server``'s TLS flags: this task's certificate and key and the CA, read once, at start.

``--tls-cert FILE``, ``--tls-key FILE``  this task's certificate chain and private key (PEM; the key
                                        unencrypted: gRPC takes no passphrase)
``--tls-ca FILE``                       the CA certificate(s) that sign the peers' certificates (PEM)
``--tls-require-client-auth``           servers refuse clients without a certificate signed by ``--tls-ca``

TLS is on when any of them is given. Then the task's server and every gRPC channel it opens (to
the ps tasks, the embedded coordination backend, the workers of an in-graph run, the status
page's collector) use the one :class:`~psflow.rpc.tls.TlsConfig` made here: the server presents
``--tls-cert``; a client checks each server's certificate against ``--tls-ca`` (without it,
gRPC's default roots) and the address it dialed (an IP SAN for an IP address, a DNS SAN for a
name), and presents ``--tls-cert`` where the server asks for it. The cluster token is still
required (TLS encrypts and authenticates the hosts; the token authenticates the cluster).

Guarantees: every check below is made before anything starts, and each failure is a
:class:`~psflow.train.config.ConfigError` whose one line names the flag and the file; the files
are read once (a renewed certificate takes effect when the task restarts); nothing is written
to disk, and no message or repr shows key material.

Checks: each file readable; the certificate and CA files hold PEM certificates OpenSSL parses;
the key file a PEM private key, unencrypted, that matches the certificate; ``--tls-cert`` and
``--tls-key`` together, and given wherever the task serves (every task but an in-graph
``client``); ``--tls-require-client-auth`` with ``--tls-ca``; not with ``--transport tcp``
(psflow's TCP carrier has no TLS).

This module imports nothing that imports ``grpc``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import ssl
from collections.abc import Iterator

from psflow.rpc.tls import TlsConfig
from psflow.train.config import ConfigError

__all__ = ["add_tls_arguments", "tls_config", "tls_requested"]

_CERT_BEGIN = b"-----BEGIN CERTIFICATE-----"
_KEY_BEGINS = (b"-----BEGIN PRIVATE KEY-----", b"-----BEGIN RSA PRIVATE KEY-----", b"-----BEGIN EC PRIVATE KEY-----")
_ENCRYPTED = (b"-----BEGIN ENCRYPTED PRIVATE KEY-----", b"Proc-Type: 4,ENCRYPTED")


def add_tls_arguments(p: argparse.ArgumentParser) -> None:
    """Adds ``--tls-cert``, ``--tls-key``, ``--tls-ca`` and ``--tls-require-client-auth`` to ``p``."""
    g = p.add_argument_group("TLS (psflow server; gRPC only; see docs/deploying.md)")
    g.add_argument("--tls-cert", metavar="FILE",
                   help="this task's certificate chain (PEM), its address among the subject alternative names; "
                        "turns TLS on for the task's server and every channel it opens (every task serves, so each needs it)")
    g.add_argument("--tls-key", metavar="FILE", help="the private key of --tls-cert (PEM, unencrypted)")
    g.add_argument("--tls-ca", metavar="FILE",
                   help="CA certificate(s) (PEM) that the peers' certificates are checked against (default: gRPC's roots)")
    g.add_argument("--tls-require-client-auth", action="store_true",
                   help="servers refuse clients without a certificate signed by --tls-ca; clients present --tls-cert")


def tls_requested(args: argparse.Namespace) -> bool:
    """Whether any ``--tls-*`` flag was given (TLS is on)."""
    return any(path is not None for path in (args.tls_cert, args.tls_key, args.tls_ca)) or bool(args.tls_require_client_auth)


def tls_config(args: argparse.Namespace, *, task: str, serves: bool) -> TlsConfig | None:
    """The task's TLS material from its ``--tls-*`` flags (None: no flag given, plain text).

    Args:
        args: parsed ``psflow server`` flags (``tls_*`` and ``transport``).
        task: the task's name, for messages (``/job:ps/task:0``).
        serves: the task runs a server (it needs a certificate and key).

    Raises:
        ConfigError: a check of the module docstring failed (names the flag and the file).
    """
    if not tls_requested(args):
        return None
    if args.transport == "tcp":
        raise ConfigError("--transport tcp has no TLS (psflow's TCP carrier is clear text): with --tls-* flags, "
                          "use --transport grpc (psflow server's default)")
    if (args.tls_cert is None) != (args.tls_key is None):
        given, missing = ("--tls-cert", "--tls-key") if args.tls_key is None else ("--tls-key", "--tls-cert")
        raise ConfigError(f"{given} needs {missing} FILE (the certificate and its private key go together)")
    if args.tls_require_client_auth and args.tls_ca is None:
        raise ConfigError("--tls-require-client-auth needs --tls-ca FILE (the CA that signs the clients' certificates)")
    if args.tls_cert is None and (serves or args.tls_require_client_auth):
        why = "serves" if serves else "must present a certificate (--tls-require-client-auth)"
        raise ConfigError(f"{task} {why}: with TLS on it needs --tls-cert FILE and --tls-key FILE")
    cert = key = ca = None
    if args.tls_cert is not None:
        cert = _read("--tls-cert", args.tls_cert)
        key = _read("--tls-key", args.tls_key)
        _check_certificates("--tls-cert", args.tls_cert, cert)
        _check_key(args.tls_cert, cert, args.tls_key, key)
    if args.tls_ca is not None:
        ca = _read("--tls-ca", args.tls_ca)
        _check_certificates("--tls-ca", args.tls_ca, ca)
    return TlsConfig(root_certificates=ca, cert_chain=cert, private_key=key,
                     require_client_auth=args.tls_require_client_auth)


def _read(flag: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot read it: {e.strerror or e}") from None


def _check_certificates(flag: str, path: str, pem: bytes) -> None:
    """``pem`` holds one or more certificates OpenSSL parses."""
    if _CERT_BEGIN not in pem:
        raise ConfigError(f"{flag} {path}: not a PEM certificate (no '{_CERT_BEGIN.decode()}' line; a DER file "
                          "converts with: openssl x509 -inform der -in FILE -out FILE.pem)")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=pem.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{flag} {path}: a PEM certificate in it does not parse ({_reason(e)})") from None


def _check_key(cert_path: str, cert: bytes, key_path: str, key: bytes) -> None:
    """``key`` is an unencrypted PEM private key that matches the (already checked) certificate ``cert``."""
    if any(marker in key for marker in _ENCRYPTED):
        raise ConfigError(f"--tls-key {key_path}: the key is encrypted, and gRPC takes no passphrase "
                          "(decrypt it into a file only this task's user can read: openssl pkey -in FILE -out FILE.plain)")
    if not any(marker in key for marker in _KEY_BEGINS):
        raise ConfigError(f"--tls-key {key_path}: not a PEM private key (no '-----BEGIN PRIVATE KEY-----' line)")

    def no_passphrase() -> bytes:  # called only for an encrypted key, which OpenSSL would prompt for
        raise ConfigError(f"--tls-key {key_path}: the key is encrypted, and gRPC takes no passphrase")

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        with _in_memory(cert, cert_path) as c, _in_memory(key, key_path) as k:
            context.load_cert_chain(c, k, password=no_passphrase)
    except ssl.SSLError as e:
        if e.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(f"--tls-key {key_path}: does not match the certificate in --tls-cert {cert_path}") from None
        raise ConfigError(f"--tls-key {key_path}: the private key does not load ({_reason(e)})") from None


@contextlib.contextmanager
def _in_memory(data: bytes, fallback: str) -> Iterator[str]:
    """A path that reads as ``data``: an anonymous in-memory file (Linux memfd; never on disk), so that
    OpenSSL checks the very bytes gRPC gets; elsewhere ``fallback``, the file ``data`` was read from."""
    if not hasattr(os, "memfd_create") or not os.path.isdir("/proc/self/fd"):
        yield fallback
        return
    fd = os.memfd_create("psflow-tls", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _reason(e: Exception) -> str:
    """OpenSSL's reason code, else its message without the source location (never the file's content)."""
    reason = getattr(e, "reason", None)
    return str(reason) if reason else (str(e).split(" (_ssl.c:")[0] or type(e).__name__)
