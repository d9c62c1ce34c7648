"""What ``psflow k8s render`` renders with: :class:`RenderConfig` (its flags, every name checked against
Kubernetes' rules on construction), the cluster file it reads (:func:`load_cluster`), and the names the
manifests and ``psflow server`` share (:data:`TASK_INDEX_ENV`, read back by :func:`task_index_from_env`).

A bad input raises :class:`RenderError` (a :class:`~psflow.errors.ConfigError`) naming the flag or file.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from psflow.cluster import ClusterError, ClusterSpec
from psflow.train.config import ConfigError

__all__ = ["DEFAULT_NAME", "TASK_INDEX_ENV", "RenderConfig", "RenderError", "Resources", "load_cluster", "task_index_from_env",
           "has_flag", "k8s_name"]

#: This task's index, the default of ``psflow server --task`` (the manifests set it from the pod's index).
TASK_INDEX_ENV = "PSFLOW_TASK_INDEX"
#: ``--name`` when none is given: the prefix of every object.
DEFAULT_NAME = "psflow"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
STS_INDEX_LABEL = "apps.kubernetes.io/pod-index"
JOB_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
JOBS = ("chief", "worker", "ps")  # what psflow server runs; TFJob's replica types Chief, Worker, PS
# A replicated ps shard's backups (psflow.cluster.replicas.BACKUP_JOB, --ps-replicas): a StatefulSet like the ps
# tasks'; Kubernetes names cannot hold '_', so its objects and hostnames say ps-backup.
PS_BACKUP = "ps_backup"
SERVES = ("ps", PS_BACKUP)  # the jobs whose tasks serve variables until the run is over
# TensorFlow's evaluator task (psflow.launch.evaluator.EVALUATOR_JOB, not imported: it pulls in the training code).
EVALUATOR = "evaluator"
TFJOB_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", EVALUATOR: "Evaluator"}
UID = 10001  # the Dockerfile's user
CHECKPOINTS, STATE, DATA = "/var/lib/psflow/checkpoints", "/var/lib/psflow/state", "/data"
_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?\Z")  # RFC 1035 label: Service names
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")  # RFC 1123 label
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")  # RFC 1123 subdomain
_QUANTITY = re.compile(r"\d+(\.\d+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?\Z")
# A StatefulSet's pods carry controller-revision-hash=<name>-<10 chars>, a label value of at most 63.
MAX_STATEFULSET_NAME = 52


class RenderError(ConfigError):
    """An input of ``psflow k8s render`` is missing or invalid (names the flag or file and why)."""


def task_index_from_env(value: str | None) -> int | None:
    """``PSFLOW_TASK_INDEX`` as a task index (None: unset).

    Raises:
        ConfigError: it is set but not a decimal integer (an empty value: the pod-index label is missing).
    """
    if value is None:
        return None
    if value.isascii() and value.isdecimal():
        return int(value)
    hint = (f" (in Kubernetes: the pod has no {STS_INDEX_LABEL} label, which needs Kubernetes >= 1.28)"
            if not value.strip() else "")
    raise ConfigError(f"{TASK_INDEX_ENV}={value!r}: want this task's index, an integer >= 0{hint}")


@dataclass(frozen=True)
class Resources:
    """A container's requests: ``cpu`` and ``memory`` quantities; memory is also its limit (no CPU limit: no throttling)."""

    cpu: str
    memory: str


