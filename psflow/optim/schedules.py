"""Learning-rate schedules: TF1's ``tf.compat.v1.train`` decays, evaluated on the ps tasks.

An optimizer's ``learning_rate`` may be a :class:`ScheduleSpec` instead of a
number (:class:`psflow.optim.OptimizerSpec`). A ps task then computes
the learning rate of each update from the global_step read *before* that
update's increment, TF's order (``apply_gradients(global_step=gs)`` runs the
update ops, then ``assign_add(gs, 1)``): the first update uses step 0. In sync
mode the schedule advances once per aggregated step. Which step a ps task
uses: see :mod:`psflow.ps.step_clock` (ps task 0 holds global_step; the others use
the newest step the clients report).

Notation: ``t`` is the global step, ``lr`` the schedule's ``learning_rate``.
Each schedule takes TF's argument names, with TF's defaults; a name with no
default in TF's signature is required (``learning_rate`` is filled in from
``--learning-rate`` when the schedule comes from ``--learning-rate-schedule``):

========================  ========================================================================
exponential_decay         learning_rate, decay_steps, decay_rate, staircase=False
                          ``lr * decay_rate ** p``, ``p = t / decay_steps`` (floored if staircase)
natural_exp_decay         learning_rate, decay_steps, decay_rate, staircase=False
                          ``lr * exp(-decay_rate) ** p``, ``p`` as above
inverse_time_decay        learning_rate, decay_steps, decay_rate, staircase=False
                          ``lr / (1 + decay_rate * p)``, ``p`` as above
piecewise_constant        boundaries (increasing integers), values (one more than boundaries)
                          ``values[0]`` while ``t <= boundaries[0]``, ``values[i]`` while
                          ``t <= boundaries[i]``, then ``values[-1]``
polynomial_decay          learning_rate, decay_steps, end_learning_rate=0.0001, power=1.0, cycle=False
                          ``(lr - end) * (1 - t / d) ** power + end``; ``t`` capped at
                          ``d = decay_steps``, or with cycle ``d = decay_steps * ceil(t / decay_steps)``
                          (``decay_steps`` at ``t = 0``)
cosine_decay              learning_rate, decay_steps, alpha=0.0
                          ``lr * ((1 - alpha) * 0.5 * (1 + cos(pi * min(t, decay_steps) / decay_steps)) + alpha)``
cosine_decay_restarts     learning_rate, first_decay_steps, t_mul=2.0, m_mul=1.0, alpha=0.0
                          SGDR: a cosine decay over ``first_decay_steps``, then restarts, each period
                          ``t_mul`` times longer and its peak ``m_mul`` times the previous one
constant                  learning_rate (psflow's own: to put a warm-up in front of a constant rate)
========================  ========================================================================

Every step count (``decay_steps``, ``first_decay_steps``, ``boundaries``) is an
integer (``decay_steps`` >= 1), every other number finite, ``t_mul`` > 0. psflow's own
ranges, where TF computes a NaN or infinite rate: ``exponential_decay``'s ``decay_rate`` > 0,
``inverse_time_decay``'s ``decay_rate`` >= 0, ``polynomial_decay``'s ``power`` >= 0.

Linear warm-up (any schedule; psflow's own, TF1 has none): with
``warmup_steps = W > 0`` the learning rate rises linearly from
``warmup_learning_rate`` (0.0) at step 0 to the schedule's value at step ``W``:
``w0 + (t / W) * (schedule(W) - w0)`` while ``t < W``; from ``W`` on it is the
schedule's own value at ``t`` (the schedule is not shifted: its decay steps
count global steps from 0, as in Inception's and BERT's trainers).

Rounding: float32, as TF computes these in a graph (``tf.compat.v1`` with a
session). Numbers are cast to float32 first and every operation rounds to
float32, in TF's order. Grappler (TF's graph optimizer) rewrites a division by
a constant into a multiplication by the float32 reciprocal, so ``t /
decay_steps`` is ``t * (1 / decay_steps)`` here too (a division by a value that
depends on ``t``, as ``cycle``'s, stays a division). ``pow``, ``exp``, ``log``
and ``cos`` are taken in float64 and rounded once to float32: the correctly
rounded float32 result, which TF's float32 functions give in nearly all cases.
On TensorFlow 2.21's values (``tests/data/golden/trainer_tf.json``, 135 values)
all but one agree bit for bit; ``cosine_decay`` at step 250 is 1 ulp (9e-8
relative) away, because TF's float32 cosine is 1 ulp off there. Evaluated in
float64 instead, 3 schedules would be off by more than 1e-6 (up to 6e-5,
``cosine_decay_restarts`` at step 99, where ``1 + cos`` cancels). Where ``1 +
cos`` nearly cancels (a cosine decay with ``alpha = 0`` near its end), a 1-ulp
difference in the cosine is a large relative difference of a tiny learning rate.

JSON form (in optimizer specs, layouts and checkpoint manifests): an object
``{"schedule": NAME, ...every parameter...}``, the warm-up keys only when
``warmup_steps > 0``, e.g. ``{"schedule": "exponential_decay", "learning_rate":
0.1, "decay_steps": 100, "decay_rate": 0.96, "staircase": true}``. Flag form
(:func:`parse_schedule`): ``NAME:KEY=VALUE,...``, lists in brackets:
``piecewise_constant:boundaries=[100,1000],values=[0.1,0.01,0.001]``.
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

__all__ = [
    "SCHEDULE_NAMES",
    "ScheduleError",
    "ScheduleSpec",
    "parse_flag_value",
    "parse_key_values",
    "parse_schedule",
    "schedule_parameters",
]

ParamValue = float | bool | int | tuple[float, ...] | tuple[int, ...]

_F32 = np.float32
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)
_PI = np.float32(math.pi)  # TF's constant_op.constant(math.pi): float32


class ScheduleError(PsError, ValueError):
    """Unknown schedule name, or a parameter that is unknown, missing, of the wrong type or out of range."""


# ---- parameters ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Param:
    """How one parameter is checked: its kind, TF default (None: required) and range."""

    kind: str  # "number", "bool", "steps" (integer >= minimum), "int_list", "number_list"
    default: ParamValue | None = None
    minimum: int = 0  # "steps" only
    rule: str = ""  # a number's range, as the error message states it
    check: Callable[[float], bool] | None = None


def _positive(x: float) -> bool:
    return x > 0.0


def _non_negative(x: float) -> bool:
    return x >= 0.0


_LR = _Param("number")
_DECAY_STEPS = _Param("steps", minimum=1)
_STAIRCASE = _Param("bool", False)
_PARAMS: Mapping[str, Mapping[str, _Param]] = {
    "exponential_decay": {"learning_rate": _LR, "decay_steps": _DECAY_STEPS,
                          "decay_rate": _Param("number", rule="> 0 (a negative base to a fractional power is NaN, 0 a rate of 0)",
                                               check=_positive), "staircase": _STAIRCASE},
    "natural_exp_decay": {"learning_rate": _LR, "decay_steps": _DECAY_STEPS, "decay_rate": _Param("number"),
                          "staircase": _STAIRCASE},
    "inverse_time_decay": {"learning_rate": _LR, "decay_steps": _DECAY_STEPS,
                           "decay_rate": _Param("number", check=_non_negative,
                                                rule=">= 0 (1 + decay_rate x step would reach 0: an infinite rate)"),
                           "staircase": _STAIRCASE},
    "piecewise_constant": {"boundaries": _Param("int_list"), "values": _Param("number_list")},
    "polynomial_decay": {"learning_rate": _LR, "decay_steps": _DECAY_STEPS, "end_learning_rate": _Param("number", 0.0001),
                         "power": _Param("number", 1.0, check=_non_negative,
                                         rule=">= 0 (0 to a negative power is infinite, at step decay_steps)"),
                         "cycle": _Param("bool", False)},
    "cosine_decay": {"learning_rate": _LR, "decay_steps": _DECAY_STEPS, "alpha": _Param("number", 0.0)},
    "cosine_decay_restarts": {"learning_rate": _LR, "first_decay_steps": _DECAY_STEPS,
                              "t_mul": _Param("number", 2.0, rule="> 0", check=_positive),
                              "m_mul": _Param("number", 1.0), "alpha": _Param("number", 0.0)},
    "constant": {"learning_rate": _LR},
}
_WARMUP: Mapping[str, _Param] = {"warmup_steps": _Param("steps", 0), "warmup_learning_rate": _Param("number", 0.0)}

#: Every schedule name, in the order the module docstring lists them.
SCHEDULE_NAMES: tuple[str, ...] = tuple(_PARAMS)


def _check_value(where: str, param: _Param, value: object) -> ParamValue:
    if param.kind == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise ScheduleError(f"{where} must be true or false, got {value!r}")
        return bool(value)
    if param.kind in ("int_list", "number_list"):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ScheduleError(f"{where} must be a list, got {value!r}")
        inner = _Param("steps", minimum=-(1 << 62)) if param.kind == "int_list" else _Param("number")
        return tuple(_check_number(f"{where}[{i}]", inner, v) for i, v in enumerate(value))
    return _check_number(where, param, value)


def _check_number(where: str, param: _Param, value: object) -> float | int:
    """A "number" (finite, in range; as float) or a "steps" value (an integer >= the minimum; as int)."""
    if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, (bool, np.bool_)):
        raise ScheduleError(f"{where} must be a number, got {value!r}")
    number = float(value)
    if param.kind == "steps":
        if not number.is_integer() or number < param.minimum:
            raise ScheduleError(f"{where} must be an integer >= {param.minimum}, got {value!r}")
        return int(number)
    if not math.isfinite(number):
        raise ScheduleError(f"{where} must be finite, got {value!r}")
    if param.check is not None and not param.check(number):
        raise ScheduleError(f"{where} must be {param.rule}, got {value!r}")
    return number


def _resolve(name: str, given: Mapping[str, object]) -> dict[str, ParamValue]:
    """Checks the parameters of schedule ``name`` and fills in TF's defaults (warm-up keys included)."""
    params = {**_PARAMS[name], **_WARMUP}
    accepted = ", ".join(params)
    for key in given:
        if key not in params:
            raise ScheduleError(f"schedule {name!r}: unknown parameter {key!r}; accepted: {accepted}")
    resolved: dict[str, ParamValue] = {}
    for key, param in params.items():
        if key in given:
            resolved[key] = _check_value(f"schedule {name!r}: {key!r}", param, given[key])
        elif param.default is None:
            raise ScheduleError(f"schedule {name!r}: {key!r} is required (TF has no default); accepted: {accepted}")
        else:
            resolved[key] = param.default
    if name == "piecewise_constant":
        boundaries = cast(tuple[int, ...], resolved["boundaries"])
        values = cast(tuple[float, ...], resolved["values"])
        if len(values) != len(boundaries) + 1:
            raise ScheduleError(f"schedule 'piecewise_constant': 'values' must have one more entry than 'boundaries' "
                                f"({len(boundaries)}), got {len(values)}")
        if any(b >= c for b, c in zip(boundaries, boundaries[1:], strict=False)):
            raise ScheduleError(f"schedule 'piecewise_constant': 'boundaries' must be increasing, got {list(boundaries)}")
    return resolved


