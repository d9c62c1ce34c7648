"""OptimizerSpec: which optimizer a variable uses and its hyperparameters, checked when it is made.

A model declares a spec per variable (:class:`~psflow.models.VariableSpec`), the run one from
``--optimizer``; the ps tasks apply it (:mod:`psflow.ps.optimizers`, where the update formulas are).
The spec is data only: it imports no runtime, so the models and the ps both use it.

Hyperparameters use TF's argument names. Defaults are TF's v1 defaults; a name
with no default in TF's signature is required here too:

=========  ==============================================================
sgd        learning_rate (required)
momentum   learning_rate (required), momentum (required), use_nesterov=False
adagrad    learning_rate (required), initial_accumulator_value=0.1 (> 0)
adam       learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8
ftrl       learning_rate (required, > 0), learning_rate_power=-0.5 (<= 0),
           initial_accumulator_value=0.1 (>= 0), l1_regularization_strength=0.0,
           l2_regularization_strength=0.0,
           l2_shrinkage_regularization_strength=0.0 (the three >= 0)
rmsprop    learning_rate (required), decay=0.9 (in [0, 1]), momentum=0.0
           (>= 0), epsilon=1e-10 (> 0), centered=False
=========  ==============================================================

Besides TF's range checks (shown in brackets), psflow requires every number to
be finite, Adam's beta1 and beta2 to lie in [0, 1) and its epsilon to be > 0.
TF accepts such values, but Adam then breaks: beta1 = 1 makes
1 - beta1_power zero, and epsilon = 0 gives 0/0 on rows that have had no
gradient yet. RMSProp's ranges are psflow's too (TF checks none): epsilon = 0
gives 0/0 once rms (or, centered, rms - mg * mg) reaches 0. A learning rate
that is a schedule is checked as a schedule, and FTRL's > 0 at every step: a
warm-up from 0, a cosine decay to ``alpha`` 0, a polynomial decay to 0, a piecewise
value of 0 are refused (FTRL divides by the rate: NaN at that step).

A spec's JSON form (:meth:`OptimizerSpec.to_json`) is what layouts and checkpoint manifests carry;
:func:`parse_optimizer` reads the ``--optimizer`` flag.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, cast

import numpy as np

from psflow.errors import PsError
from psflow.optim.schedules import ScheduleError, ScheduleSpec, parse_key_values

__all__ = [
    "OPTIMIZER_NAMES",
    "Hyperparameter",
    "Hyperparameters",
    "OptimizerError",
    "OptimizerSpec",
    "check_optimizer_name",
    "parse_optimizer",
    "resolve_hyperparameters",
]

#: A hyperparameter's value: a number, a flag, or (``learning_rate`` only) a schedule.
Hyperparameter = float | bool | ScheduleSpec
Hyperparameters = Mapping[str, Hyperparameter]

OPTIMIZER_NAMES: tuple[str, ...] = ("sgd", "momentum", "adagrad", "adam", "ftrl", "rmsprop")


class OptimizerError(PsError, ValueError):
    """Unknown optimizer name, or a hyperparameter that is unknown, missing or out of range."""


@dataclass(frozen=True)
class _Param:
    """How one hyperparameter is checked: its TF default (None: required) and range."""

    default: float | bool | None
    is_bool: bool = False
    rule: str = ""  # The range, as the error message states it, e.g. "> 0".
    check: Callable[[float], bool] | None = None
    schedulable: bool = False  # may be a ScheduleSpec (or its JSON object) instead of a number


def _positive(x: float) -> bool:
    return x > 0.0


def _non_negative(x: float) -> bool:
    return x >= 0.0


def _non_positive(x: float) -> bool:
    return x <= 0.0


def _unit_interval(x: float) -> bool:
    return 0.0 <= x < 1.0


def _closed_unit_interval(x: float) -> bool:
    return 0.0 <= x <= 1.0


_REQUIRED_LR = _Param(None, schedulable=True)
_NON_NEGATIVE = _Param(0.0, rule=">= 0", check=_non_negative)
_PARAMS: Mapping[str, Mapping[str, _Param]] = {
    "sgd": {"learning_rate": _REQUIRED_LR},
    "momentum": {
        "learning_rate": _REQUIRED_LR,
        "momentum": _Param(None),
        "use_nesterov": _Param(False, is_bool=True),
    },
    "adagrad": {
        "learning_rate": _REQUIRED_LR,
        "initial_accumulator_value": _Param(0.1, rule="> 0", check=_positive),
    },
    "adam": {
        "learning_rate": _Param(0.001, schedulable=True),
        "beta1": _Param(0.9, rule="in [0, 1)", check=_unit_interval),
        "beta2": _Param(0.999, rule="in [0, 1)", check=_unit_interval),
        "epsilon": _Param(1e-8, rule="> 0", check=_positive),
    },
    "ftrl": {
        "learning_rate": _Param(None, rule="> 0", check=_positive, schedulable=True),
        "learning_rate_power": _Param(-0.5, rule="<= 0", check=_non_positive),
        "initial_accumulator_value": _Param(0.1, rule=">= 0", check=_non_negative),
        "l1_regularization_strength": _NON_NEGATIVE,
        "l2_regularization_strength": _NON_NEGATIVE,
        "l2_shrinkage_regularization_strength": _NON_NEGATIVE,
    },
    "rmsprop": {
        "learning_rate": _REQUIRED_LR,
        "decay": _Param(0.9, rule="in [0, 1]", check=_closed_unit_interval),
        "momentum": _Param(0.0, rule=">= 0", check=_non_negative),
        "epsilon": _Param(1e-10, rule="> 0", check=_positive),
        "centered": _Param(False, is_bool=True),
    },
}


def check_optimizer_name(name: object) -> str:
    """``name`` if it is one of :data:`OPTIMIZER_NAMES`.

    Raises:
        OptimizerError: it is not.
    """
    if not isinstance(name, str) or name not in _PARAMS:
        raise OptimizerError(f"unknown optimizer {name!r}; valid names: {', '.join(OPTIMIZER_NAMES)}")
    return name


def _check_value(optimizer: str, key: str, param: _Param, value: object) -> Hyperparameter:
    where = f"optimizer {optimizer!r}: hyperparameter {key!r}"
    if param.schedulable and isinstance(value, (ScheduleSpec, Mapping)):
        try:
            schedule = value if isinstance(value, ScheduleSpec) else ScheduleSpec.from_json(value)
        except ScheduleError as e:
            raise OptimizerError(f"{where}: {e}") from e
        reason = schedule.reaches_zero() if param.check is _positive else None
        if reason is not None:  # FTRL divides by its rate: NaN at that step
            raise OptimizerError(f"{where} must be > 0 at every step: schedule {schedule.name!r}: {reason}")
        return schedule
    if param.is_bool:
        if not isinstance(value, (bool, np.bool_)):
            raise OptimizerError(f"{where} must be a bool, got {value!r}")
        return bool(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise OptimizerError(f"{where} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise OptimizerError(f"{where} must be finite, got {value!r}")
    if param.check is not None and not param.check(number):
        raise OptimizerError(f"{where} must be {param.rule}, got {value!r}")
    return number


def resolve_hyperparameters(optimizer: str, given: Mapping[str, object]) -> dict[str, Hyperparameter]:
    """Checks the given hyperparameters of a known optimizer and fills in TF's defaults (what
    :class:`OptimizerSpec` and every :class:`~psflow.ps.optimizers.Optimizer` do on construction).

    Returns:
        Every hyperparameter of ``optimizer``: numbers as float, flags as bool,
        a learning-rate schedule as a :class:`ScheduleSpec`.

    Raises:
        OptimizerError: a name is unknown, a required one is missing, or a value
            has the wrong type or is out of range.
    """
    params = _PARAMS[optimizer]
    accepted = ", ".join(params)
    for key in given:
        if key not in params:
            raise OptimizerError(f"optimizer {optimizer!r}: unknown hyperparameter {key!r}; accepted: {accepted}")
    resolved: dict[str, Hyperparameter] = {}
    for key, param in params.items():
        if key in given:
            resolved[key] = _check_value(optimizer, key, param, given[key])
        elif param.default is None:
            raise OptimizerError(
                f"optimizer {optimizer!r}: hyperparameter {key!r} is required (TF has no default); accepted: {accepted}"
            )
        else:
            resolved[key] = param.default
    return resolved


@dataclass(frozen=True)
class OptimizerSpec:
    """Which optimizer a variable uses, with its hyperparameters; checked on construction.

    Attributes:
        name: one of :data:`OPTIMIZER_NAMES`.
        hyperparameters: TF argument names to values, e.g.
            ``{"learning_rate": 0.1}``. Names left out take TF's default (see
            the module docstring). ``learning_rate`` may be a
            :class:`~psflow.optim.schedules.ScheduleSpec` or its JSON object.
            Stored as a read-only copy, numbers as float, a schedule as a
            ScheduleSpec.

    Raises:
        OptimizerError: the name is unknown, or a hyperparameter is unknown,
            missing, of the wrong type or out of range.
    """

    name: str
    hyperparameters: Hyperparameters = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        name = check_optimizer_name(self.name)
        given = self.hyperparameters
        if not isinstance(given, Mapping) or not all(isinstance(key, str) for key in given):
            raise OptimizerError(f"optimizer {name!r}: hyperparameters must map str to values, got {given!r}")
        resolved = resolve_hyperparameters(name, given)
        object.__setattr__(self, "hyperparameters", MappingProxyType({key: resolved[key] for key in given}))

    def __reduce__(self) -> tuple[Any, ...]:
        # A mappingproxy cannot be pickled; rebuild the spec from a plain dict.
        return (OptimizerSpec, (self.name, dict(self.hyperparameters)))

    def to_json(self) -> dict[str, object]:
        """Returns ``{"name": ..., "hyperparameters": {...}}`` (a schedule as its JSON object), which
        ``from_json`` reads back as an equal spec."""
        return {"name": self.name, "hyperparameters": {
            key: value.to_json() if isinstance(value, ScheduleSpec) else value
            for key, value in self.hyperparameters.items()}}

    @property
    def schedule(self) -> ScheduleSpec | None:
        """The learning rate's schedule, or None where it is a number (or TF's default)."""
        lr = self.hyperparameters.get("learning_rate")
        return lr if isinstance(lr, ScheduleSpec) else None

    def learning_rate_at(self, step: int) -> float:
        """The learning rate an update applied at global step ``step`` (before its increment) uses, as float32
        rounds it; the same at every step unless it is a schedule."""
        lr = self.hyperparameters.get("learning_rate", _PARAMS[self.name]["learning_rate"].default)
        if isinstance(lr, ScheduleSpec):
            return float(lr.value(step))
        return float(np.float32(cast(float, lr)))  # checked on construction: a number where not a schedule

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> OptimizerSpec:
        """Parses the output of :meth:`to_json` (``"hyperparameters"`` may be left out).

        Raises:
            OptimizerError: ``data`` is not such an object, has other keys, or
                names an invalid optimizer or hyperparameters.
        """
        if not isinstance(data, Mapping):
            raise OptimizerError(f"optimizer spec must be a JSON object, got {data!r}")
        extra = sorted(str(key) for key in data if key not in ("name", "hyperparameters"))
        if extra:
            raise OptimizerError(f"optimizer spec has unknown keys {extra}; accepted: name, hyperparameters")
        if "name" not in data:
            raise OptimizerError(f"optimizer spec has no 'name'; valid names: {', '.join(OPTIMIZER_NAMES)}")
        name = check_optimizer_name(data["name"])
        hyperparameters = data.get("hyperparameters", {})
        if not isinstance(hyperparameters, Mapping):
            raise OptimizerError(f"optimizer {name!r}: 'hyperparameters' must be an object, got {hyperparameters!r}")
        return cls(name, hyperparameters)


def parse_optimizer(text: str) -> dict[str, Any]:
    """The JSON form of an optimizer (``{"name", "hyperparameters"}``) from a flag.

    ``text`` is ``NAME``, ``NAME:KEY=VALUE,...``
    (``adagrad:learning_rate=0.05,initial_accumulator_value=0.1``;
    ``rmsprop:momentum=0.9,centered=true``: flags are ``true``/``false``) or the
    JSON of :meth:`OptimizerSpec.to_json`. Not yet checked against the optimizer
    (a model may fill in its own defaults first): pass it to
    :meth:`OptimizerSpec.from_json`.

    Raises:
        OptimizerError: malformed text, or an unknown optimizer name.
    """
    text = text.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as e:
            raise OptimizerError(f"optimizer {text!r}: bad JSON: {e}") from e
        return OptimizerSpec.from_json(data).to_json()
    name, _, rest = text.partition(":")
    try:
        hyperparameters = parse_key_values(rest, f"optimizer {text!r}")
    except ValueError as e:
        raise OptimizerError(str(e)) from None
    return {"name": check_optimizer_name(name.strip()), "hyperparameters": hyperparameters}