@dataclass(frozen=True)
class RenderConfig:
    """What the manifests are rendered with (the flags of ``psflow k8s render``).

    Raises:
        RenderError: on construction, for a name Kubernetes refuses, a bad port or quantity (names the flag),
            or ``evaluator`` without ``--eval`` in ``train_args``.
    """

    name: str
    image: str
    namespace: str = "default"
    port: int = 2222  # every task's gRPC port (TensorFlow's and TFJob's default)
    train_args: tuple[str, ...] = ()  # psflow server flags, after the rendered ones (so they win)
    data_pvc: str | None = None  # an existing claim with the training data, read-only at /data in workers
    status_port: int = 8080  # the chief's status page, on 127.0.0.1 in its pod
    cluster_domain: str = "cluster.local"
    storage_class: str | None = None  # None: the cluster's default (the checkpoint claim needs ReadWriteMany)
    checkpoint_size: str = "10Gi"
    state_size: str = "1Gi"
    ps_resources: Resources = field(default_factory=lambda: Resources("1", "2Gi"))
    worker_resources: Resources = field(default_factory=lambda: Resources("2", "4Gi"))
    evaluator: bool = False  # TensorFlow's evaluator task too; needs --eval in train_args
    evaluator_resources: Resources | None = None  # None: worker_resources
    jobset: bool = False  # write jobset.yaml instead of cluster.yaml and tfjob.yaml
    ps_replicas: int = 0  # backups of each ps shard (job ps_backup, num_ps * ps_replicas tasks); no TFJob then

    def __post_init__(self) -> None:
        _check(_DNS_LABEL, self.name, "--name", "an RFC 1035 label: lowercase letters, digits and '-', "
               "starting with a letter and ending with a letter or digit")
        _check(_NAMESPACE, self.namespace, "--namespace", "an RFC 1123 label: lowercase letters, digits and '-', "
               "starting and ending with a letter or digit, at most 63 characters")
        for flag, value in (("--data-pvc", self.data_pvc), ("--storage-class", self.storage_class),
                            ("--cluster-domain", self.cluster_domain)):
            if value is not None:
                _check(_SUBDOMAIN, value, flag, "an RFC 1123 subdomain: lowercase letters, digits, '-' and '.'",
                       max_len=253)
        if not self.image.strip() or any(c.isspace() for c in self.image):
            raise RenderError(f"--image {self.image!r}: want an image reference such as registry.example.com/psflow:0.1.0")
        for flag, port in (("--port", self.port), ("--status-port", self.status_port)):
            if not 1 <= port <= 65535:
                raise RenderError(f"{flag} {port}: want a port in 1-65535")
        if self.port == self.status_port:
            raise RenderError(f"--status-port {self.status_port}: the same as --port; the status page needs its own")
        for flag, value in (("--checkpoint-size", self.checkpoint_size), ("--state-size", self.state_size),
                            ("--ps-cpu", self.ps_resources.cpu), ("--ps-memory", self.ps_resources.memory),
                            ("--worker-cpu", self.worker_resources.cpu),
                            ("--worker-memory", self.worker_resources.memory),
                            ("--evaluator-cpu", self.resources(EVALUATOR).cpu),
                            ("--evaluator-memory", self.resources(EVALUATOR).memory)):
            if not _QUANTITY.match(value):
                raise RenderError(f"{flag} {value!r}: want a Kubernetes quantity such as 500m, 2, 512Mi or 4Gi")
        if isinstance(self.ps_replicas, bool) or not isinstance(self.ps_replicas, int) or self.ps_replicas < 0:
            raise RenderError(f"--ps-replicas {self.ps_replicas!r}: want a whole number >= 0 (backups of each ps shard)")
        if self.evaluator and not has_flag(self.train_args, "--eval"):
            raise RenderError("--evaluator: the training arguments after -- have no --eval, the data it evaluates "
                              "each checkpoint on")

    @property
    def secret(self) -> str:
        """The Secret holding the cluster token (key ``token``)."""
        return f"{self.name}-token"

    def resources(self, job: str) -> Resources:
        """The requests of a ``job`` task's container (the evaluator's default to a worker's)."""
        if job in SERVES:
            return self.ps_resources
        return (self.evaluator_resources or self.worker_resources) if job == EVALUATOR else self.worker_resources


def k8s_name(job: str) -> str:
    """A job's name in Kubernetes objects and hostnames (``ps_backup`` -> ``ps-backup``: no '_' there)."""
    return job.replace("_", "-")


def has_flag(args: Sequence[str], flag: str) -> bool:
    """Whether ``args`` give ``flag``: ``--flag VALUE`` or ``--flag=VALUE`` (``psflow k8s render`` has checked them
    with ``psflow server``'s parser, which matches flags whole: :class:`~psflow.cli.parser.CommandParser`)."""
    return any(arg.partition("=")[0] == flag for arg in args if arg.startswith("--"))


def _check(pattern: re.Pattern[str], value: str, flag: str, rule: str, *, max_len: int = 63) -> None:
    if len(value) > max_len or not pattern.match(value):
        raise RenderError(f"{flag} {value!r}: not a valid Kubernetes name; want {rule}")


def load_cluster(path: str) -> ClusterSpec:
    """Reads a cluster JSON file (as ``psflow server --cluster`` does).

    Raises:
        RenderError: the file cannot be read or is not a cluster (names the file).
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise RenderError(f"--cluster {path}: cannot read it ({e.strerror or e})") from None
    try:
        return ClusterSpec.from_json(text)
    except ClusterError as e:
        raise RenderError(f"--cluster {path}: {e}") from None