def _check_name(name: object) -> str:
    if not isinstance(name, str) or name not in _PARAMS:
        raise ScheduleError(f"unknown learning-rate schedule {name!r}; valid names: {', '.join(SCHEDULE_NAMES)}")
    return name


def schedule_parameters(name: object) -> tuple[str, ...]:
    """Every parameter schedule ``name`` takes (warm-up ones included).

    Raises:
        ScheduleError: an unknown name.
    """
    return (*_PARAMS[_check_name(name)], *_WARMUP)


# ---- the spec -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScheduleSpec:
    """A learning-rate schedule: its name and every parameter; checked on construction.

    Attributes:
        name: one of :data:`SCHEDULE_NAMES`.
        params: TF argument names to values (see the module docstring), plus
            ``warmup_steps`` and ``warmup_learning_rate``. Left-out ones take their
            defaults; stored as a read-only mapping with every parameter, numbers
            as float, step counts as int, lists as tuples.

    Immutable and stateless: :meth:`value` depends on the step alone, so every
    ps task computes the same rate for the same step, and a restored run the
    rates it had.

    Raises:
        ScheduleError: the name is unknown, or a parameter is unknown, missing,
            of the wrong type or out of range (the message names it).
    """

    name: str
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        name = _check_name(self.name)
        given = self.params
        if not isinstance(given, Mapping) or not all(isinstance(key, str) for key in given):
            raise ScheduleError(f"schedule {name!r}: parameters must map str to values, got {given!r}")
        object.__setattr__(self, "params", MappingProxyType(_resolve(name, given)))

    def __reduce__(self) -> tuple[Any, ...]:
        # A mappingproxy cannot be pickled; rebuild the spec from a plain dict.
        return (ScheduleSpec, (self.name, dict(self.params)))

    @property
    def warmup_steps(self) -> int:
        return cast(int, self.params["warmup_steps"])

    def to_json(self) -> dict[str, Any]:
        """``{"schedule": NAME, ...}`` with every parameter (warm-up keys only when ``warmup_steps > 0``);
        :meth:`from_json` reads it back as an equal spec."""
        out: dict[str, Any] = {"schedule": self.name}
        for key, value in self.params.items():
            if key in _WARMUP and not self.warmup_steps:
                continue
            out[key] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> ScheduleSpec:
        """Parses :meth:`to_json`'s form (parameters left out take their defaults).

        Raises:
            ScheduleError: not such an object, no ``"schedule"``, or invalid parameters.
        """
        if not isinstance(data, Mapping):
            raise ScheduleError(f"a learning-rate schedule must be a JSON object, got {data!r}")
        if "schedule" not in data:
            raise ScheduleError(f"learning-rate schedule {dict(data)!r} has no 'schedule' (its name); "
                                f"valid names: {', '.join(SCHEDULE_NAMES)}")
        return cls(_check_name(data["schedule"]), {k: v for k, v in data.items() if k != "schedule"})

    def reaches_zero(self) -> str | None:
        """Why the rate is <= 0 at some step (a float32 decay's underflow far out aside), or None: it never is."""
        p = self.params
        if self.warmup_steps and p["warmup_learning_rate"] <= 0:
            return f"its warm-up starts at 'warmup_learning_rate' {p['warmup_learning_rate']} at step 0"
        if "learning_rate" in p and p["learning_rate"] <= 0:
            return f"'learning_rate' is {p['learning_rate']}"
        ends = {"cosine_decay": [("alpha", "it reaches learning_rate x 'alpha' = {} at step decay_steps")],
                "polynomial_decay": [("end_learning_rate", "it reaches 'end_learning_rate' {} at step decay_steps")],
                "cosine_decay_restarts": [("m_mul", "'m_mul' is {}: every period after the first has rate 0"),
                                          ("alpha", "its periods end at learning_rate x 'alpha' = {} (in float32, "
                                                    "0 itself at some of their last steps)")]}
        for key, reason in ends.get(self.name, []):
            if p[key] <= 0:
                return reason.format(p[key])
        bad = [(i, v) for i, v in enumerate(p["values"]) if v <= 0] if self.name == "piecewise_constant" else []
        return f"'values'[{bad[0][0]}] is {bad[0][1]}" if bad else None

    def value(self, step: int) -> np.float32:
        """The learning rate of an update at global step ``step`` (read before its increment), in float32."""
        warmup = self.warmup_steps
        rule = _RULES[self.name]
        if step >= warmup:
            return rule(self.params, step)
        start = _F32(self.params["warmup_learning_rate"])
        target = rule(self.params, warmup)
        return start + (_F32(step) / _F32(warmup)) * (target - start)


