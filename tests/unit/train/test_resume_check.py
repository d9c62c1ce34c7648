"""The resume check (``psflow.train.preflight.check_resume``) lets every optimizer resume its own checkpoint.

Adam's checkpoints hold its beta powers (``beta1_power``, ``beta2_power``: 0-d state saved beside ``m`` and ``v``
in each partition's slots), which the check did not count as Adam's: every ``--optimizer adam`` run's checkpoint
was refused by the next run with the same optimizer, as "written with --optimizer adam (... slots beta1_power,
beta2_power, m, v); this run asks for adam (slots m, v)", so an Adam run could never be resumed. Real
checkpoints written by in-process ps services, each optimizer on 1 and 2 partitions. And a checkpoint written with
other dynamic table options is refused naming each flag and both values (``psflow.train.chief.check_restorable``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from psflow.checkpoint.manifest import Manifest
from psflow.checkpoint.save import CheckpointManager
from psflow.cluster import ClusterSpec
from psflow.errors import CheckpointError, ConfigError
from psflow.models.api import DYNAMIC_TABLE_PARAM
from psflow.ps.client import ParameterClient
from psflow.ps.service import ParameterService
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.build import build_model
from psflow.train.chief import check_restorable
from psflow.train.config import TrainConfig
from psflow.train.preflight import check_resume

pytestmark = pytest.mark.timeout(60)

OPTIMIZERS = ["sgd", "momentum", "adagrad", "adam", "ftrl", "rmsprop", "rmsprop:centered=true"]


def _save(directory: Path, config: TrainConfig) -> None:
    """A checkpoint of ``config``'s model, written by in-process ps services as a run's chief writes it."""
    cluster = ClusterSpec({"ps": [f"127.0.0.1:{i + 1}" for i in range(config.cluster.num_ps)]})
    _, variables = build_model(config, cluster)
    services = [ParameterService(i, holds_global_step=i == 0) for i in range(config.cluster.num_ps)]
    client = ParameterClient(cluster, variables.placements(), client_name="chief",
                             channels={i: InProcessChannel(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)})
    client.register(config.optimizer_spec(), chief=True)
    CheckpointManager(str(directory), transport="rpc").save(client, optimizer=config.optimizer_spec().to_json())


def _config(directory: Path, optimizer: str, partitions: int, *, dynamic: bool = False) -> TrainConfig:
    name, _, params = optimizer.partition(":")
    model = {"model": "fm", "model_params": {DYNAMIC_TABLE_PARAM: {}}} if dynamic else {}
    return TrainConfig.flat(train=("unused",), num_features=124, num_ps=partitions, partitions=partitions,
                            optimizer=name, optimizer_params={"centered": True} if params else {},
                            checkpoint_dir=str(directory), **model)


@pytest.mark.parametrize("partitions", [1, 2])
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_a_checkpoint_resumes_with_its_own_optimizer(tmp_path: Path, optimizer: str, partitions: int) -> None:
    config = _config(tmp_path / "ckpt", optimizer, partitions)
    _save(tmp_path / "ckpt", config)
    for resumed in (config, _config(tmp_path / "ckpt", optimizer, 3 - partitions)):  # also on another layout
        _, layout = build_model(resumed, ClusterSpec({"ps": [f"127.0.0.1:{i + 1}" for i in range(resumed.cluster.num_ps)]}))
        check_resume(resumed, layout.placements())


@pytest.mark.parametrize("optimizer", ["adam", "ftrl"])
def test_a_dynamic_tables_checkpoint_resumes_with_its_own_optimizer(tmp_path: Path, optimizer: str) -> None:
    """A dynamic table's checkpoint holds Adam's m and v without the beta powers (and static variables beside
    it hold them): it resumes too."""
    config = _config(tmp_path / "ckpt", optimizer, 2, dynamic=True)
    _save(tmp_path / "ckpt", config)
    _, layout = build_model(config, ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]}))
    check_resume(config, layout.placements())


@pytest.mark.parametrize(("saved", "asked"), [("adam", "adagrad"), ("ftrl", "adam"), ("rmsprop", "rmsprop:centered=true")])
def test_another_optimizer_is_still_refused(tmp_path: Path, saved: str, asked: str) -> None:
    _save(tmp_path / "ckpt", _config(tmp_path / "ckpt", saved, 1))
    resumed = _config(tmp_path / "ckpt", asked, 1)
    _, layout = build_model(resumed, ClusterSpec({"ps": ["127.0.0.1:1"]}))
    with pytest.raises(ConfigError, match=f"was written with --optimizer {saved.partition(':')[0]} .*; this run asks "
                                          f"for {asked.partition(':')[0]} "):
        check_resume(resumed, layout.placements())


def _record(params: dict[str, object]) -> dict[str, object]:
    """A model record (:func:`psflow.train.build.model_record`) of logistic with these model parameters."""
    return {"name": "logistic", "config": {"features": {}, "num_features": 124, "partitions": 1, "embedding_dim": 8,
                                           "params": params, "seed": 0},
            "data": {"format": "libsvm", "schema": None, "num_features": 124}}


def test_a_checkpoint_of_other_dynamic_table_options_names_their_flags() -> None:
    """A run resumed with another --capacity (or --admit-after, ...) than its checkpoint was told only that 'the
    model's parameters (--model-param, --hidden, --wide-optimizer, --deep-optimizer)' differ: none of the flags the
    user changed, nor the values."""
    saved = Manifest(global_step=3, variables={}, shards=[], model=_record({DYNAMIC_TABLE_PARAM: {"capacity_rows": 1000,
                                                                                                   "admit_after": 2}}))
    with pytest.raises(CheckpointError, match=r"another model: --capacity 1000 \(this run: 5000\); --admit-after 2 "
                                              r"\(this run: none\); --ttl-steps none \(this run: 9\)\. Refusing"):
        check_restorable("ck", saved, _record({DYNAMIC_TABLE_PARAM: {"capacity_rows": 5000, "ttl_steps": 9}}))
    with pytest.raises(CheckpointError, match=r"another model: --embedding-table dynamic \(this run: static\)\. Refusing"):
        check_restorable("ck", saved, _record({}))
    with pytest.raises(CheckpointError, match=r"another model: --embedding-table static \(this run: dynamic\); the "
                                              r"model's parameters \(--model-param, --hidden"):
        check_restorable("ck", Manifest(global_step=3, variables={}, shards=[], model=_record({"hidden": [4]})),
                         _record({DYNAMIC_TABLE_PARAM: {}}))
    assert check_restorable("ck", saved, _record({DYNAMIC_TABLE_PARAM: {"admit_after": 2, "capacity_rows": 1000}})) == []


def test_a_dynamic_table_option_without_a_flag_is_named_by_the_flag_that_sets_it() -> None:
    """An option only --model-param dynamic_table={...} sets (sketch_width, seed, ...) was shown by its raw name,
    'sketch_width 1024 (this run: 2048)', which no flag of psflow train is called."""
    saved = Manifest(global_step=3, variables={}, shards=[],
                     model=_record({DYNAMIC_TABLE_PARAM: {"capacity_rows": 1000, "sketch_width": 1024}}))
    with pytest.raises(CheckpointError, match=r"another model: --model-param dynamic_table's sketch_width 1024 "
                                              r"\(this run: 2048\)\. Refusing"):
        check_restorable("ck", saved, _record({DYNAMIC_TABLE_PARAM: {"capacity_rows": 1000, "sketch_width": 2048}}))
