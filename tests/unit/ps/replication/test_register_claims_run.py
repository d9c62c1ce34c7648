"""A chief's Register that creates nothing but names another run (its values are that run's from now on:
:meth:`~psflow.ps.global_step.GlobalStep.claim` on the primary) reaches the backups before it returns, as a dropped
``Done`` does (:mod:`psflow.ps.replication.register_call`). It recorded no entry: a backup promoted before the next
entry kept naming the earlier run in its journal for the rest of the new run (nothing claims it again), so after the
whole shard was lost the new run did not count the loss as its own (:mod:`psflow.train.within_run`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from replica_shard import PRIMARY, InProcessShard, backup, layout

from psflow.ps.sync import SyncConfig

pytestmark = pytest.mark.timeout(60)


def test_a_chief_s_register_naming_a_new_run_reaches_the_backups(make_shard: Callable[..., InProcessShard]) -> None:
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    member = backup(0)
    shard.register(dataclasses.replace(layout(SyncConfig()), run="run-a"))  # creates: the registration entry
    copy = shard.services[member].clock.global_step
    assert copy is not None and copy.run == "run-a"
    before = len(shard.received.get(member, []))
    shard.register(dataclasses.replace(layout(SyncConfig()), run="run-b"))  # creates nothing; claims run-b
    primary = shard.services[PRIMARY].clock.global_step
    assert primary is not None and primary.run == "run-b"
    assert copy.run == "run-b", f"the backup names {copy.run} after {len(shard.received[member]) - before} entries"
    before = len(shard.received.get(member, []))
    shard.register(dataclasses.replace(layout(SyncConfig()), run="run-b"))  # the same run's repeat: nothing
    assert len(shard.received.get(member, [])) == before
