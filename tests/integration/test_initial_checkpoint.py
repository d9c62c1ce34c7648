"""The chief's initial checkpoint lands before any other worker can push: it truly holds global step 0.

Before, the chief made the ps tasks ready (``SetReady``) and only then, in its saver's
``after_create_session``, wrote the initial checkpoint; the other workers, waiting for readiness only,
trained meanwhile. Under load worker 1 was seen at global step 45 (and 120) before the "initial"
checkpoint landed: a ps task killed then could not be restored ("restarted with no checkpoint to restore
from"), and ckpt-000000000 held pushes of other workers. Now the chief writes it after initializing and
before ``SetReady`` (the hooks' ``after_initialize``).

Real ps task processes (``local_cluster``), the chief's and a non-chief's clients in this process. The
chief's initial save is held by an event (never a sleep) while the non-chief tries to join: the ps tasks
must not be ready then, whatever the machine's speed.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from support import A9A, TOKEN

from psflow.checkpoint.manifest import SavedCheckpoint, read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointManager
from psflow.data import read_all
from psflow.ps.client import ParameterClient
from psflow.rpc.api import ConnectConfig, TaskUnavailableError
from psflow.train.build import build_model
from psflow.train.chief import join_cluster
from psflow.train.config import TrainConfig
from psflow.train.faults import FaultInjection, task_config_json
from psflow.train.hooks import CheckpointSaverHook
from psflow.train.session import MonitoredTrainingSession
from psflow.train.step import TrainStep

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CONFIG = TrainConfig.flat(train=(str(A9A),), num_features=124, optimizer="adagrad", batch_size=256, num_ps=2,
                          num_workers=2, connect_timeout=60.0)
#: Generous bound of every wait on the other thread (a passing run never meets it).
LIMIT = 120.0


class _HeldFirstSave(CheckpointManager):
    """A manager whose first save waits (``saving`` set) until the test sets ``go``."""

    def __init__(self, directory: str) -> None:
        super().__init__(directory)
        self.saving, self.go = threading.Event(), threading.Event()

    def save(self, client: ParameterClient, **kw: Any) -> SavedCheckpoint:
        if not self.saving.is_set():
            self.saving.set()
            if not self.go.wait(LIMIT):
                raise AssertionError("the test never let the initial save go")
        return super().save(client, **kw)


def _client(handle: Any, name: str) -> ParameterClient:
    _, variables = build_model(CONFIG, handle.cluster)
    client = ParameterClient(handle.cluster, variables.placements(), client_name=name,
                             config=ConnectConfig(connect_timeout=30, token=TOKEN))
    client.connect()
    return client


def _steps(client: ParameterClient, first: int, count: int) -> list[int]:
    """``count`` pushes of a worker (its generation and a reader position carried, as a worker's are); their steps."""
    model, _ = build_model(CONFIG, client.cluster)
    batch, step = read_all([str(A9A)], "libsvm"), TrainStep(model, client)
    return [step(batch.slice(k * 256, k * 256 + 256), generation=0).step for k in range(first, first + count)]


def test_no_worker_pushes_before_the_chief_s_initial_checkpoint(local_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    handle = local_cluster(2)
    ckpt = tmp_path / "ckpt"
    chief, other = _client(handle, "/job:worker/task:0"), _client(handle, "/job:worker/task:1")
    manager = _HeldFirstSave(str(ckpt))
    saver = CheckpointSaverHook(manager, save_steps=1000)
    session = MonitoredTrainingSession(chief, CONFIG.optimizer_spec(), is_chief=True, checkpoint_dir=str(ckpt),
                                       chief_only_hooks=[saver])
    entered: list[BaseException | None] = []

    def enter() -> None:
        try:
            session.__enter__()
            entered.append(None)
        except BaseException as e:  # reported below
            entered.append(e)

    starting = threading.Thread(target=enter, daemon=True)
    starting.start()
    try:
        assert manager.saving.wait(LIMIT), "the chief never began its initial checkpoint"
        # Worker 1, as fast as can be: it asks whether the cluster is ready while the chief's save is held. Once the
        # chief created the variables a worker waits save_timeout past its ready_timeout (the save's deadline): 1 s.
        patient, other.config = other.config, dataclasses.replace(other.config, save_timeout=1.0)
        try:
            join_cluster(other, CONFIG.optimizer_spec(), chief=False, ready_timeout=1.0)
            early = _steps(other, 0, 3)
        except TaskUnavailableError:
            early = []
        finally:
            other.config = patient
    finally:
        manager.go.set()
        starting.join(LIMIT)
    assert entered == [None], entered
    assert not early, f"worker 1 joined and pushed global steps {early} before the chief's initial checkpoint"
    (path, step), = saver.saved
    assert (Path(path).name, step) == ("ckpt-000000000", 0)
    initial = read_manifest(path)
    assert initial.global_step == 0 and initial.examples == 0 and not initial.reader_positions, initial

    # Training goes on once the cluster is ready: worker 1 joins, and its pushes are the first steps.
    assert not join_cluster(other, CONFIG.optimizer_spec(), chief=False, ready_timeout=LIMIT).created
    assert _steps(other, 0, 3) == [1, 2, 3]
    session.__exit__(None, None, None)  # the final checkpoint, at step 3
    assert [s for _, s in saver.saved] == [0, 3] and read_manifest(saver.saved[-1][0]).final
    assert [chief.stats(t)["init_count"] for t in (0, 1)] == [1, 1]
    other.close()

    # A run that restores from that directory writes no initial checkpoint of its own.
    again = local_cluster(2)
    resumed = _client(again, "/job:worker/task:0")
    plain = CheckpointSaverHook(CheckpointManager(str(ckpt)), save_steps=1000)
    with MonitoredTrainingSession(resumed, CONFIG.optimizer_spec(), is_chief=True, checkpoint_dir=str(ckpt),
                                  chief_only_hooks=[plain]) as restored:
        assert restored.join_result is not None and restored.join_result.restored == saver.saved[-1][0]
        assert plain.saved == []
    chief.close()
    resumed.close()


def test_a_chief_killed_during_its_initial_save_is_followed_by_one_that_saves_step_0(local_cluster,  # type: ignore[no-untyped-def]
                                                                                       tmp_path: Path) -> None:
    """Worker processes, chief election on (a checkpoint directory: the default of between-graph runs): the chief's
    first process exits (the test's fault point) once the ps tasks wrote the initial checkpoint's shards, before its
    manifest. Its next process finds the ps tasks registered but not ready, and the dead one's lease not yet
    expired: it must still write the initial checkpoint (step 0) before it makes them ready, so no worker trains
    without a checkpoint to restore; the dead process's partial directory is never restored."""
    ckpt = tmp_path / "ckpt"
    config = CONFIG.with_(epochs=1, checkpoint_dir=str(ckpt), save_checkpoints_steps=100000, log_every=10)
    handle = local_cluster(2, 2)
    faulty, plain = tmp_path / "faulty.json", tmp_path / "plain.json"
    faulty.write_text(task_config_json(config, FaultInjection(checkpoint_exit="shards_written")))
    plain.write_text(task_config_json(config))
    first = handle.start("worker", 0, "--config", str(faulty), "--result", str(tmp_path / "first.json"))
    assert first.wait(timeout=LIMIT) == 75, handle.logs()
    assert latest_checkpoint(str(ckpt)) is None and list(ckpt.glob("ckpt-*")), handle.logs()  # the partial one
    # As a restart policy does: the chief's next process at once, the other worker beside it.
    for i in (0, 1):
        handle.start("worker", i, "--config", str(plain), "--result", str(tmp_path / f"r{i}.json"))
    for i in (0, 1):
        assert handle.procs[("worker", i)].wait(timeout=LIMIT) == 0, handle.logs()
    log = handle.log("worker", 0)
    saves = re.findall(r"saved checkpoint (\S+) at step (\d+)", log)
    assert saves and int(saves[0][1]) == 0, f"the restarted chief's first checkpoint: {saves}\n{log[-3000:]}"
    assert read_manifest(saves[0][0]).global_step == 0
    assert not re.search(r"restored checkpoint", log)
    # ckpt-000000000 was in use (the partial one) when the save began; the save's sweep removed it.
    assert Path(saves[0][0]).name.startswith("ckpt-000000000-")
    assert all((d / "manifest.json").exists() for d in ckpt.glob("ckpt-*")), sorted(ckpt.iterdir())
