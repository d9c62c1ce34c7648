"""An in-process replicated shard 0 whose members keep their global_step journals in files, for the tests of a
fresh shard's floor (tests/unit/ps/replication/test_fresh_shard_floor.py, test_restore_heard_floor.py): each
member a real ParameterService with its journal under ``root``/<member>/, joined as
:class:`replica_shard.InProcessShard` joins them."""

from __future__ import annotations

from pathlib import Path

from replica_shard import PRIMARY, InProcessShard, Link

from psflow.ps.global_step import GlobalStep, StepJournal
from psflow.ps.replication import ReplicationConfig, ShardReplication
from psflow.ps.service import ParameterService

#: Step values a member's journal reserves per write.
BLOCK = 10


def handed_out(path: Path, run: str, count: int) -> None:
    """A member of shard 0 whose journal is ``path`` handed out ``count`` values of run ``run``, then was killed
    (on this boot: its journal holds the last one exactly)."""
    step = GlobalStep(journal=StepJournal(str(path), block=BLOCK))
    step.claim(run)
    for _ in range(count):
        step.increment()


def reread(path: Path) -> tuple[int, str | None]:
    """(floor, run) of journal ``path`` as a restarted member reads them."""
    step = GlobalStep(journal=StepJournal(str(path), block=BLOCK))
    return step.floor, step.floor_run


class JournaledShard(InProcessShard):
    """Shard 0 whose members keep their global_step journals under ``root``/<member>/."""

    def __init__(self, root: Path, backups: int = 1) -> None:
        self.root = root
        super().__init__(backups)

    def add(self, member: str) -> ShardReplication:
        journal = StepJournal(str(self.journal(member)), block=BLOCK)
        service = ParameterService(0, holds_global_step=True, step_journal=journal)
        replica = ShardReplication(ReplicationConfig(self.cluster, member, 0, status_timeout=1.0), service,
                                   connect=lambda other: Link(self, other))
        old = self.replicas.get(member)
        if old is not None:
            old.stop()
        self.services[member], self.replicas[member] = service, replica
        self.handlers[member] = replica.handlers(service.handlers())
        return replica

    def journal(self, member: str) -> Path:
        return self.root / member.replace("/", "_") / "global_step.json"

    def restart_all(self) -> tuple[int | None, str | None]:
        """Restarts every member (their journals as left) and lets member 0 start the fresh shard; returns its
        (floor, run) as its ``Stats`` says."""
        for member in self.members:
            self.add(member)
        self.start()
        self.wait_view()
        stats = self.services[PRIMARY].stats_reply()
        return stats.step_floor, stats.step_run