# ---- the rules, in float32 as TF's graph computes them ---------------------------------------------------
def _reciprocal(x: float | np.float32) -> np.float32:
    """``1 / x`` in float32: what Grappler divides by for a division by the constant ``x``."""
    return _ONE / _F32(x)


def _f64(fn: Callable[..., Any], *args: np.float32) -> np.float32:
    """A float32 function as the correctly rounded float64 one, rounded once (inf or nan where TF gives them)."""
    with np.errstate(all="ignore"):
        return _F32(fn(*(np.float64(a) for a in args)))


def _pow(x: np.float32, y: np.float32) -> np.float32:
    return _f64(np.power, x, y)


def _decay_exponent(p: Mapping[str, Any], step: int) -> np.float32:
    exponent = _F32(step) * _reciprocal(p["decay_steps"])
    return np.floor(exponent) if p["staircase"] else exponent


def _exponential(p: Mapping[str, Any], step: int) -> np.float32:
    return _F32(p["learning_rate"]) * _pow(_F32(p["decay_rate"]), _decay_exponent(p, step))


def _natural_exp(p: Mapping[str, Any], step: int) -> np.float32:
    # TF: exponential_decay with decay_rate exp(-decay_rate), computed in float32.
    rate = _f64(np.exp, -_F32(p["decay_rate"]))
    return _F32(p["learning_rate"]) * _pow(rate, _decay_exponent(p, step))


