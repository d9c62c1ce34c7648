"""A restore within the run after the whole of shard 0 was lost, where member 0's global_step journal names an older
run than the one another member's journal bounds (guarantee 2), without sockets.

ps:0 was down through the whole of run-a's primary's time (a long-lived ``psflow server`` whose --state-dir last
served run-z); ps_backup:0, run-a's primary, handed out run-a's values up to 800; both lost and restarted. The fresh
primary keeps run-z's floor and remembers run-a's (:meth:`psflow.ps.global_step.GlobalStep.adopt`): run-a's floor
is taken when a Register names run-a. run-a's newest checkpoint is at step 500. Whoever restores (a restarted chief's
join, the lease holder's :class:`~psflow.train.recovery.ClusterRecovery`, the in-graph client) must go on past 800:
not hand out 501-800 again, nor skip to run-z's floor.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from journaled_shard import JournaledShard, handed_out, reread
from replica_shard import PRIMARY, backup

from psflow.checkpoint.save import CheckpointManager
from psflow.cluster import ClusterSpec
from psflow.gradients import DenseGradient
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.service import ParameterService
from psflow.rpc.api import Handler
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.chief import join_cluster
from psflow.train.config import TrainConfig
from psflow.train.duties import run_id
from psflow.train.in_graph_client import _restore_initialized_cluster
from psflow.train.recovery import ClusterRecovery
from psflow.train.session import MonitoredTrainingSession
from psflow.train.state_loss import ps_states
from psflow.train.within_run import lost_within_run

pytestmark = pytest.mark.timeout(60)

SGD = OptimizerSpec("sgd", {"learning_rate": 0.5})
CHECKPOINT_STEP = 500


def _client(handlers: dict[str, Handler]) -> ParameterClient:
    vs = VariableSet(replica_device_setter(cluster=ClusterSpec({"ps": ["127.0.0.1:1"]})))
    vs.get_variable("weights", (8, 2))
    vs.get_variable("bias", (2,))
    return ParameterClient(ClusterSpec({"ps": ["127.0.0.1:1"]}), vs.placements(), client_name="/job:worker/task:0",
                           channels={0: InProcessChannel(PRIMARY, handlers)})


def _checkpoint_of_run_a(directory: Path) -> str:
    """run-a's newest checkpoint, at step 500 (written by a cluster of its own: only its files matter here)."""
    service = ParameterService(0, holds_global_step=True)
    client = _client(service.handlers())
    join_cluster(client, SGD, chief=True, checkpoint_dir=str(directory))
    assert service.global_step is not None
    service.global_step.set(CHECKPOINT_STEP)
    CheckpointManager(str(directory), run_id="run-a").save(client)
    return str(directory)


def _push(client: ParameterClient) -> int:
    return client.push_detailed({"weights": DenseGradient(np.ones((8, 2), np.float32)),
                                 "bias": DenseGradient(np.ones(2, np.float32))},
                                generation=client.ps_stats().generation).step


@pytest.fixture
def journaled(tmp_path: Path) -> Iterator[JournaledShard]:
    shard = JournaledShard(tmp_path / "state")
    yield shard
    shard.stop()


def _lost_shard(journaled: JournaledShard, older_floor: int) -> ParameterClient:
    """Every member lost and restarted: ps:0's journal of run-z at ``older_floor``, ps_backup:0's of run-a at 800."""
    handed_out(journaled.journal(PRIMARY), "run-z", older_floor)
    handed_out(journaled.journal(backup(0)), "run-a", 800)
    assert journaled.restart_all() == (older_floor, "run-z")  # it cannot tell which run is current
    return _client(journaled.handlers[PRIMARY])


def _went_on_past_800(journaled: JournaledShard, client: ParameterClient) -> None:
    assert client.global_step() == 800
    assert _push(client) == 801
    assert reread(journaled.journal(PRIMARY))[1] == "run-a", "ps:0's journal names the run it hands values out for"
    copy = journaled.services[backup(0)].global_step
    journaled.wait(lambda: copy is not None and (copy.run, copy.value) == ("run-a", 801), "the backup follows run-a")


