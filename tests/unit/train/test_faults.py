"""Fault injection travels beside the settings, never in them (psflow.train.faults)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from psflow.train.config import FLAT_FIELDS, ConfigError, TrainConfig
from psflow.train.faults import NO_FAULTS, FaultInjection, read_task_config, task_config_json

pytestmark = pytest.mark.timeout(30)


def test_the_task_config_file_carries_the_faults_beside_the_settings() -> None:
    config = TrainConfig.flat(train=("a9a",), num_features=124, max_steps=10)
    faults = FaultInjection(checkpoint_exit="shards_written", step_delay={1: 0.05}, step_lag={2: 4})
    text = task_config_json(config, faults)
    assert json.loads(text)["faults"] == {"checkpoint_exit": "shards_written", "step_delay": {"1": 0.05},
                                          "step_lag": {"2": 4}}
    assert read_task_config(text) == (config, faults)
    assert (faults.delay(1), faults.delay(0), faults.lag(2), faults.lag(1)) == (0.05, 0.0, 4, 0)
    # Nothing injected: the file is the config's JSON alone, and reads back without faults.
    assert task_config_json(config) == task_config_json(config, NO_FAULTS) == config.to_json()
    assert read_task_config(config.to_json()) == (config, NO_FAULTS)


def test_no_setting_of_the_run_is_a_fault() -> None:
    names = {f.name for f in dataclasses.fields(TrainConfig)} | set(FLAT_FIELDS)
    assert "epochs" in names and "data" in names
    assert not names & {"fault_point", "extra", "step_delay", "step_lag"}


@pytest.mark.parametrize(("data", "message"), [
    ({"step_delay": {"x": 1.0}}, "fault injection: invalid literal"),
    ({"step_delay": {"-1": 1.0}}, "step_delay: worker index -1"),
    ({"step_lag": {"0": -2}}, "step_lag: worker 0's -2"),
    ({"delay": {}}, "unknown key 'delay'"),
])
def test_a_bad_fault_is_refused_naming_it(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        FaultInjection.from_dict(data)
