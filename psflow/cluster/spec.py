"""Cluster description: jobs, tasks and their addresses.

A cluster is a set of *jobs* (``ps``, ``worker``, optionally ``chief``), each a
set of *tasks* identified by a non-negative index and reachable at a
``host:port`` address. :class:`ClusterSpec` holds that mapping, validated and
immutable; :class:`TaskId` names one task (``/job:ps/task:0``).

Both task forms TensorFlow accepts are supported: a dense list (task ``i`` is
the ``i``-th address) and a sparse ``{index: address}`` mapping. Index keys may
be ints or numeric strings, as JSON object keys always are.

Example:
    >>> spec = ClusterSpec({"ps": ["ps0:2222", "ps1:2222"],
    ...                     "worker": {0: "w0:2222", 2: "w2:2222"}})
    >>> spec.jobs
    ('ps', 'worker')
    >>> spec.task_address("worker", 2)
    'w2:2222'
    >>> str(spec.chief())
    '/job:worker/task:0'
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from psflow.errors import PsflowError

__all__ = [
    "ClusterError",
    "ClusterMapping",
    "ClusterSpec",
    "JobTasks",
    "TaskId",
    "UnknownJobError",
    "UnknownTaskError",
]

# TensorFlow's rule for job names (device_spec / server_lib).
_JOB_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")
_HOSTNAME_RE = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.\-]*[A-Za-z0-9_])?\Z")
_FULL_TASK_RE = re.compile(r"/job:(?P<job>[^/]+)(/replica:(?P<replica>\d+))?/task:(?P<task>\d+)\Z")
_SHORT_TASK_RE = re.compile(r"(?P<job>[^:/]+):(?P<task>\d+)\Z")
_MAX_PORT = 65535

#: The tasks of one job: dense ``["host:port", ...]`` or sparse
#: ``{index: "host:port"}`` (int or decimal-string keys, as JSON gives).
JobTasks = Sequence[str] | Mapping[int, str] | Mapping[str, str] | Mapping[int | str, str]

#: A cluster in plain form: ``{job: JobTasks}``.
ClusterMapping = Mapping[str, JobTasks]


class ClusterError(PsflowError, ValueError):
    """A cluster description is malformed or does not contain what was asked."""


class UnknownJobError(ClusterError):
    """A job name is not in the cluster."""


class UnknownTaskError(ClusterError):
    """A task index is not in its job."""


def _check_job_name(job: object) -> str:
    if not isinstance(job, str) or not _JOB_NAME_RE.match(job):
        raise ClusterError(f"invalid job name {job!r}: expected a letter followed by letters, digits or '_'")
    return job


def _check_index(value: object, what: str) -> int:
    """Returns ``value`` as a task index; ints and decimal strings only."""
    if isinstance(value, bool):
        raise ClusterError(f"{what}: task index must be an integer, got {value!r}")
    if isinstance(value, int):
        index = value
    elif isinstance(value, str) and value.isascii() and value.isdecimal():
        index = int(value)
    else:
        raise ClusterError(f"{what}: task index must be an integer, got {value!r}")
    if index < 0:
        raise ClusterError(f"{what}: task index must be >= 0, got {index}")
    return index


@dataclass(frozen=True, order=True)
class TaskId:
    """One task of a cluster: a job name and a task index.

    Instances order by ``(job, index)`` and compare by value. ``str(task)`` is
    the TensorFlow device name, ``/job:ps/task:0``.

    Attributes:
        job: Job name, e.g. ``"ps"``; a letter then letters, digits or ``_``.
        index: Task index within the job, ``>= 0``.

    Raises:
        ClusterError: On construction with an invalid job name or index.
    """

    job: str
    index: int

    def __post_init__(self) -> None:
        _check_job_name(self.job)
        if isinstance(self.index, bool) or not isinstance(self.index, int):
            raise ClusterError(f"task index of job {self.job!r} must be an int, got {self.index!r}")
        if self.index < 0:
            raise ClusterError(f"task index of job {self.job!r} must be >= 0, got {self.index}")

    @property
    def name(self) -> str:
        """The TensorFlow task name, ``/job:<job>/task:<index>``."""
        return f"/job:{self.job}/task:{self.index}"

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, text: str) -> TaskId:
        """Parses a task name.

        Accepts ``/job:ps/task:0``, ``/job:ps/replica:0/task:0`` and the short
        form ``ps:0``. A replica other than 0 is refused: psflow addresses a
        task by job and index only.

        Args:
            text: The task name.

        Returns:
            The parsed task id.

        Raises:
            ClusterError: If ``text`` is not one of the forms above.
        """
        if not isinstance(text, str):
            raise ClusterError(f"task name must be a string, got {text!r}")
        match = _FULL_TASK_RE.match(text) or _SHORT_TASK_RE.match(text)
        if match is None:
            raise ClusterError(
                f"cannot parse task name {text!r}: expected '/job:NAME/task:INDEX', "
                "'/job:NAME/replica:0/task:INDEX' or 'NAME:INDEX'"
            )
        replica = match.groupdict().get("replica")
        if replica is not None and int(replica) != 0:
            raise ClusterError(
                f"cannot parse task name {text!r}: replica {int(replica)} is not "
                "supported, tasks are addressed by job and index only"
            )
        return cls(match.group("job"), int(match.group("task")))


def _check_address(address: object, task: TaskId) -> str:
    """Validates ``host:port`` (``[v6addr]:port`` for IPv6) for ``task``."""
    if not isinstance(address, str):
        raise ClusterError(f"{task}: address must be a 'host:port' string, got {address!r}")
    if "://" in address:
        raise ClusterError(f"{task}: address {address!r} has a scheme; write 'host:port' only")
    if address.startswith("["):
        host, sep, port = address[1:].partition("]:")
        if not sep:
            raise ClusterError(f"{task}: address {address!r} is not '[ipv6]:port' (missing ']:')")
        try:
            ipaddress.IPv6Address(host)
        except ValueError as e:
            raise ClusterError(f"{task}: address {address!r} has an invalid IPv6 host {host!r}") from e
    else:
        host, sep, port = address.rpartition(":")
        if not sep:
            raise ClusterError(f"{task}: address {address!r} is not 'host:port'")
        if ":" in host:
            raise ClusterError(f"{task}: address {address!r}: write IPv6 hosts in brackets, e.g. '[::1]:2222'")
        if not _HOSTNAME_RE.match(host):
            raise ClusterError(f"{task}: address {address!r} has an invalid host {host!r}")
    if not port.isdecimal() or not port.isascii() or int(port) > _MAX_PORT:
        raise ClusterError(f"{task}: address {address!r} has an invalid port {port!r} (expected an integer 0-{_MAX_PORT})")
    return address


def _describe_indices(indices: Sequence[int]) -> str:
    """``"tasks 0-1"`` for a dense job, ``"tasks 0, 2, 5"`` for a sparse one."""
    if len(indices) == 1:
        return f"task {indices[0]}"
    if list(indices) == list(range(len(indices))):
        return f"tasks 0-{len(indices) - 1}"
    return "tasks " + ", ".join(str(i) for i in indices)


def _normalize_job(job: str, tasks: JobTasks) -> dict[int, str]:
    if isinstance(tasks, Mapping):
        items = [(_check_index(key, f"job {job!r}"), address) for key, address in tasks.items()]
    elif isinstance(tasks, Sequence) and not isinstance(tasks, (str, bytes)):
        items = list(enumerate(tasks))
    else:
        raise ClusterError(
            f"job {job!r}: tasks must be a list of 'host:port' or a mapping {{index: 'host:port'}}, got {type(tasks).__name__}"
        )
    if not items:
        raise ClusterError(f"job {job!r} has no tasks; every job needs at least one task")
    result: dict[int, str] = {}
    for index, address in items:
        if index in result:
            # Possible only with keys such as 1 and "1" in one mapping.
            raise ClusterError(f"job {job!r}: task index {index} is given twice")
        result[index] = _check_address(address, TaskId(job, index))
    return dict(sorted(result.items()))


class ClusterSpec:
    """An immutable, validated map from job names to task addresses.

    Equality and hashing are by content: a dense list and a sparse mapping
    with indices ``0..n-1`` describe the same cluster and compare equal.

    Guarantees checked on construction:

    * job names are TensorFlow job names, every job has at least one task;
    * indices are non-negative ints (numeric strings accepted as keys);
    * addresses are ``host:port`` or ``[ipv6]:port`` with a port in 0-65535;
    * no address is used by two tasks.

    Args:
        cluster: ``{job: ["host:port", ...]}`` (dense) or
            ``{job: {index: "host:port"}}`` (sparse), or another
            :class:`ClusterSpec`.

    Raises:
        ClusterError: If any of the checks above fails; the message names the
            job, task and offending value.
    """

    __slots__ = ("_hash", "_jobs")

    def __init__(
        self,
        cluster: ClusterSpec | ClusterMapping,
    ) -> None:
        if isinstance(cluster, ClusterSpec):
            cluster = cluster.as_dict()
        if not isinstance(cluster, Mapping):
            raise ClusterError(f"cluster must be a mapping {{job: tasks}}, got {type(cluster).__name__}")
        jobs: dict[str, MappingProxyType[int, str]] = {}
        owner: dict[str, TaskId] = {}
        for job in sorted(cluster, key=str):
            tasks = _normalize_job(_check_job_name(job), cluster[job])
            for index, address in tasks.items():
                task = TaskId(job, index)
                if address in owner:
                    raise ClusterError(f"address {address!r} is used by both {owner[address]} and {task}")
                owner[address] = task
            jobs[job] = MappingProxyType(tasks)
        self._jobs: Mapping[str, Mapping[int, str]] = MappingProxyType(jobs)
        self._hash = hash(tuple((j, tuple(t.items())) for j, t in jobs.items()))

    # -- construction / serialization -------------------------------------

    @classmethod
    def from_json(cls, text: str) -> ClusterSpec:
        """Builds a spec from JSON text such as ``to_json()`` or TF_CONFIG's
        ``"cluster"`` value.

        Raises:
            ClusterError: If ``text`` is not JSON or does not describe a valid
                cluster.
        """
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ClusterError(f"cluster spec is not valid JSON: {e}") from e
        if not isinstance(data, dict):
            raise ClusterError(f"cluster spec JSON must be an object, got {type(data).__name__}")
        return cls(data)

    def to_json(self) -> str:
        """Returns the spec as compact JSON with sorted keys (see :meth:`as_dict`)."""
        return json.dumps(
            {
                job: tasks if isinstance(tasks, list) else {str(i): a for i, a in tasks.items()}
                for job, tasks in self.as_dict().items()
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    def as_dict(self) -> dict[str, list[str] | dict[int, str]]:
        """Returns a fresh plain dict: a list for dense jobs, a dict for sparse.

        A job is dense when its indices are exactly ``0..n-1`` (as in
        TensorFlow's ``ClusterSpec.as_dict``).
        """
        return {job: list(tasks.values()) if self._is_dense(job) else dict(tasks) for job, tasks in self._jobs.items()}

    # -- queries -----------------------------------------------------------

    @property
    def jobs(self) -> tuple[str, ...]:
        """Job names, sorted."""
        return tuple(self._jobs)

    @property
    def num_ps(self) -> int:
        """Number of tasks in the ``ps`` job; 0 if the cluster has none."""
        return len(self._jobs.get("ps", ()))

    def num_tasks(self, job: str) -> int:
        """Number of tasks in ``job``.

        Raises:
            UnknownJobError: If ``job`` is not in the cluster.
        """
        return len(self._tasks_of(job))

    def task_indices(self, job: str) -> tuple[int, ...]:
        """Task indices of ``job``, ascending.

        Raises:
            UnknownJobError: If ``job`` is not in the cluster.
        """
        return tuple(self._tasks_of(job))

    def task_address(self, job: str, index: int) -> str:
        """Address (``host:port``) of task ``index`` of ``job``.

        Raises:
            UnknownJobError: If ``job`` is not in the cluster.
            UnknownTaskError: If the job has no task ``index``, e.g.
                ``no task 3 in job 'ps' (tasks 0-1)``.
        """
        tasks = self._tasks_of(job)
        if isinstance(index, bool) or not isinstance(index, int) or index not in tasks:
            raise UnknownTaskError(f"no task {index!r} in job {job!r} ({_describe_indices(list(tasks))})")
        return tasks[index]

    def job_tasks(self, job: str) -> tuple[str, ...]:
        """Addresses of a dense job's tasks, in index order.

        Unlike TensorFlow, which pads sparse jobs with ``None``, a sparse job
        is refused: use :meth:`task_indices` and :meth:`task_address`.

        Raises:
            UnknownJobError: If ``job`` is not in the cluster.
            ClusterError: If the job's indices are not ``0..n-1``.
        """
        tasks = self._tasks_of(job)
        if not self._is_dense(job):
            raise ClusterError(f"job {job!r} is sparse ({_describe_indices(list(tasks))}); use task_indices() and task_address()")
        return tuple(tasks.values())

    def tasks(self) -> tuple[TaskId, ...]:
        """Every task of the cluster, ordered by job then index."""
        return tuple(TaskId(job, i) for job, tasks in self._jobs.items() for i in tasks)

    def chief(self) -> TaskId:
        """The chief task.

        Task 0 of the ``chief`` job if there is one (TF2 convention), else the
        lowest-indexed ``worker`` task (TF1 convention: worker 0).

        Raises:
            UnknownJobError: If the cluster has neither job.
        """
        for job in ("chief", "worker"):
            if job in self._jobs:
                return TaskId(job, next(iter(self._jobs[job])))
        raise UnknownJobError(f"cluster has no 'chief' or 'worker' job (jobs: {self._job_list()})")

    def __contains__(self, task: object) -> bool:
        return isinstance(task, TaskId) and task.job in self._jobs and task.index in self._jobs[task.job]

    def __iter__(self) -> Iterator[TaskId]:
        return iter(self.tasks())

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ClusterSpec):
            return NotImplemented
        return self._jobs == other._jobs

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"ClusterSpec({self.as_dict()!r})"

    # -- helpers -----------------------------------------------------------

    def _tasks_of(self, job: str) -> Mapping[int, str]:
        try:
            return self._jobs[job]
        except (KeyError, TypeError):
            raise UnknownJobError(f"no job {job!r} in cluster (jobs: {self._job_list()})") from None

    def _job_list(self) -> str:
        return ", ".join(self._jobs) or "none"

    def _is_dense(self, job: str) -> bool:
        tasks = self._jobs[job]
        return max(tasks) == len(tasks) - 1