def _inverse_time(p: Mapping[str, Any], step: int) -> np.float32:
    return _F32(p["learning_rate"]) / (_ONE + _F32(p["decay_rate"]) * _decay_exponent(p, step))


def _piecewise(p: Mapping[str, Any], step: int) -> np.float32:
    for boundary, value in zip(p["boundaries"], p["values"], strict=False):
        if step <= boundary:
            return _F32(value)
    return _F32(p["values"][-1])


def _polynomial(p: Mapping[str, Any], step: int) -> np.float32:
    t, decay_steps = _F32(step), _F32(p["decay_steps"])
    if p["cycle"]:
        multiplier = _ONE if t == 0 else np.ceil(t * _reciprocal(p["decay_steps"]))
        fraction = t / (decay_steps * multiplier)
    else:
        fraction = min(t, decay_steps) * _reciprocal(decay_steps)
    lr, end = _F32(p["learning_rate"]), _F32(p["end_learning_rate"])
    return (lr - end) * _pow(_ONE - fraction, _F32(p["power"])) + end


def _cosine(p: Mapping[str, Any], step: int) -> np.float32:
    decay_steps = _F32(p["decay_steps"])
    fraction = min(_F32(step), decay_steps) * _reciprocal(decay_steps)
    cosine = _HALF * (_ONE + _f64(np.cos, _PI * fraction))
    alpha = _F32(p["alpha"])
    return _F32(p["learning_rate"]) * ((_ONE - alpha) * cosine + alpha)


