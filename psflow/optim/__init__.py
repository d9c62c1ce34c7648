"""psflow.optim: what an optimizer is -- its name, its hyperparameters, its learning-rate schedule.

Data, checked when it is made, and nothing else: a model declares a spec per variable
(:class:`~psflow.models.VariableSpec`), the run one from ``--optimizer`` and ``--learning-rate-schedule``,
layouts and checkpoint manifests carry it as JSON, and the ps tasks apply it
(:mod:`psflow.ps.optimizers`: TensorFlow's update formulas). It imports no runtime (no ps, no rpc), so
the models and the ps both stand on it.

Files:

* ``spec.py``: :class:`OptimizerSpec` (name and hyperparameters, TF's names and defaults, every range
  checked), :data:`OPTIMIZER_NAMES`, :class:`OptimizerError`, :func:`parse_optimizer` (the flag's forms).
* ``schedules.py``: :class:`ScheduleSpec` (TF1's ``tf.compat.v1.train`` decays and a linear warm-up, and
  their value at a global step, rounded as TF rounds them), :data:`SCHEDULE_NAMES`, :class:`ScheduleError`,
  :func:`parse_schedule`.

Guarantees: a spec that exists is valid (an unknown name, hyperparameter or parameter, a missing required
one, a wrong type or a value out of range is refused on construction, naming it); specs are frozen and
equal to their JSON round trip; a schedule's value at a step is the same on every task and every run.
"""

from psflow.optim.schedules import SCHEDULE_NAMES, ScheduleError, ScheduleSpec, parse_schedule
from psflow.optim.spec import OPTIMIZER_NAMES, Hyperparameter, Hyperparameters, OptimizerError, OptimizerSpec, parse_optimizer

__all__ = [
    "OPTIMIZER_NAMES",
    "SCHEDULE_NAMES",
    "Hyperparameter",
    "Hyperparameters",
    "OptimizerError",
    "OptimizerSpec",
    "ScheduleError",
    "ScheduleSpec",
    "parse_optimizer",
    "parse_schedule",
]
