"""Settings checked before any task starts (issue 25, item 8): memory of the ps tasks, dynamic tables' capacity."""

from __future__ import annotations

import pytest

from psflow.cluster import ClusterSpec
from psflow.optim import OptimizerSpec
from psflow.train.build import build_model
from psflow.train.config import ConfigError, TrainConfig
from psflow.train.preflight import available_memory, check_settings, ps_memory

GIB = 2**30


def config(**kw: object) -> TrainConfig:
    return TrainConfig.flat(train=("unused.libsvm",), **{"num_features": 124, **kw})  # type: ignore[arg-type]


def test_seed_out_of_range_is_a_config_error() -> None:
    for seed in (-1, 2**63):
        with pytest.raises(ConfigError, match=rf"--seed must be in \[0, 2\*\*63 - 1\], got {seed}"):
            config(seed=seed)
    assert config(seed=2**63 - 1).data.seed == 2**63 - 1


def test_the_issues_fm_table_is_refused_with_its_numbers() -> None:
    # --model fm --embedding-dim 100000000 on a9a: the ps died with a 46 GiB MemoryError.
    with pytest.raises(ConfigError) as caught:
        check_settings(config(model="fm", embedding_dim=100_000_000, num_ps=2), available=int(21.3 * GIB))
    assert str(caught.value).startswith("variable 'embedding' needs 92.4 GiB on ps/1 with its 1 adagrad slot; this "
                                        "machine has 21.3 GiB available: lower --num-features or --embedding-dim")


def test_memory_counts_values_and_slots_per_ps_task() -> None:
    cfg = config(num_features=1000, partitions=2, num_ps=2, optimizer="adam")
    cluster = ClusterSpec({"ps": ["h:1", "h:2"], "worker": ["h:3"]})
    _, variables = build_model(cfg, cluster)
    shares = {(s.name, s.task): (s.bytes, s.slots, s.optimizer)
              for s in ps_memory(variables.placements(), cfg.optimizer_spec())}
    assert shares[("weights", 0)] == (500 * 4 * 3, 2, "adam")  # values, m and v
    assert shares[("weights", 1)] == (500 * 4 * 3, 2, "adam")
    assert sum(b for (name, _), (b, _, _) in shares.items() if name == "bias") == 4 * 3
    plain = ps_memory(variables.placements(), OptimizerSpec("sgd", {"learning_rate": 0.1}))
    assert {s.bytes for s in plain if s.name == "weights"} == {500 * 4}


def test_the_ps_tasks_together_must_fit_and_the_message_lists_them() -> None:
    cfg = config(num_features=1 << 20, partitions=2, num_ps=2, optimizer="sgd")  # 2 MiB per task
    check_settings(cfg, available=5 * 2**20)
    with pytest.raises(ConfigError, match=r"the variables need 4\.0 MiB with their optimizer slots on the 2 ps tasks "
                                          r"\(ps/0: 2\.0 MiB, ps/1: 2\.0 MiB; largest: 'weights', 2\.0 MiB on ps/0\); "
                                          r"this machine has 3\.0 MiB available"):
        check_settings(cfg, available=3 * 2**20)


def test_no_memory_check_where_the_ps_tasks_run_elsewhere() -> None:
    check_settings(config(model="fm", embedding_dim=100_000_000), memory=False)


def test_dynamic_capacity_must_hold_a_row_of_every_table_on_every_ps_task() -> None:
    fm = config(model="fm", num_ps=2, model_params={"dynamic_table": {"capacity_bytes": 250}})
    with pytest.raises(ConfigError, match=r"--capacity-bytes 250 cannot hold one row of dynamic table 'embedding': a "
                                          r"row takes 161 bytes \(dim 8, 1 adagrad slot, metadata and index\), and the "
                                          r"table's share on each of the 2 ps tasks gets 125; give at least 322"):
        check_settings(fm, available=GIB)
    check_settings(config(model="fm", num_ps=2, model_params={"dynamic_table": {"capacity_bytes": 322}}), available=GIB)


def test_available_memory_reads_this_machine() -> None:
    free = available_memory()
    assert free is None or free > 0
