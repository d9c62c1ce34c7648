"""A deposed restorer's ``SetReady`` let in by the restore fence changes nothing of a newer restore
(psflow/ps/checkpointing.py set_ready, psflow/ps/restore_gate.py RestoreGate.opening).

``SetReady`` asked the fence (``check_open``), then restarted the sync step count at its restore's global_step
(``UpdateMode.restart``) and reserved global_step's journal bound, and only then opened the gate, asking the fence
again: a ``BeginRestore`` of a newer generation and that restore's whole load and ``SetReady`` coming after the
first ask left the older ``SetReady`` refused (FencedOff) but its restart done: a sync task's step count set back
to the older checkpoint's step, and the step being collected dropped, under the newer restore's training. The
changes are now made under the mutex ``BeginRestore`` and ``SetReady``'s opening take (as a load's,
test_stale_load_fence.py), the fence asked there. In-process services, no sockets.
"""

from __future__ import annotations

import pytest
from two_ps_in_process import SGD, two_ps_cluster

from psflow.ps.protocol import BeginRestoreRequest, LoadShardRequest, SetReadyRequest
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import FencedOffError
from psflow.train.generation_restore import register_as_chief

pytestmark = pytest.mark.timeout(60)


def _load(step: int, generation: int) -> LoadShardRequest:
    """ps task 1's load of a checkpoint of global_step ``step`` (no partition: the restored step alone)."""
    return LoadShardRequest([], restored_step=step, restored_from=f"/ckpt/ckpt-{step:09d}", restored_from_step=step,
                            generation=generation)


def test_a_set_ready_let_in_before_a_newer_restore_began_changes_nothing_after_it() -> None:
    client, services = two_ps_cluster()
    client.sync = SyncConfig(mode="sync")
    register_as_chief(client, SGD, None)
    client.call(1, BeginRestoreRequest(7))
    client.call(1, _load(30, 7))
    service = services[1]  # no global_step here: its own sync step count, which a restore sets
    gate = service.gate
    real = gate.check_open

    def check_open(generation: int | None, who: str) -> None:  # past the fence: the next chief restores, whole
        gate.check_open = real  # type: ignore[method-assign]
        real(generation, who)
        client.call(1, BeginRestoreRequest(9))
        client.call(1, _load(40, 9))
        client.call(1, SetReadyRequest("the next chief", 9, 40))

    gate.check_open = check_open  # type: ignore[method-assign]
    with pytest.raises(FencedOffError, match="SetReady of generation 7 from the chief refused"):
        client.call(1, SetReadyRequest("the chief", 7, 30))
    stats = client.ps_stats(1)
    assert (stats.generation, stats.ready, stats.restored_from_step) == (9, True, 40)
    assert service.clock.sync_step() == 40  # the newer restore's step, not set back to the deposed one's
