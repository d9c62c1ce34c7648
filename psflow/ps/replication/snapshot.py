"""A shard member's whole state as replica entries: the small state every entry carries, the full snapshot
a joining member starts from, and writing either on a backup.

The small state (:func:`task_state`, JSON): global_step and the clocks (with the run global_step hands values out
for, which a backup of shard 0 records in its journal: :meth:`~psflow.ps.step_clock.StepClock.load_replica_state`),
the worker ledger (incarnations, reader positions, examples, finished workers), readiness and generation, the sync
aggregator's workers that left and its counts, the moving averages' step, the dedup table, the counters
``pushes_applied``/``pushes_acknowledged``, and the run's end (the workers' ``Done``:
:meth:`~psflow.ps.run_end.RunLedger.replica_state`). A full entry (:func:`full_entry`) adds the registration (layout,
optimizer, update mode) and every partition whole: a joining member's snapshot, a checkpoint's load. A
registration entry (:func:`registration_entry`, the chief's creating ``Register``) adds only the registration:
the backup creates the same partitions from the same initializers, which are counter-based per element
(:mod:`psflow.ps.initializers`), so its values equal the primary's bit for bit without crossing the wire.

Guarantee: writing a full entry of the primary, then its later entries in order, leaves the backup with the
primary's partitions, slots, averages, dynamic rows and small state bit for bit (as of the newest entry).
:func:`write_entries` writes several entries at once to the same effect, with less work: each partition's
deltas coalesced (:func:`~psflow.ps.replication.deltas.coalesce`), the small state of the newest entry only
(every entry carries the whole small state, so the newest one's replaces the others').
Not in the small state: the chief's fence, shard 0's lease table and its checkpoint ledger (``CheckpointStatus``),
which the entries recorded when they change and full entries carry (:mod:`~psflow.ps.replication.carried`). Not
replicated: ssp's worker clocks (refilled by the next pushes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from psflow.ps.protocol import PartDelta, RegisterRequest, ReplicaEntry
from psflow.ps.replication.dedup import DedupTable
from psflow.ps.replication.deltas import capture, coalesce, write
from psflow.rpc.framing import Frame

if TYPE_CHECKING:
    from psflow.ps.service import ParameterService

__all__ = ["full_entry", "registration_entry", "task_state", "write_entries", "write_entry"]


def task_state(service: ParameterService, dedup: DedupTable, counts: dict[str, int]) -> dict[str, Any]:
    """The small state of ``service`` (JSON)."""
    aggregator = service.mode.aggregator
    return {"step_clock": service.clock.replica_state(), "workers": service.workers.replica_state(),
            "gate": service.gate.replica_state(),
            "sync": aggregator.replica_state() if aggregator is not None else None,
            "average_step": service.variables.averages.last_step, "dedup": dedup.export(), "counts": dict(counts),
            "run_end": service.run_ledger.replica_state() if service.run_ledger is not None else None}


def full_entry(seq: int, service: ParameterService, dedup: DedupTable, counts: dict[str, int]) -> ReplicaEntry:
    """Entry ``seq`` holding the whole state of ``service`` (the caller keeps other changes out meanwhile)."""
    registration = service.variables.registration()
    state = task_state(service, dedup, counts)
    state["register"] = dict(registration.to_frame().meta) if registration is not None else None
    parts: list[PartDelta] = [capture(part, None) for part in service.variables.partitions.partitions()]
    return ReplicaEntry(seq, state, tuple(parts), full=True)


def registration_entry(seq: int, service: ParameterService, dedup: DedupTable, counts: dict[str, int]) -> ReplicaEntry:
    """Entry ``seq``: the small state and the registration that just created every partition of ``service``
    (nothing else may have written them since: the caller holds the forwarder's lock across both)."""
    registration = service.variables.registration()
    state = task_state(service, dedup, counts)
    state["register"] = dict(registration.to_frame().meta) if registration is not None else None
    return ReplicaEntry(seq, state)


def write_entry(service: ParameterService, dedup: DedupTable, counts: dict[str, int], entry: ReplicaEntry) -> None:
    """Writes ``entry`` (of the primary) into this member's ``service``: a full entry replaces everything."""
    state = entry.state
    if entry.full or state.get("register") is not None:  # a snapshot, or a registration that created
        _register(service, state.get("register"))
    store = service.variables.partitions
    for delta in entry.parts:
        write(store, delta)
    clock, workers, gate = state.get("step_clock"), state.get("workers"), state.get("gate")
    if isinstance(clock, dict):
        service.clock.load_replica_state(clock)
    if isinstance(workers, dict):
        _replaced(service, workers.get("incarnations"))
        service.workers.load_replica_state(workers)
    if isinstance(gate, dict):
        service.gate.load_replica_state(gate)
    sync, aggregator = state.get("sync"), service.mode.aggregator
    if isinstance(sync, dict) and aggregator is not None:
        aggregator.load_replica_state(sync)
    averages = state.get("average_step")
    if averages is None or isinstance(averages, int):
        service.variables.averages.restored(averages)
    run_end = state.get("run_end")
    if run_end is not None and service.run_ledger is not None:
        service.run_ledger.load_replica_state(run_end)
    dedup.load(state.get("dedup"))
    got = state.get("counts")
    if isinstance(got, dict):
        counts.update({str(k): int(v) for k, v in got.items()})


def write_entries(service: ParameterService, dedup: DedupTable, counts: dict[str, int],
                  entries: list[ReplicaEntry]) -> None:
    """Writes ``entries`` (consecutive entries of the primary, in order) into ``service``, leaving it as
    :func:`write_entry` of each in order would, bit for bit: the partitions' deltas coalesced, then the small
    state of the newest. A full or registering entry among them: each entry in order, as it is."""
    if len(entries) == 1 or any(e.full or e.state.get("register") is not None for e in entries):
        for entry in entries:
            write_entry(service, dedup, counts, entry)
        return
    by_key: dict[str, list[PartDelta]] = {}
    for entry in entries:
        for delta in entry.parts:
            by_key.setdefault(delta.key, []).append(delta)
    store = service.variables.partitions
    for deltas in by_key.values():  # partitions are independent: the order among them does not matter
        for delta in coalesce(deltas) if len(deltas) > 1 else deltas:
            write(store, delta)
    write_entry(service, dedup, counts, ReplicaEntry(entries[-1].seq, entries[-1].state))


def _replaced(service: ParameterService, incarnations: object) -> None:
    """Each worker the primary saw a newer process of: a save its earlier process told this member of is over, as
    that process's ``Register`` ended it on the primary (:mod:`psflow.ps.save_hold`); nothing else tells a backup,
    which, promoted later, named that dead process's save in a step's timeout."""
    if not isinstance(incarnations, dict):
        return
    for worker, incarnation in incarnations.items():
        if isinstance(incarnation, int) and incarnation > service.workers.incarnation_of(str(worker)):
            service.mode.registered(str(worker), incarnation)


def _register(service: ParameterService, meta: object) -> None:
    """Forgets this member's variables and, when the primary has registered, registers its layout."""
    variables = service.variables
    variables.forget()
    if not isinstance(meta, dict):
        return
    request = RegisterRequest.from_frame(Frame(meta))

    def created() -> None:
        service.mode.configure(request.sync)
        service.gate.initialized(ready=False)

    variables.register(request, ready=lambda: False, restoring=lambda: False, created=created)
