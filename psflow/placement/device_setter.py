"""``replica_device_setter``: put each variable (or partition) on a ps task.

As in TensorFlow's between-graph replication, every worker runs the same
model code and places the same variables with the same strategy, so every
worker computes the same layout without talking to the others. A
:class:`DeviceSetter` decides, per variable, in declaration order:

1. an explicit device (``"/job:ps/task:1"``) wins: the variable and all its
   partitions go to that task, and the strategy is not consulted (so pinning
   one variable does not shift where the others go);
2. otherwise the partitioner, if any, gives the number of partitions along
   axis 0, rows are split as TensorFlow splits them, and the strategy picks a
   task for each partition (``w/part_0``, ``w/part_1``, ...) in order;
3. without a partitioner the strategy picks one task for the variable.

A dynamic table (``VariableDef.dynamic``) is the exception: it gets one
partition on every ps task (or one on its pinned task), its ids routed by
:func:`psflow.ps.dynamic.owner_of`, and the strategy is never consulted.

Example:
    >>> from psflow.placement.api import VariableDef
    >>> setter = replica_device_setter(
    ...     cluster={"ps": ["ps0:2222", "ps1:2222"],
    ...              "worker": ["worker0:2222", "worker1:2222"]})
    >>> def task_of(placement):
    ...     return [p.task for p in placement.partitions]
    >>> task_of(setter.place(VariableDef("v1", (10,))))  # assigned to /job:ps/task:0
    [0]
    >>> task_of(setter.place(VariableDef("v2", (10,))))  # assigned to /job:ps/task:1
    [1]
    >>> task_of(setter.place(VariableDef("v3", (10,))))  # assigned to /job:ps/task:0
    [0]
    >>> task_of(setter.place(VariableDef("v4", (10,)), device="/job:ps/task:0"))
    [0]
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

from psflow.cluster.spec import ClusterError, ClusterMapping, ClusterSpec, TaskId
from psflow.placement.api import Partitioner, PlacementError, PlacementStrategy, VariableDef, VariableLike
from psflow.placement.assignment import Partition, VariablePlacement, split_rows
from psflow.placement.strategies import RoundRobinStrategy

__all__ = ["DeviceSetter", "replica_device_setter"]


def _parse_device(spec: str) -> tuple[str | None, int | None]:
    """Returns ``(job, task)`` of a device string; either may be absent.

    Accepts ``/job:ps``, ``/job:ps/task:1``, ``/job:ps/replica:0/task:1``,
    ``/task:1``, ``ps:1``, optionally followed by ``/device:CPU:0`` (which
    is ignored: parameters live in ps memory).
    """
    if not isinstance(spec, str):
        raise PlacementError(f"device must be a string, got {spec!r}")
    if not spec.startswith("/"):
        try:
            task = TaskId.parse(spec)
        except ClusterError as e:
            raise PlacementError(f"cannot parse device {spec!r}: {e}") from e
        return task.job, task.index
    job: str | None = None
    index: int | None = None
    for component in spec[1:].split("/"):
        key, _, value = component.partition(":")
        if key == "job" and value:
            job = value
        elif key == "task" and value.isascii() and value.isdecimal():
            index = int(value)
        elif (key == "replica" and value == "0") or (key.lower() == "device" and value.upper().startswith("CPU")):
            continue
        else:
            raise PlacementError(
                f"cannot parse device {spec!r}: unexpected component {component!r} (expected e.g. '/job:ps/task:1')"
            )
    return job, index


def _check_num_ps_tasks(num_ps_tasks: object, ps_job: str) -> int:
    if isinstance(num_ps_tasks, bool) or not isinstance(num_ps_tasks, int):
        raise PlacementError(f"number of ps tasks must be an int, got {num_ps_tasks!r}")
    if num_ps_tasks < 1:
        raise PlacementError(
            f"no ps tasks: psflow keeps variables on ps job {ps_job!r}, which "
            f"needs at least one task (got {num_ps_tasks}); pass ps_tasks >= 1 "
            f"or a cluster with a {ps_job!r} job"
        )
    return num_ps_tasks


def _describe_tasks(num_tasks: int) -> str:
    return "task 0" if num_tasks == 1 else f"tasks 0-{num_tasks - 1}"


class DeviceSetter:
    """Places variables on ps tasks; build one with :func:`replica_device_setter`.

    Stateful (the strategy remembers earlier calls) and not thread-safe: use
    one fresh setter per model definition, declaring variables in the same
    order on every client.

    Args:
        num_ps_tasks: Number of ps tasks, ``>= 1``.
        ps_job: Name of the ps job.
        worker_device: Device of the worker's own computation (kept for
            callers; variables never go there).
        strategy: Picks a task per variable or partition.

    Raises:
        PlacementError: If ``num_ps_tasks < 1`` or ``strategy`` is not callable.
    """

    def __init__(
        self,
        num_ps_tasks: int,
        *,
        ps_job: str = "ps",
        worker_device: str = "/job:worker",
        strategy: PlacementStrategy,
    ) -> None:
        _check_num_ps_tasks(num_ps_tasks, ps_job)
        if not callable(strategy):
            raise PlacementError(f"ps_strategy must be callable, got {strategy!r}")
        self._num_ps_tasks = num_ps_tasks
        self._ps_job = ps_job
        self._worker_device = worker_device
        self._strategy = strategy

    @property
    def num_ps_tasks(self) -> int:
        """Number of ps tasks variables are spread over."""
        return self._num_ps_tasks

    @property
    def ps_job(self) -> str:
        """Name of the ps job."""
        return self._ps_job

    @property
    def worker_device(self) -> str:
        """Device string of the worker's computation."""
        return self._worker_device

    def check_device(self, device: str) -> int | None:
        """Validates an explicit device and returns its ps task index.

        Returns:
            The task index, or ``None`` for a device that names the ps job
            but no task (the strategy then decides).

        Raises:
            PlacementError: If the device cannot be parsed, is on another
                job, or names a task that does not exist, e.g.
                ``no task 3 in job 'ps' (tasks 0-1)``.
        """
        job, index = _parse_device(device)
        if job is not None and job != self._ps_job:
            raise PlacementError(f"device {device!r} is not on ps job {self._ps_job!r}: variables live on ps tasks")
        if index is not None and index >= self._num_ps_tasks:
            raise PlacementError(f"no task {index} in job {self._ps_job!r} ({_describe_tasks(self._num_ps_tasks)})")
        return index

    def place(
        self,
        var: VariableDef,
        *,
        partitioner: Partitioner | None = None,
        device: str | None = None,
    ) -> VariablePlacement:
        """Places one variable, advancing the strategy unless ``device`` pins it.

        Args:
            var: The variable.
            partitioner: Gives the partition count along axis 0 (see
                :mod:`psflow.placement.partitioners`); ``None`` keeps the
                variable whole.
            device: Explicit device such as ``"/job:ps/task:1"``.

        Returns:
            The placement; with several partitions, the strategy saw them as
            variables named ``<name>/part_<i>`` with their own shapes.

        Raises:
            PlacementError: If the device is invalid, the partitioner splits an
                axis other than 0 or asks for more partitions than rows, or
                the strategy returns an invalid task; the message names the
                variable.
        """
        what = f"variable {var.name!r}"
        try:
            pinned = None if device is None else self.check_device(device)
        except PlacementError as e:
            raise PlacementError(f"{what}: {e}") from e
        if var.dynamic is not None:
            # A dynamic table is spread by id (owner_of) over every ps task, or lives on the one it is pinned to;
            # the strategy is not consulted, so the other variables' placement is what it would be without it.
            if partitioner is not None:
                raise PlacementError(f"{what}: a dynamic table is spread over the ps tasks by id; it takes no partitioner")
            tasks = [pinned] if pinned is not None else list(range(self._num_ps_tasks))
            return VariablePlacement(var, tuple(Partition(i, task, 0, 0) for i, task in enumerate(tasks)))
        count = 1 if partitioner is None else self._partition_count(var, partitioner)
        rows = var.shape[0] if var.shape else 1
        parts = []
        for i, (start, stop) in enumerate(split_rows(rows, count)):
            if pinned is not None:
                task = pinned
            elif count == 1:
                task = self._choose(var)
            else:
                task = self._choose(_partition_def(var, i, stop - start))
            parts.append(Partition(i, task, start, stop))
        return VariablePlacement(var, tuple(parts))

    def _partition_count(self, var: VariableDef, partitioner: Partitioner) -> int:
        what = f"variable {var.name!r}"
        if not var.shape:
            raise PlacementError(f"{what}: a scalar cannot be partitioned")
        try:
            counts = partitioner(var.shape, var.dtype)
        except PlacementError as e:
            raise PlacementError(f"{what}: {e}") from e
        if (
            not isinstance(counts, Sequence)
            or len(counts) != len(var.shape)
            or any(isinstance(c, bool) or not isinstance(c, int) for c in counts)
            or any(c < 1 for c in counts)
        ):
            raise PlacementError(f"{what}: partitioner returned {counts!r}; expected one int >= 1 per axis of shape {var.shape}")
        if any(c != 1 for c in counts[1:]):
            raise PlacementError(f"{what}: partitioner returned {list(counts)}; psflow partitions along axis 0 only")
        if counts[0] > var.shape[0]:
            raise PlacementError(f"{what}: partitioner asks for {counts[0]} partitions of {var.shape[0]} rows")
        return counts[0]

    def _choose(self, subject: VariableLike) -> int:
        raw = self._strategy(subject)
        try:
            if isinstance(raw, bool):
                raise TypeError
            task = operator.index(raw)
        except TypeError:
            task = -1
        if not 0 <= task < self._num_ps_tasks:
            raise PlacementError(
                f"variable {subject.name!r}: ps_strategy returned {raw!r}; expected a task index in 0-{self._num_ps_tasks - 1}"
            )
        return task

    def __repr__(self) -> str:
        return f"DeviceSetter(num_ps_tasks={self._num_ps_tasks}, ps_job={self._ps_job!r}, strategy={self._strategy!r})"