def _cosine_restarts(p: Mapping[str, Any], step: int) -> np.float32:
    fraction = _F32(step) * _reciprocal(p["first_decay_steps"])
    t_mul, m_mul, alpha = _F32(p["t_mul"]), _F32(p["m_mul"]), _F32(p["alpha"])
    if t_mul == _ONE:
        restart = np.floor(fraction)
        fraction = fraction - restart
    else:
        # The period holding ``fraction`` (a geometric series of periods), then the fraction of it done.
        restart = np.floor(_f64(np.log, _ONE - fraction * (_ONE - t_mul)) * _reciprocal(_f64(np.log, t_mul)))
        done = (_ONE - _pow(t_mul, restart)) * _reciprocal(_ONE - t_mul)
        fraction = (fraction - done) / _pow(t_mul, restart)
    cosine = _HALF * _pow(m_mul, restart) * (_ONE + _f64(np.cos, _PI * fraction))
    return _F32(p["learning_rate"]) * ((_ONE - alpha) * cosine + alpha)


def _constant(p: Mapping[str, Any], step: int) -> np.float32:
    return _F32(p["learning_rate"])


_RULES: Mapping[str, Callable[[Mapping[str, Any], int], np.float32]] = {
    "exponential_decay": _exponential,
    "natural_exp_decay": _natural_exp,
    "inverse_time_decay": _inverse_time,
    "piecewise_constant": _piecewise,
    "polynomial_decay": _polynomial,
    "cosine_decay": _cosine,
    "cosine_decay_restarts": _cosine_restarts,
    "constant": _constant,
}


# ---- flags ---------------------------------------------------------------------------------------------
def parse_flag_value(text: str) -> object:
    """A flag's ``VALUE``: ``true``/``false``, an integer, a number, or a bracketed list of them.

    Raises:
        ValueError: none of these (the caller names the key).
    """
    text = text.strip()
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if text.startswith("["):
        if not text.endswith("]"):
            raise ValueError(f"unclosed list {text!r}")
        return [parse_flag_value(item) for item in text[1:-1].split(",") if item.strip()]
    try:
        return int(text)
    except ValueError:
        return float(text)  # raises ValueError for anything else


def parse_key_values(text: str, what: str) -> dict[str, object]:
    """``KEY=VALUE,...`` (commas inside brackets belong to a list) as a dict of :func:`parse_flag_value` values.

    Raises:
        ValueError: an item is not KEY=VALUE or a value does not parse; the
            message names ``what`` and the item.
    """
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    out: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in items)):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"{what}: {item!r} is not KEY=VALUE")
        try:
            out[key.strip()] = parse_flag_value(value)
        except ValueError:
            raise ValueError(f"{what}: {key.strip()!r} must be a number, got {value.strip()!r}") from None
    return out


def parse_schedule(text: str) -> dict[str, Any]:
    """The JSON form of a schedule (``{"schedule": NAME, ...}``) from ``--learning-rate-schedule``.

    ``text`` is ``NAME``, ``NAME:KEY=VALUE,...``
    (``exponential_decay:decay_steps=100,decay_rate=0.96,staircase=true``) or
    the JSON of :meth:`ScheduleSpec.to_json`. The name is checked; the
    parameters are not yet (``learning_rate`` may still be filled in): pass the
    result to :meth:`ScheduleSpec.from_json`.

    Raises:
        ScheduleError: malformed text or an unknown schedule name.
    """
    text = text.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ScheduleError(f"learning-rate schedule {text!r}: bad JSON: {e}") from e
        if not isinstance(data, dict):
            raise ScheduleError(f"learning-rate schedule {text!r}: want a JSON object")
        _check_name(data.get("schedule"))
        return data
    name, _, rest = text.partition(":")
    name = _check_name(name.strip())
    try:
        params = parse_key_values(rest, f"learning-rate schedule {name!r}")
    except ValueError as e:
        raise ScheduleError(str(e)) from None
    return {"schedule": name, **params}