@pytest.mark.parametrize("older_floor", [300, 5000], ids=["below-the-checkpoint", "above-the-checkpoint"])
def test_the_lease_holder_s_restore_goes_on_past_the_floor_another_member_holds_for_its_run(
        tmp_path: Path, journaled: JournaledShard, older_floor: int) -> None:
    """A worker holding the chief lease restores (the chief kept running): its Register named no run, so nothing
    claimed run-a on the fresh primary and BeginRestore replied run-z's floor: global_step went on from the
    checkpoint's 500 (501-800 handed out again) or from run-z's 5000 (run-a's steps skipped to another run's)."""
    ckpt = _checkpoint_of_run_a(tmp_path / "ckpt")
    client = _lost_shard(journaled, older_floor)
    ClusterRecovery(client, SGD, checkpoint_dir=ckpt, leader=lambda: None, timeout=30.0,
                    run="run-a").restore(None, ps_states(client))
    _went_on_past_800(journaled, client)


@pytest.mark.parametrize("older_floor", [300, 5000], ids=["below-the-checkpoint", "above-the-checkpoint"])
def test_a_chief_restarted_with_every_task_goes_on_past_the_floor_another_member_holds_for_its_run(
        tmp_path: Path, journaled: JournaledShard, older_floor: int) -> None:
    """The restarted chief's join reads ps task 0's Stats after its Register, whose claim of run-a takes the floor
    heard for it: the loss counts as within run-a and the restore, at a new generation, goes on past 800."""
    ckpt = _checkpoint_of_run_a(tmp_path / "ckpt")
    client = _lost_shard(journaled, older_floor)
    result = join_cluster(client, SGD, chief=True, checkpoint_dir=ckpt, run="run-a")
    assert result.restored is not None and result.generation is not None and result.generation > 0
    _went_on_past_800(journaled, client)


@pytest.mark.parametrize("older_floor", [300, 5000], ids=["below-the-checkpoint", "above-the-checkpoint"])
def test_the_in_graph_client_restarted_with_every_task_leaves_the_loss_to_its_join(
        tmp_path: Path, journaled: JournaledShard, older_floor: int) -> None:
    """The in-graph client asks before any Register (``_restore_initialized_cluster``): ps task 0's Stats name run-z,
    whose floor bounds none of run-a's values (above the checkpoint's step it counted as run-a's loss, and the
    restore's log named 5000 as the bound of run-a's values). Not counted there, the loss is the join's to judge, after
    its Register (as the chief's above)."""
    ckpt = _checkpoint_of_run_a(tmp_path / "ckpt")
    client = _lost_shard(journaled, older_floor)
    states = ps_states(client)
    assert states[0] is not None and (states[0].step_floor, states[0].step_run) == (older_floor, "run-z")
    assert not lost_within_run(ckpt, "run-a", states, client.step_task)
    result = join_cluster(client, SGD, chief=True, checkpoint_dir=ckpt, run="run-a")
    assert result.generation is not None and result.generation > 0
    _went_on_past_800(journaled, client)


@pytest.mark.parametrize("older_floor", [300, 5000], ids=["below-the-checkpoint", "above-the-checkpoint"])
def test_the_in_graph_client_s_own_restore_and_then_its_session_s_join_go_on_past_that_floor(
        tmp_path: Path, journaled: JournaledShard, older_floor: int) -> None:
    """The in-graph client's path itself, in its order (:func:`~psflow.train.in_graph_client.run_in_graph_client`):
    ``_restore_initialized_cluster`` restores nothing (no generation begun, ps task 0 still naming run-z), then its
    session (chief, the run's id as ``make_session`` gives it) joins: its Register claims run-a, its join reads ps
    task 0's Stats again and restores at a new generation past 800."""
    ckpt = _checkpoint_of_run_a(tmp_path / "ckpt")
    client = _lost_shard(journaled, older_floor)
    config = TrainConfig().with_(checkpoint_dir=ckpt, run_id="run-a", connect_timeout=30.0, optimizer="sgd",
                                 learning_rate=0.5)
    assert config.optimizer_spec() == SGD
    assert _restore_initialized_cluster(config, client) is None
    assert client.ps_stats().generation == 0 and client.ps_stats().step_run == "run-z", "nothing registered yet"
    with MonitoredTrainingSession(client, config.optimizer_spec(), is_chief=True, checkpoint_dir=ckpt,
                                  run=run_id(config, client.cluster)) as session:
        joined = session.join_result
        assert joined is not None and joined.restored is not None
        assert joined.generation is not None and joined.generation > 0 and session.global_step == 800
        _went_on_past_800(journaled, client)
