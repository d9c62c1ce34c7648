"""A rows-first push (PushPullAckLater, psflow/ps/rows_first.py; issue 28) whose reply arrives but cannot be read,
against a real replicated shard (a primary and its backup, each a ParameterService with its ShardReplication:
tests/replica_shard.py, over tests/travelling_shard.py's channels): the push was applied on the primary, so its
``Acked`` call must still go out and be counted, or the shard's ``pushes_applied`` stays above the worker's
``pushes_acknowledged`` though nothing was lost and no process was killed."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest
from replica_shard import PRIMARY, InProcessShard, Link
from travelling_ps import Recorder
from travelling_shard import ShardNetwork, shard_client

from psflow.gradients import DenseGradient
from psflow.ps.plans import ClientError
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(90)

ROWS = "PushPullAckLater"
GRADS = {"w": DenseGradient(np.ones(1, np.float32))}


class Network(ShardNetwork):
    """Calls reach the real members; the primary's reply to its ``kill_at``-th PushPullAckLater loses its arrays
    on the way (it was served: the push is applied), so the rows cannot be read."""

    def __init__(self, shard: InProcessShard, kill_at: int, events: list[tuple[str, ...]]) -> None:
        super().__init__(shard, kill_at, "rows", events, (ROWS, "Acked"))
        self.rows = 0

    def deliver(self, task: str, method: str, meta: Mapping[str, Any] | None,
                arrays: Mapping[str, np.ndarray] | None, timeout: float | None) -> Frame:
        frame = Link(self.shard, task).call(method, meta, arrays, timeout=timeout)
        if task == PRIMARY and method == ROWS:
            self.rows += 1
            if self.rows == self.kill_at:
                return Frame(dict(frame.meta), {})
        return frame


def test_a_reply_whose_rows_cannot_be_read_is_still_acknowledged_and_counted(
        make_shard: Callable[..., InProcessShard], monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[str, ...]] = []
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    network = Network(shard, 2, events)
    client = shard_client(shard, network, Recorder(events), monkeypatch)
    assert client.acks_later
    assert client.send_push_pull(GRADS, {"w": None}, ack_later=True).result()[0].step == 1
    pending = client.send_push_pull(GRADS, {"w": None}, ack_later=True)
    with pytest.raises(ClientError, match=r"^/job:worker/task:0: variable 'w': the reply of /job:ps/task:0 \(ps shard 0\) "
                                          r"holds no rows of its partition 'w/part_0'$"):
        pending.rows()
    assert network.rows == 2 and events[-2:] == [("send", PRIMARY, "Acked"), ("reply", PRIMARY, "Acked")]
    assert client.acked == {0: 2}  # the second push, applied, is counted acknowledged too
    client.leave()
    stats = shard.replicas[PRIMARY].stats()
    assert stats["pushes_applied"] == 2 and stats["pushes_acknowledged"] == 2
    assert shard.services[PRIMARY].store.get("w/part_0").value.tolist() == [-2.0]
