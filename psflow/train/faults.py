"""FaultInjection: faults that tests and drills put into a run, kept apart from its settings.

A run's settings (:class:`~psflow.train.config.TrainConfig`) say what to train; a
:class:`FaultInjection` says where a test or a drill breaks it on purpose: the chief
process exits at a checkpoint phase (``psflow train --fault-point PHASE``, a hidden
flag for tests), a worker is slowed (``step_delay``) or made a straggler
(``step_lag``). No user flag sets the worker faults.

It travels to the task processes in the same file as the settings: the task config
file (``config.json`` of a run) is the config's JSON object with the faults beside
it under the key ``"faults"`` (:func:`task_config_json`, :func:`read_task_config`);
the key is absent when nothing is injected, so a file without it is a run without
faults.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from psflow.train.config import ConfigError, TrainConfig

__all__ = ["FaultInjection", "NO_FAULTS", "task_config_json", "read_task_config"]

#: The task config file's key of the faults.
_KEY = "faults"


@dataclass(frozen=True)
class FaultInjection:
    """Faults injected into a run (tests and drills only).

    Attributes:
        checkpoint_exit: the chief process exits (code 75) when a checkpoint save reaches this phase
            (:class:`~psflow.checkpoint.save.CheckpointManager`'s ``fault`` hook); None: never.
        step_delay: worker index -> seconds it sleeps between its pull and its push (a slow worker).
        step_lag: worker index -> N: before each push it waits until global_step is N past the step it
            read (a straggler whose every sync push is stale).
    """

    checkpoint_exit: str | None = None
    step_delay: Mapping[int, float] = field(default_factory=dict)
    step_lag: Mapping[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, table in (("step_delay", self.step_delay), ("step_lag", self.step_lag)):
            for index, value in table.items():
                if not isinstance(index, int) or index < 0:
                    raise ConfigError(f"fault injection {name}: worker index {index!r} is not an index >= 0")
                if not isinstance(value, (int, float)) or value < 0:
                    raise ConfigError(f"fault injection {name}: worker {index}'s {value!r} is not a number >= 0")

    def delay(self, worker: int) -> float:
        """Seconds worker ``worker`` sleeps between its pull and its push (0: none)."""
        return float(self.step_delay.get(worker, 0.0))

    def lag(self, worker: int) -> int:
        """Global steps worker ``worker`` waits past its read before each push (0: none)."""
        return int(self.step_lag.get(worker, 0))

    def empty(self) -> bool:
        """Whether nothing is injected."""
        return self.checkpoint_exit is None and not self.step_delay and not self.step_lag

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: worker indices as strings (JSON keys)."""
        return {"checkpoint_exit": self.checkpoint_exit,
                "step_delay": {str(k): float(v) for k, v in self.step_delay.items()},
                "step_lag": {str(k): int(v) for k, v in self.step_lag.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FaultInjection:
        """Reads :meth:`to_dict`'s form.

        Raises:
            ConfigError: an unknown key or a bad worker index or value (names it).
        """
        unknown = sorted(set(data) - {"checkpoint_exit", "step_delay", "step_lag"})
        if unknown:
            raise ConfigError(f"fault injection: unknown key {unknown[0]!r} (known: checkpoint_exit, step_delay, "
                              "step_lag)")
        try:
            delay = {int(k): float(v) for k, v in dict(data.get("step_delay") or {}).items()}
            lag = {int(k): int(v) for k, v in dict(data.get("step_lag") or {}).items()}
        except (TypeError, ValueError) as e:
            raise ConfigError(f"fault injection: {e}") from None
        exit_at = data.get("checkpoint_exit")
        return cls(str(exit_at) if exit_at else None, delay, lag)


#: Nothing injected.
NO_FAULTS = FaultInjection()


def task_config_json(config: TrainConfig, faults: FaultInjection | None = None) -> str:
    """The task config file: ``config``'s JSON object, with ``faults`` under ``"faults"`` unless none.

    Raises:
        ConfigError: as :meth:`TrainConfig.to_json`.
    """
    text = config.to_json()
    if faults is None or faults.empty():
        return text
    data = json.loads(text)
    data[_KEY] = faults.to_dict()
    return json.dumps(data, indent=1)


def read_task_config(text: str) -> tuple[TrainConfig, FaultInjection]:
    """The settings and the faults of a task config file (:func:`task_config_json`).

    Raises:
        ConfigError: a setting or a fault is invalid (names it).
    """
    data = json.loads(text)
    faults = FaultInjection.from_dict(data.pop(_KEY)) if isinstance(data, dict) and _KEY in data else NO_FAULTS
    return TrainConfig.from_json(json.dumps(data)), faults
