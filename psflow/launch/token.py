"""The cluster token, read from the environment (``PSFLOW_TOKEN``) at the edge: by the ``psflow`` command and by
each task process, never by library code.

A token is the cluster's shared secret: every task and every caller (``psflow shutdown``, ``psflow status``, the
status page off loopback) must present it. An unset or empty ``PSFLOW_TOKEN`` means no token (a ``psflow server``
then needs ``--insecure``). A token of only whitespace is refused: it is a secret in name only (e.g. an unset shell
variable quoted with a space, or a Secret holding a newline), and accepting it would leave the cluster open to
anyone who guesses it.
"""

from __future__ import annotations

from collections.abc import Mapping

from psflow.train.config import ConfigError

__all__ = ["TOKEN_ENV", "cluster_token"]

#: Environment variable carrying the cluster token (to every task process, too).
TOKEN_ENV = "PSFLOW_TOKEN"


def cluster_token(environ: Mapping[str, str]) -> str | None:
    """The cluster token in ``environ``, or None when ``PSFLOW_TOKEN`` is unset or empty.

    Raises:
        ConfigError: ``PSFLOW_TOKEN`` holds only whitespace (says how many characters, never the value).
    """
    token = environ.get(TOKEN_ENV) or None
    if token is not None and not token.strip():
        raise ConfigError(f"{TOKEN_ENV} holds only whitespace ({len(token)} character(s)): that is no secret; set it "
                          "to the cluster's token (the same on every task), or unset it")
    return token
