"""A client of two real ps tasks holding ``emb`` (6 x 2, ps task 0) and ``bias`` (2, ps task 1): the restore-fence
tests' layout (test_chief_register_during_restore, test_late_load_and_save_during_restore)."""

from __future__ import annotations

from typing import Any

from support import TOKEN

from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.rpc.api import ConnectConfig


def emb_bias_client(handle: Any, name: str, transport: str = "grpc") -> ParameterClient:
    """A connected client named ``name`` of ``handle``'s cluster (a ``local_cluster(2)`` handle), calling over
    ``transport`` (``grpc`` or ``tcp``)."""
    vs = VariableSet(replica_device_setter(cluster=handle.cluster))
    vs.get_variable("emb", (6, 2))   # ps task 0
    vs.get_variable("bias", (2,))    # ps task 1
    client = ParameterClient(handle.cluster, vs.placements(), client_name=name,
                             config=ConnectConfig(connect_timeout=120.0, token=TOKEN, transport=transport))
    client.connect()
    return client
