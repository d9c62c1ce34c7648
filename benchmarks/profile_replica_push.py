"""What one replicated push costs in CPU, primary and backup together, in one process (issue 28).

    .venv/bin/python benchmarks/profile_replica_push.py [--workload lr|wd] [--pushes 200] [--blocks 6]
        [--profile OUT.prof]

A ps primary and its backup (real :class:`~psflow.ps.service.ParameterService` objects with their
:class:`~psflow.ps.replication.ShardReplication`) in this process, joined by a channel that runs each call
through the wire's framing both ways (:func:`psflow.rpc.framing.encode` and ``decode`` of the request and of
the reply: what the TCP carrier does, without its socket and threads). Two workers' pushes (their worker
tags as a replicated client sends them: push ids, acked counts, reader positions) go to the primary's Push
handler, framed too; against them, the same pushes to an unreplicated service of the same layout. Blocks of
``--pushes`` pushes of each side alternate (``--blocks`` of each), each block timed with ``time.process_time``
(every thread of the process: the backup's apply runs in the pushing thread here, as the waiting push sends
its entry itself). Prints the median CPU ms per push of each side and the difference: what replication adds.

Workloads (gradients drawn once, at random, with the shapes of the real ones):

* ``lr``: bench_tf_peer.py's sparse LR: ``w`` (2^20 x 1, FTRL) and a bias; 19,968 ids per batch of 512.
* ``wd``: bench_tf_peer_wd.py's Wide & Deep layout: 26 wide tables (262,144 x 1, FTRL), 26 embeddings
  (262,144 x 8, Adagrad), the dense layers (221-256-128-1, Adagrad) and the wide dense part; 512 ids per field.

``--profile OUT.prof`` runs cProfile over one more block of replicated pushes and prints its top functions.
``--stages`` instead times each stage of one entry apart (no Replicate call; a primary's service and a
backup's, one entry per push): the push's apply, the capture of its rows, the small state (and its JSON
size), the request's ``to_frame``, ``encode`` (the TCP carrier's ``encode_parts``: the frame in pieces that
``sendmsg`` gathers, no joined copy), ``decode``, ``from_frame``, and the backup's write; beside it
("write coalesced"), the same entries written on a second backup as a backup over the TCP carrier writes
them, ``COALESCE`` at a time (:func:`~psflow.ps.replication.snapshot.write_entries`), per push.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from psflow.cluster import ClusterSpec
from psflow.data.api import ReaderPosition
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.protocol import PushReply, PushRequest, RegisterRequest, ReplicaEntry, ReplicateRequest, WorkerTag
from psflow.ps.replication import ReplicationConfig, ShardReplication
from psflow.ps.replication.applier import COALESCE
from psflow.ps.replication.dedup import DedupTable
from psflow.ps.replication.deltas import capture
from psflow.ps.replication.snapshot import full_entry, task_state, write_entries, write_entry
from psflow.ps.service import ParameterService
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import Handler, Refusal, dispatch
from psflow.rpc.framing import Frame, decode, encode, encode_parts

PRIMARY, BACKUP = "/job:ps/task:0", "/job:ps_backup/task:0"
WORKERS = ("/job:worker/task:0", "/job:worker/task:1")
FTRL = {"name": "ftrl", "hyperparameters": {"learning_rate": 0.1, "initial_accumulator_value": 0.1,
                                            "learning_rate_power": -0.5}}
ADAGRAD = {"name": "adagrad", "hyperparameters": {"learning_rate": 0.05, "initial_accumulator_value": 0.1}}


class _Done:
    def __init__(self, frame: Frame) -> None:
        self._frame = frame

    def result(self) -> Frame:
        return self._frame


class WireChannel:
    """A channel to a service in this process whose calls cross the wire's framing both ways."""

    def __init__(self, task: str, handlers: Mapping[str, Handler]) -> None:
        self.task, self.address, self._handlers = task, "in-process", handlers

    def wait_ready(self, timeout: float | None = None) -> None:
        """Returns at once."""

    def call(self, method: str, meta: Mapping[str, Any] | None = None,
             arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> Frame:
        body = encode(meta, arrays)
        out = dispatch(self.task, method, self._handlers.get(method), body, encode)
        if isinstance(out, Refusal):
            raise out.error()
        return decode(out)

    def call_async(self, method: str, meta: Mapping[str, Any] | None = None,
                   arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> _Done:
        return _Done(self.call(method, meta, arrays, timeout=timeout))

    def close(self) -> None:
        """Nothing to close."""


def layout(workload: str) -> RegisterRequest:
    vs = VariableSet(replica_device_setter(cluster=ClusterSpec({"ps": ["127.0.0.1:1"]})))
    if workload == "lr":
        vs.get_variable("w", (1 << 20, 1), initializer={"name": "zeros"}, optimizer=FTRL)
        vs.get_variable("b", (1,), initializer={"name": "zeros"}, optimizer=FTRL)
    else:
        for i in range(1, 27):
            vs.get_variable(f"wide/C{i}", (262144, 1), initializer={"name": "zeros"}, optimizer=FTRL)
        for i in range(1, 27):
            vs.get_variable(f"deep/emb_C{i}", (262144, 8), optimizer=ADAGRAD,
                            initializer={"name": "truncated_normal", "seed": i, "stddev": 0.35})
        vs.get_variable("wide/dense", (13, 1), initializer={"name": "zeros"}, optimizer=FTRL)
        vs.get_variable("wide/bias", (1,), initializer={"name": "zeros"}, optimizer=FTRL)
        for j, (n_in, n_out) in enumerate(((221, 256), (256, 128), (128, 1))):
            vs.get_variable(f"deep/layer{j}/kernel", (n_in, n_out), optimizer=ADAGRAD,
                            initializer={"name": "glorot_uniform", "seed": 1000 + j})
            vs.get_variable(f"deep/layer{j}/bias", (n_out,), initializer={"name": "zeros"}, optimizer=ADAGRAD)
    return RegisterRequest(tuple(vs.placements()), OptimizerSpec("sgd", {"learning_rate": 0.1}), SyncConfig(),
                           WORKERS[0], chief=True)


def gradients(workload: str, rng: np.random.Generator) -> list[tuple[str, np.ndarray, np.ndarray | None]]:
    """One push's gradients, with the shapes of the workload's."""
    if workload == "lr":
        rows = np.unique(rng.integers(0, 1 << 20, 19968))
        return [("w/part_0", rng.normal(size=(len(rows), 1)).astype(np.float32), rows),
                ("b/part_0", rng.normal(size=1).astype(np.float32), None)]
    grads: list[tuple[str, np.ndarray, np.ndarray | None]] = []
    vocabularies = np.geomspace(4, 200_000, 26).astype(np.int64)
    for prefix, dim in (("wide/C", 1), ("deep/emb_C", 8)):
        for i, vocab in enumerate(vocabularies, 1):
            rows = np.unique(rng.integers(0, vocab, 512) * 2654435761 % 262144)
            grads.append((f"{prefix}{i}/part_0", rng.normal(size=(len(rows), dim)).astype(np.float32), rows))
    for key, shape in (("wide/dense", (13, 1)), ("wide/bias", (1,)), ("deep/layer0/kernel", (221, 256)),
                       ("deep/layer0/bias", (256,)), ("deep/layer1/kernel", (256, 128)), ("deep/layer1/bias", (128,)),
                       ("deep/layer2/kernel", (128, 1)), ("deep/layer2/bias", (1,))):
        grads.append((f"{key}/part_0", (rng.normal(size=shape) * 0.01).astype(np.float32), None))
    return grads


class Side:
    """Pushes of the two workers to one Push handler, framed as the carrier frames them."""

    def __init__(self, channel: WireChannel, replicated: bool, grads: list[list[tuple[str, np.ndarray, Any]]]) -> None:
        self.channel, self.replicated, self.grads = channel, replicated, grads
        self.push_ids = dict.fromkeys(WORKERS, 0)
        self.n = 0

    def push(self) -> None:
        worker = WORKERS[self.n % 2]
        self.push_ids[worker] += 1
        pid = self.push_ids[worker]
        position = self.position(pid, self.n % 2)
        tag = (WorkerTag(worker, 1_700_000_000_000 + self.n % 2, 0, position, pid, pid - 1, (pid - 1,))
               if self.replicated else WorkerTag(worker, 1_700_000_000_000 + self.n % 2, 0, position))
        request = PushRequest(self.grads[self.n % len(self.grads)], tag, step=True, examples=512, loss=0.5)
        frame = request.to_frame()
        self.channel.call(PushRequest.METHOD, frame.meta, frame.arrays)
        self.n += 1

    @staticmethod
    def position(pid: int, worker_index: int = 0) -> str:
        """A reader position as a worker of bench_tf_peer.py's sparse LR sends it (no shuffle)."""
        return ReaderPosition(epoch=0, file_index=0, path="/tmp/tf_peer/data/sparse_lr/train-00000-of-00004.tfrecord",
                              offset=pid * 40_000, record_index=pid * 512, records_consumed=pid * 512,
                              worker_index=worker_index, num_workers=2).to_json()

    def block(self, pushes: int) -> float:
        """CPU ms per push over ``pushes`` pushes."""
        started = time.process_time()
        for _ in range(pushes):
            self.push()
        return (time.process_time() - started) / pushes * 1e3


def stages(workload: str, pushes: int) -> None:
    """Prints the CPU ms per push of each stage of one entry, measured apart (see the module docstring)."""
    rng = np.random.default_rng(0)
    grads = [gradients(workload, rng) for _ in range(8)]
    primary, backup = ParameterService(0, holds_global_step=True), ParameterService(0, holds_global_step=True)
    primary.register(layout(workload).to_frame())
    dedup, counts, backup_dedup = DedupTable(PRIMARY), {"pushes_applied": 0}, DedupTable(BACKUP)
    write_entry(backup, backup_dedup, {}, full_entry(0, primary, dedup, counts))
    coalescing, coalescing_dedup = ParameterService(0, holds_global_step=True), DedupTable(BACKUP)
    write_entry(coalescing, coalescing_dedup, {}, full_entry(0, primary, dedup, counts))
    waiting: list[ReplicaEntry] = []
    names = ("apply", "capture", "small state", "to_frame", "encode", "decode", "from_frame", "write")
    spent = dict.fromkeys((*names, "write coalesced"), 0.0)
    state_bytes = 0
    side = Side(WireChannel(PRIMARY, {}), True, grads)
    for n in range(1, pushes + 21):
        worker, g = WORKERS[n % 2], grads[n % len(grads)]
        request = PushRequest(g, WorkerTag(worker, 1 + n % 2, 0, side.position(n), n, n - 1, (n - 1,)), step=True,
                              examples=512, loss=0.5)
        marks = [time.process_time()]
        reply = PushReply.from_frame(Frame(*primary.push(request.to_frame())))
        marks.append(time.process_time())
        variables = primary.variables
        parts = [capture(variables.part(key), rows, averages=False) for key, _, rows in g]
        marks.append(time.process_time())
        dedup.record(worker, 1 + n % 2, n, reply.meta(), n)
        state = task_state(primary, dedup, counts)
        marks.append(time.process_time())
        frame = ReplicateRequest(1, PRIMARY, BACKUP, (BACKUP,), [ReplicaEntry(n, state, tuple(parts))]).to_frame()
        marks.append(time.process_time())
        pieces, _ = encode_parts(frame.meta, frame.arrays)  # what the TCP carrier sends (sendmsg, no joined copy)
        marks.append(time.process_time())
        data = b"".join(pieces)  # (the kernel's copy, not timed)
        marks.append(time.process_time())
        decoded = decode(data)
        marks.append(time.process_time())
        entry = ReplicateRequest.from_frame(decoded).entries[0]
        marks.append(time.process_time())
        write_entry(backup, backup_dedup, {}, entry)
        marks.append(time.process_time())
        waiting.append(entry)
        if len(waiting) == COALESCE:
            began = time.process_time()
            write_entries(coalescing, coalescing_dedup, {}, waiting)
            if n > 20:
                spent["write coalesced"] += time.process_time() - began
            waiting = []
        del marks[5]  # the join's end: decode is timed from there
        if n > 20:  # after a warm-up
            for name, a, b in zip(names, marks[:-1], marks[1:], strict=True):
                spent[name] += b - a
            state_bytes = len(json.dumps(state, separators=(",", ":")))
    print(f"{workload}: one entry of {len(frame.arrays)} arrays, {len(data):,} bytes, its small state {state_bytes:,} "
          f"bytes of JSON; CPU ms per push, {pushes} pushes:")
    for name in (*names, "write coalesced"):
        print(f"  {name:12s} {spent[name] / pushes * 1e3:.3f}")
    if waiting:
        write_entries(coalescing, coalescing_dedup, {}, waiting)
    for key in primary.variables.partitions.keys():  # the coalesced backup ends as the one written entry by entry
        mine, theirs = coalescing.variables.part(key), backup.variables.part(key)
        if mine.value.tobytes() != theirs.value.tobytes() or any(
                mine.slots[k].tobytes() != theirs.slots[k].tobytes() for k in theirs.slots):
            raise SystemExit(f"{key}: the coalesced write differs from the writes one by one")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=["lr", "wd"], default="lr")
    p.add_argument("--pushes", type=int, default=200, help="pushes per block")
    p.add_argument("--blocks", type=int, default=6, help="blocks of each side, alternated")
    p.add_argument("--profile", help="cProfile one more block of replicated pushes into this file")
    p.add_argument("--stages", action="store_true", help="time each stage of one entry apart instead")
    args = p.parse_args()
    if args.stages:
        stages(args.workload, args.pushes)
        return

    rng = np.random.default_rng(0)
    grads = [gradients(args.workload, rng) for _ in range(8)]
    register = layout(args.workload)

    cluster = ClusterSpec({"ps": ["127.0.0.1:1"], "ps_backup": ["127.0.0.1:2"]})
    handlers: dict[str, dict[str, Handler]] = {}
    replicas: dict[str, ShardReplication] = {}
    for member in (PRIMARY, BACKUP):
        service = ParameterService(0, holds_global_step=True)
        replica = ShardReplication(ReplicationConfig(cluster, member, 0, replica_timeout=30.0), service,
                                   connect=lambda other: WireChannel(other, handlers[other]))
        replicas[member], handlers[member] = replica, replica.handlers(service.handlers())
    for replica in replicas.values():
        replica.start()
    deadline = time.monotonic() + 30
    while not (replicas[PRIMARY].view.view.role == "primary" and replicas[BACKUP].has_state):
        if time.monotonic() > deadline:
            raise SystemExit("the in-process shard did not form within 30 s")
        time.sleep(0.01)
    plain_service = ParameterService(0, holds_global_step=True)
    plain = WireChannel(PRIMARY, plain_service.handlers())
    replicated = WireChannel(PRIMARY, handlers[PRIMARY])
    for channel in (plain, replicated):
        frame = register.to_frame()
        channel.call(RegisterRequest.METHOD, frame.meta, frame.arrays)
        channel.call("SetReady", {}, {})
    sides = {"unreplicated": Side(plain, False, grads), "replicated": Side(replicated, True, grads)}
    for side in sides.values():
        side.block(20)  # warm-up
    ms: dict[str, list[float]] = {name: [] for name in sides}
    for b in range(args.blocks):
        order = list(sides) if b % 2 == 0 else list(reversed(sides))
        for name in order:
            ms[name].append(sides[name].block(args.pushes))
    for name, values in ms.items():
        print(f"{name:13s} CPU ms per push: median {statistics.median(values):.3f} "
              f"[{min(values):.3f}-{max(values):.3f}]")
    added = [r - u for r, u in zip(ms["replicated"], ms["unreplicated"], strict=True)]
    print(f"added by replication: median {statistics.median(added):.3f} ms per push "
          f"[{min(added):.3f}-{max(added):.3f}] ({args.workload}, {args.blocks} x {args.pushes} pushes per side)")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        sides["replicated"].block(args.pushes)
        profiler.disable()
        profiler.dump_stats(args.profile)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    for replica in replicas.values():
        replica.stop()


if __name__ == "__main__":
    main()
