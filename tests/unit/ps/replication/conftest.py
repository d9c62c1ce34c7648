"""The in-process shard fixture of these tests (tests/replica_shard.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from replica_shard import InProcessShard


@pytest.fixture
def make_shard() -> Iterator[Callable[..., InProcessShard]]:
    made: list[InProcessShard] = []

    def make(backups: int = 1, replica_timeout: float = 5.0, message_limit: int | None = None,
             chunk_bytes: int | None = None) -> InProcessShard:
        shard = InProcessShard(backups, replica_timeout, message_limit, chunk_bytes)
        made.append(shard)
        return shard
    yield make
    for shard in made:
        shard.stop()
