"""Carriers by name, imported only when used.

>>> channel = open_channel("tcp", "/job:ps/task:0", "10.0.0.5:2222", PARAMETER_SERVICE, config)  # doctest: +SKIP
>>> server = serve("grpc", ServeConfig("/job:ps/task:0", "0.0.0.0:2222", services))             # doctest: +SKIP

A carrier moves frames between a caller and a task's handlers; every one
serves calls through :func:`psflow.rpc.api.dispatch`. Its client side opens a
:class:`~psflow.rpc.api.Channel` to one task, its server side serves
handlers on a port (:class:`~psflow.rpc.api.CarrierServer`):

    ``grpc``  every service, TLS, the control plane (:mod:`psflow.rpc.grpc_client`,
              :mod:`psflow.rpc.grpc_server`)
    ``tcp``   the ps data path, one plain connection per (client, task), no TLS; its
              port is asked of the task over gRPC (:mod:`psflow.rpc.tcp`,
              :mod:`psflow.rpc.tcp_server`)

``ConnectConfig.transport`` names the client side a ps client uses. The
in-process carrier (:class:`~psflow.rpc.inprocess.InProcessChannel`) has no
address and is not chosen by name: a run in one process hands its channels
to the client.

Registering a carrier imports nothing; :func:`open_channel` and :func:`serve`
import the chosen carrier's module (and its library, e.g. grpc) on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from psflow.errors import ConfigError
from psflow.rpc.api import CarrierServer, Channel, ConnectConfig, ServeConfig

__all__ = ["CLIENT_CARRIERS", "SERVER_CARRIERS", "carrier_names", "open_channel", "register_carrier", "serve"]

#: name -> "module:callable"; the callable takes (task, address, service, ConnectConfig) and returns a Channel.
CLIENT_CARRIERS: dict[str, str] = {
    "grpc": "psflow.rpc.grpc_client:TaskChannel",
    "tcp": "psflow.rpc.tcp:open_channel",
}
#: name -> "module:callable"; the callable takes one ServeConfig and returns a CarrierServer (not started).
SERVER_CARRIERS: dict[str, str] = {
    "grpc": "psflow.rpc.grpc_server:serve",
    "tcp": "psflow.rpc.tcp_server:serve",
}


def carrier_names(*, server: bool = False) -> list[str]:
    """Registered carrier names (with a server side if ``server``), sorted."""
    return sorted(SERVER_CARRIERS if server else CLIENT_CARRIERS)


def register_carrier(name: str, *, client: str | None = None, server: str | None = None) -> None:
    """Registers a carrier's sides as ``"module:callable"`` under ``name`` (nothing is imported now).

    Raises:
        ConfigError: a target is not of the form ``module:callable``.
    """
    for target in (client, server):
        if target is not None and (target.count(":") != 1 or not all(target.split(":"))):
            raise ConfigError(f"carrier {name!r}: a target must be 'module:callable', got {target!r}")
    if client is not None:
        CLIENT_CARRIERS[name] = client
    if server is not None:
        SERVER_CARRIERS[name] = server


def _load(table: dict[str, str], name: str) -> Any:
    target = table.get(name)
    if target is None:
        raise ConfigError(f"unknown carrier {name!r} (known: {', '.join(sorted(table))})")
    module_name, attribute = target.split(":")
    return getattr(importlib.import_module(module_name), attribute)


def open_channel(carrier: str, task: str, address: str, service: str, config: ConnectConfig) -> Channel:
    """Opens a channel to ``service`` of ``task`` (its gRPC ``host:port``) over ``carrier``.

    Lazily connected, as each carrier's channel is: this call does not block
    (see :meth:`~psflow.rpc.api.Channel.wait_ready`).

    Raises:
        ConfigError: no carrier of that name (lists the known ones), or
            ``config`` asks for what the carrier cannot do (TLS over tcp).
    """
    channel: Channel = _load(CLIENT_CARRIERS, carrier)(task, address, service, config)
    return channel


def serve(carrier: str, config: ServeConfig) -> CarrierServer:
    """Builds, and binds, ``carrier``'s server for ``config`` (not started: call its ``start``).

    Raises:
        ConfigError: no carrier of that name (lists the known ones), or
            ``config`` asks for what the carrier cannot do.
        ListenError, OSError: the address could not be bound.
    """
    server: CarrierServer = _load(SERVER_CARRIERS, carrier)(config)
    return server