def _partition_def(var: VariableDef, index: int, rows: int) -> VariableDef:
    return VariableDef(
        f"{var.name}/part_{index}",
        (rows, *var.shape[1:]),
        dtype=var.dtype,
        initializer=var.initializer,
        optimizer=var.optimizer,
        trainable=var.trainable,
    )


def replica_device_setter(
    ps_tasks: int = 0,
    ps_device: str = "/job:ps",
    worker_device: str = "/job:worker",
    *,
    cluster: ClusterSpec | ClusterMapping | None = None,
    ps_strategy: PlacementStrategy | None = None,
) -> DeviceSetter:
    """Returns a :class:`DeviceSetter` spreading variables over the ps tasks.

    As ``tf.compat.v1.train.replica_device_setter``: with ``cluster`` the
    number of ps tasks is the size of its ps job (``ps_tasks`` is ignored);
    the default strategy is round-robin. Unlike TensorFlow, zero ps tasks is
    an error, not "everything on the worker": psflow variables live on a ps.

    Example (``setter.place`` returns each variable's placement)::

        setter = replica_device_setter(
            cluster={"ps": ["ps0:2222", "ps1:2222"],
                     "worker": ["worker0:2222", "worker1:2222"]})
        variables = VariableSet(setter)
        variables.get_variable("v1", (784, 100))  # assigned to /job:ps/task:0
        variables.get_variable("v2", (100,))      # assigned to /job:ps/task:1
        variables.get_variable("v3", (100, 10))   # assigned to /job:ps/task:0

    Args:
        ps_tasks: Number of ps tasks when ``cluster`` is not given.
        ps_device: Device of the ps job; only its ``/job:NAME`` is used.
        worker_device: Device of the worker's computation.
        cluster: The cluster (a :class:`ClusterSpec` or its dict form).
        ps_strategy: Picks a task per variable or partition; default
            ``RoundRobinStrategy(num_ps_tasks)``.

    Returns:
        A fresh setter.

    Raises:
        PlacementError: If there are no ps tasks, the cluster has no ps job
            or a sparse one, ``ps_device`` names no job, or ``ps_strategy`` is
            not callable.
        ClusterError: If ``cluster`` is a dict that is not a valid cluster.
    """
    ps_job, _ = _parse_device(ps_device)
    if ps_job is None:
        raise PlacementError(f"ps_device {ps_device!r} names no job; expected e.g. '/job:ps'")
    if cluster is not None:
        spec = cluster if isinstance(cluster, ClusterSpec) else ClusterSpec(cluster)
        if ps_job not in spec.jobs:
            raise PlacementError(
                f"cluster has no ps job {ps_job!r} (jobs: {', '.join(spec.jobs) or 'none'}); psflow keeps variables on ps tasks"
            )
        indices = spec.task_indices(ps_job)
        if indices != tuple(range(len(indices))):
            raise PlacementError(f"ps job {ps_job!r} has tasks {list(indices)}; ps tasks must be numbered 0..n-1")
        ps_tasks = len(indices)
    ps_tasks = _check_num_ps_tasks(ps_tasks, ps_job)
    return DeviceSetter(
        ps_tasks,
        ps_job=ps_job,
        worker_device=worker_device,
        strategy=RoundRobinStrategy(ps_tasks) if ps_strategy is None else ps_strategy,
    )
