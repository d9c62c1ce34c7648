"""``psflow k8s render``: Kubernetes manifests for a psflow cluster.

The cluster JSON (the file ``psflow server --cluster`` takes) decides how many
tasks each job has; in Kubernetes every task is reached at its own headless
Service, ``<name>-<job>-<index>.<namespace>.svc.<domain>:<port>``, whatever
the file's addresses were. :func:`render_manifests` builds, and
:func:`write_manifests` writes into the output directory:

* ``storage.yaml``: the PersistentVolumeClaim ``<name>-checkpoints``
  (ReadWriteMany: every ps task writes its checkpoint shards there, and any
  worker may hold the chief's duties). Separate, so that deleting the
  cluster keeps the checkpoints.
* ``cluster.yaml``: a headless Service per task (``publishNotReadyAddresses``:
  peers find a task as soon as it has an IP, as TensorFlow's peer discovery
  wants), a StatefulSet for the ``ps`` job (it serves until deleted,
  ``--keep-serving``, as a StatefulSet restarts a pod that exits; a
  ReadWriteOnce claim per pod from ``volumeClaimTemplates`` holds ps task 0's
  ``--state-dir``), and an Indexed Job for ``worker`` and for ``chief``
  (they run to completion; a failed container restarts in place). With
  ``evaluator``, also the Indexed Job ``<name>-evaluator`` of one pod:
  TensorFlow's evaluator task (:mod:`psflow.launch.evaluator`), outside the
  cluster (no Service, no port, no probes; ``TF_CONFIG`` has the cluster,
  without an ``evaluator`` job, and the task ``evaluator:0``); it reads the
  checkpoints, read-only unless the training arguments have ``--summary-dir``.
* ``tfjob.yaml``: the same cluster as one Kubeflow ``TFJob`` (kubeflow.org/v1)
  instead of ``cluster.yaml``: the operator creates the Services and sets
  ``TF_CONFIG`` itself; its addresses end in ``.svc`` (see
  :attr:`Manifests.tfjob_cluster`). ps task 0's state goes on the checkpoint
  claim (``state/``), as a TFJob has no per-pod claims. With ``evaluator``,
  an ``Evaluator`` replica (the operator leaves it out of every ``TF_CONFIG``'s
  cluster) and ``cleanPodPolicy: None``, so that the operator does not stop it
  when the chief finishes, before it has evaluated the final checkpoint.
* ``jobset.yaml`` (``--jobset``, instead of ``cluster.yaml`` and ``tfjob.yaml``): the
  same cluster as one ``JobSet`` (jobset.x-k8s.io/v1alpha2, Kubernetes' SIG Apps API for
  multi-job workloads, on which Kubeflow's Trainer v2 builds; TFJob is deprecated there): a
  replicated job of one Indexed Job per psflow job (``ps``, ``worker``, ``chief``, the evaluator),
  pods reached at their JobSet hostnames ``<name>-<job>-0-<i>.<name>`` (the JobSet's headless
  Service, ``network.enableDNSHostnames``; see :attr:`Manifests.jobset_cluster`), ``TF_CONFIG``
  from the pod's completion index, success when the training jobs (and the evaluator) have
  succeeded (``successPolicy``; the JobSet then deletes the ps Job if its pods still run). The ps
  tasks exit 0 once the run is over (no ``--keep-serving``); ps task 0's state goes on the
  checkpoint claim (``state/``), as in the TFJob.
* ``cluster.json``: the cluster with the Service addresses (with ``--jobset``, the JobSet's pod
  addresses); ``README.md``: how to create the token Secret, apply, watch and clean up.

How a pod knows its task: ``TF_CONFIG`` is in each pod's environment, complete.
Kubernetes puts the pod's index in ``PSFLOW_TASK_INDEX`` (downward API: the
StatefulSet pod's ``apps.kubernetes.io/pod-index`` label, the Indexed Job
pod's ``batch.kubernetes.io/job-completion-index`` annotation) and expands
``$(PSFLOW_TASK_INDEX)`` in ``TF_CONFIG``'s task index; ``psflow server``
takes ``PSFLOW_TASK_INDEX`` as the default of ``--task`` (and refuses an empty
one, naming the label). Kubernetes >= 1.28 (the pod-index labels).

Every task's container runs ``psflow server --bind-host 0.0.0.0`` (it listens
on its pod's addresses at its port, rather than resolving its own Service
name, which DNS may not have yet when the process starts), ``--checkpoint-dir`` on the
claim, ps tasks ``--state-dir`` (and in the StatefulSet ``--keep-serving``), workers
``--status-port`` (the chief serves the
status page on 127.0.0.1 in its pod: ``kubectl port-forward``), then the
training arguments given after ``--``, which therefore win. Kubernetes expands
``$(VAR)`` in a container's args, so every ``$`` of the training arguments is
written ``$$`` (which it turns back into one ``$``): an argument reaches
``psflow server`` as given, and cannot pull the token or another variable of the
pod into its argv. The cluster token
comes from the Secret ``<name>-token`` (key ``token``) as ``PSFLOW_TOKEN``;
nothing here writes a token. Probes are ``tcpSocket`` on the task's port.

Guarantees: the manifests are a function of the inputs (no clock, no
randomness); every name is checked against Kubernetes' rules before anything
is written, and a bad input raises :class:`RenderError` naming the flag or file.
Nothing here reads the environment or talks to a cluster.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from psflow.cluster import ClusterError, ClusterSpec, TaskId
from psflow.train.config import ConfigError

# PyYAML ships no type information (as in psflow.data.schema); one call, typed Any here.
yaml: Any = importlib.import_module("yaml")

__all__ = ["DEFAULT_NAME", "TASK_INDEX_ENV", "Manifests", "RenderConfig", "RenderError", "Resources", "add_k8s_parser", "load_cluster",
           "render_config", "render_manifests", "run_k8s", "task_index_from_env", "write_manifests"]

#: This task's index, the default of ``psflow server --task`` (the manifests set it from the pod's index).
TASK_INDEX_ENV = "PSFLOW_TASK_INDEX"
#: ``--name`` when none is given: the prefix of every object.
DEFAULT_NAME = "psflow"
_JOBSET_API = "jobset.x-k8s.io/v1alpha2"
_STS_INDEX_LABEL = "apps.kubernetes.io/pod-index"
_JOB_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
_JOBS = ("chief", "worker", "ps")  # what psflow server runs; TFJob's replica types Chief, Worker, PS
# TensorFlow's evaluator task (psflow.launch.evaluator.EVALUATOR_JOB, not imported: it pulls in the training code).
_EVALUATOR = "evaluator"
_TFJOB_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", _EVALUATOR: "Evaluator"}
_UID = 10001  # the Dockerfile's user
_CHECKPOINTS, _STATE, _DATA = "/var/lib/psflow/checkpoints", "/var/lib/psflow/state", "/data"
_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?\Z")  # RFC 1035 label: Service names
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")  # RFC 1123 label
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")  # RFC 1123 subdomain
_QUANTITY = re.compile(r"\d+(\.\d+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?\Z")
# A StatefulSet's pods carry controller-revision-hash=<name>-<10 chars>, a label value of at most 63.
_MAX_STATEFULSET_NAME = 52


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
    hint = (f" (in Kubernetes: the pod has no {_STS_INDEX_LABEL} label, which needs Kubernetes >= 1.28)"
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
                            ("--evaluator-cpu", self.resources(_EVALUATOR).cpu),
                            ("--evaluator-memory", self.resources(_EVALUATOR).memory)):
            if not _QUANTITY.match(value):
                raise RenderError(f"{flag} {value!r}: want a Kubernetes quantity such as 500m, 2, 512Mi or 4Gi")
        if self.evaluator and not _has_flag(self.train_args, "--eval"):
            raise RenderError("--evaluator: the training arguments after -- have no --eval, the data it evaluates "
                              "each checkpoint on")

    @property
    def secret(self) -> str:
        """The Secret holding the cluster token (key ``token``)."""
        return f"{self.name}-token"

    def resources(self, job: str) -> Resources:
        """The requests of a ``job`` task's container (the evaluator's default to a worker's)."""
        if job == "ps":
            return self.ps_resources
        return (self.evaluator_resources or self.worker_resources) if job == _EVALUATOR else self.worker_resources


def _has_flag(args: Sequence[str], flag: str) -> bool:
    """Whether ``args`` give ``flag``: ``--flag VALUE``, ``--flag=VALUE`` or an abbreviation of it, as argparse
    reads them (``psflow k8s render`` has checked them with ``psflow server``'s parser, which refuses an
    ambiguous abbreviation)."""
    return any(len(given) > 2 and flag.startswith(given) for given in (arg.partition("=")[0] for arg in args
                                                                        if arg.startswith("--")))


def _check(pattern: re.Pattern[str], value: str, flag: str, rule: str, *, max_len: int = 63) -> None:
    if len(value) > max_len or not pattern.match(value):
        raise RenderError(f"{flag} {value!r}: not a valid Kubernetes name; want {rule}")


@dataclass(frozen=True)
class Manifests:
    """The rendered documents (plain dicts, as YAML has them) and the clusters their pods see.

    Attributes:
        cluster: the cluster of ``cluster.yaml``'s ``TF_CONFIG``: each task at its Service,
            ``<name>-<job>-<i>.<namespace>.svc.<domain>:<port>``.
        tfjob_cluster: the cluster the TFJob operator puts in ``TF_CONFIG``:
            ``<name>-<job>-<i>.<namespace>.svc:<port>``.
        jobset: the JobSet (``--jobset``; else None).
        jobset_cluster: the cluster of the JobSet's ``TF_CONFIG`` (``--jobset``; else None): each task at its pod's
            hostname in the JobSet's Service, ``<name>-<job>-0-<i>.<name>.<namespace>.svc.<domain>:<port>``.
    """

    cluster: ClusterSpec
    tfjob_cluster: ClusterSpec
    storage: tuple[dict[str, Any], ...]
    workloads: tuple[dict[str, Any], ...]
    tfjob: dict[str, Any]
    jobset: dict[str, Any] | None = None
    jobset_cluster: ClusterSpec | None = None


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


def _task_counts(cluster: ClusterSpec, source: str) -> dict[str, int]:
    """Tasks per job, in the order chief, worker, ps; refuses what Kubernetes pods cannot be."""
    for job in cluster.jobs:
        if job not in _JOBS:
            raise RenderError(f"{source}: job {job!r}: psflow k8s render knows the jobs chief, worker and ps")
        if cluster.task_indices(job) != tuple(range(cluster.num_tasks(job))):
            raise RenderError(f"{source}: job {job!r} is sparse (tasks {list(cluster.task_indices(job))}); "
                              "pods are numbered 0..n-1")
    if "ps" not in cluster.jobs:
        raise RenderError(f"{source}: the cluster has no 'ps' job (jobs: {', '.join(cluster.jobs) or 'none'}); "
                          "psflow needs at least one ps task")
    if "worker" not in cluster.jobs and "chief" not in cluster.jobs:
        raise RenderError(f"{source}: the cluster has no 'worker' or 'chief' job: no task would train")
    if "chief" in cluster.jobs and cluster.num_tasks("chief") != 1:
        raise RenderError(f"{source}: job 'chief' has {cluster.num_tasks('chief')} tasks; a chief job has one")
    return {job: cluster.num_tasks(job) for job in _JOBS if job in cluster.jobs}


def _service_cluster(counts: dict[str, int], config: RenderConfig, domain: str) -> ClusterSpec:
    return ClusterSpec({job: [f"{config.name}-{job}-{i}.{config.namespace}.{domain}:{config.port}" for i in range(n)]
                        for job, n in counts.items()})


def _jobset_cluster(counts: dict[str, int], config: RenderConfig) -> ClusterSpec:
    """Each task at its JobSet pod's hostname, ``<jobset>-<replicated job>-<job index>-<pod index>``, in the
    JobSet's Service (its subdomain, the JobSet's name); one Job per replicated job, so job index 0."""
    domain = f"{config.name}.{config.namespace}.svc.{config.cluster_domain}"
    return ClusterSpec({job: [f"{config.name}-{job}-0-{i}.{domain}:{config.port}" for i in range(n)]
                        for job, n in counts.items()})


def render_manifests(cluster: ClusterSpec, config: RenderConfig, *, source: str = "--cluster") -> Manifests:
    """Builds every manifest for ``cluster``'s task counts (its addresses are replaced by Service names).

    Raises:
        RenderError: the cluster has a job other than chief, worker and ps (an evaluator is
            ``config.evaluator``, outside the cluster), a sparse job, no ps job, no worker or chief, more
            than one chief, or a name that would exceed Kubernetes' limits.
    """
    counts = _task_counts(cluster, source)
    pods = counts | ({_EVALUATOR: 1} if config.evaluator else {})  # the evaluator: a pod, not in the cluster
    hostname = "{name}-{job}-0-{i}" if config.jobset else "{name}-{job}-{i}"  # a JobSet's: job index 0
    longest = max((hostname.format(name=config.name, job=job, i=n - 1) for job, n in pods.items()), key=len)
    if len(longest) > 63:
        raise RenderError(f"--name {config.name!r}: the pod hostname {longest!r} would be longer than 63 characters")
    if not config.jobset and len(f"{config.name}-ps") > _MAX_STATEFULSET_NAME:  # a JobSet has no StatefulSet
        raise RenderError(f"--name {config.name!r}: the StatefulSet {config.name}-ps would be longer than "
                          f"{_MAX_STATEFULSET_NAME} characters")
    services = _service_cluster(counts, config, f"svc.{config.cluster_domain}")
    chief = services.chief()
    workloads: list[dict[str, Any]] = [_service(config, job, i, chief=TaskId(job, i) == chief)
                                       for job, n in counts.items() for i in range(n)]
    workloads.append(_governing_service(config))
    workloads += [_workload(config, services, job, n) for job, n in pods.items()]
    jobset_cluster = _jobset_cluster(counts, config) if config.jobset else None
    return Manifests(cluster=services, tfjob_cluster=_service_cluster(counts, config, "svc"),
                     storage=(_checkpoint_claim(config),), workloads=tuple(workloads), tfjob=_tfjob(config, pods),
                     jobset=None if jobset_cluster is None else _jobset(config, jobset_cluster, pods),
                     jobset_cluster=jobset_cluster)


def _meta(config: RenderConfig, name: str, job: str | None = None) -> dict[str, Any]:
    return {"name": name, "namespace": config.namespace, "labels": _labels(config, job)}


def _labels(config: RenderConfig, job: str | None) -> dict[str, str]:
    labels = {"app.kubernetes.io/name": "psflow", "app.kubernetes.io/instance": config.name}
    if job is not None:
        labels["app.kubernetes.io/component"] = job
    return labels


def _service(config: RenderConfig, job: str, index: int, *, chief: bool) -> dict[str, Any]:
    """Task ``job:index``'s headless Service; the chief's also names the status port, for ``kubectl port-forward svc/...``."""
    selector = ({"statefulset.kubernetes.io/pod-name": f"{config.name}-ps-{index}"} if job == "ps" else
                {"batch.kubernetes.io/job-name": f"{config.name}-{job}", _JOB_INDEX_KEY: str(index)})
    ports = [{"name": "grpc", "port": config.port, "targetPort": config.port}]
    if chief:
        ports.append({"name": "status", "port": config.status_port, "targetPort": config.status_port})
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(config, f"{config.name}-{job}-{index}", job),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": selector, "ports": ports}}


def _governing_service(config: RenderConfig) -> dict[str, Any]:
    """The StatefulSet's ``serviceName``: pod DNS records ``<pod>.<name>-ps``; tasks are addressed by their own."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(config, f"{config.name}-ps", "ps"),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": _labels(config, "ps"),
                     "ports": [{"name": "grpc", "port": config.port, "targetPort": config.port}]}}


def _checkpoint_claim(config: RenderConfig) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": _meta(config, f"{config.name}-checkpoints"),
            "spec": _claim_spec(config, "ReadWriteMany", config.checkpoint_size)}


def _claim_spec(config: RenderConfig, mode: str, size: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": [mode], "resources": {"requests": {"storage": size}}}
    if config.storage_class is not None:
        spec["storageClassName"] = config.storage_class
    return spec


def _escape(arg: str) -> str:
    """``arg`` as a container arg that Kubernetes' ``$(VAR)`` expansion turns back into ``arg``: ``$$`` is one
    ``$`` there, so a ``$(...)`` in it is never expanded."""
    return arg.replace("$", "$$")


def _args(config: RenderConfig, job: str, *, kind: str = "plain") -> list[str]:
    """The container's args (``kind``: plain, tfjob or jobset); the training arguments last, escaped."""
    train_args = [_escape(arg) for arg in config.train_args]
    if job == _EVALUATOR:  # serves nothing: no --bind-host, no status page
        return ["server", "--checkpoint-dir", _CHECKPOINTS, *train_args]
    args = ["server", "--bind-host", "0.0.0.0", "--checkpoint-dir", _CHECKPOINTS]
    if job == "ps":
        args += ["--state-dir", _STATE]
        if kind == "plain":  # a StatefulSet restarts a pod that exits; a TFJob's or JobSet's ps pod exits 0 at the end
            args += ["--keep-serving"]
    else:
        args += ["--status-port", str(config.status_port)]
    return args + train_args


def _mounts(config: RenderConfig, job: str, *, kind: str) -> list[dict[str, Any]]:
    checkpoints: dict[str, Any] = {"name": "checkpoints", "mountPath": _CHECKPOINTS, "subPath": "checkpoints"}
    if job == _EVALUATOR and not _has_flag(config.train_args, "--summary-dir"):
        checkpoints["readOnly"] = True  # it only reads them; with --summary-dir it may write eval/ on the claim
    mounts = [checkpoints]
    if job == "ps":
        # A StatefulSet pod's own claim; a TFJob's or JobSet's ps pods share the checkpoint claim (only ps task 0
        # writes).
        mounts.append({"name": "state", "mountPath": _STATE} if kind == "plain" else
                      {"name": "checkpoints", "mountPath": _STATE, "subPath": "state"})
    elif config.data_pvc is not None:
        mounts.append({"name": "data", "mountPath": _DATA, "readOnly": True})
    return mounts


def _probes(port_name: str) -> dict[str, Any]:
    def probe(period: int, failures: int) -> dict[str, Any]:
        return {"tcpSocket": {"port": port_name}, "periodSeconds": period, "timeoutSeconds": 5,
                "failureThreshold": failures}

    # A worker reads its inputs' first records and builds its model before it listens: up to 5 min to start.
    return {"startupProbe": probe(5, 60), "readinessProbe": probe(10, 3),
            "livenessProbe": probe(20, 3)}  # 60 s without accepting a connection: restarted


def _container(config: RenderConfig, job: str, env: list[dict[str, Any]], *, kind: str) -> dict[str, Any]:
    resources = config.resources(job)
    tfjob = kind == "tfjob"
    port_name = "tfjob-port" if tfjob else "grpc"  # the TFJob operator reads the port named tfjob-port
    listens = job != _EVALUATOR
    # The operator makes a Service for every replica, the evaluator's too; some releases fail without this port.
    ports = [{"name": port_name, "containerPort": config.port, "protocol": "TCP"}] if listens or tfjob else []
    return {
        "name": "tensorflow" if tfjob else "psflow",  # TFJob's operator looks for the container named tensorflow
        "image": config.image, "imagePullPolicy": "IfNotPresent", "args": _args(config, job, kind=kind),
        **({"ports": ports} if ports else {}),
        "env": env + [{"name": "PSFLOW_TOKEN", "valueFrom": {"secretKeyRef": {"name": config.secret, "key": "token"}}}],
        "resources": {"requests": {"cpu": resources.cpu, "memory": resources.memory},
                      "limits": {"memory": resources.memory}},
        **(_probes(port_name) if listens else {}),
        "volumeMounts": _mounts(config, job, kind=kind),
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }


def _pod_spec(config: RenderConfig, job: str, env: list[dict[str, Any]], *, kind: str) -> dict[str, Any]:
    volumes: list[dict[str, Any]] = [{"name": "checkpoints",
                                      "persistentVolumeClaim": {"claimName": f"{config.name}-checkpoints"}}]
    if job != "ps" and config.data_pvc is not None:
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": config.data_pvc, "readOnly": True}})
    return {
        "enableServiceLinks": False,  # no *_SERVICE_HOST variables for every Service of the namespace
        "securityContext": {"runAsNonRoot": True, "runAsUser": _UID, "runAsGroup": _UID, "fsGroup": _UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [_container(config, job, env, kind=kind)],
        "volumes": volumes,
    }


def _index_env(job: str, services: ClusterSpec, *, statefulset: bool) -> list[dict[str, Any]]:
    """``PSFLOW_TASK_INDEX`` from the pod's index (a StatefulSet's pod index, else the Indexed Job's completion
    index), then ``TF_CONFIG`` with it (Kubernetes expands ``$(...)``). Not ``JOB_COMPLETION_INDEX``: the Job
    controller appends it to the container's variables, after ``TF_CONFIG``, where ``$(...)`` cannot see it."""
    source = f"metadata.labels['{_STS_INDEX_LABEL}']" if statefulset else f"metadata.annotations['{_JOB_INDEX_KEY}']"
    tf_config = json.dumps({"cluster": services.as_dict(), "task": {"type": job, "index": f"$({TASK_INDEX_ENV})"}},
                           sort_keys=True, separators=(",", ":"))
    return [{"name": TASK_INDEX_ENV, "valueFrom": {"fieldRef": {"fieldPath": source}}},
            {"name": "TF_CONFIG", "value": tf_config}]


def _workload(config: RenderConfig, services: ClusterSpec, job: str, tasks: int) -> dict[str, Any]:
    name = f"{config.name}-{job}"
    template = {"metadata": {"labels": _labels(config, job)},
                "spec": _pod_spec(config, job, _index_env(job, services, statefulset=job == "ps"), kind="plain")}
    if job == "ps":
        return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _meta(config, name, job), "spec": {
            "serviceName": name, "replicas": tasks, "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": _labels(config, job)}, "template": template,
            "volumeClaimTemplates": [{"metadata": {"name": "state"},
                                      "spec": _claim_spec(config, "ReadWriteOnce", config.state_size)}]}}
    template["spec"]["restartPolicy"] = "OnFailure"  # in place: the worker rejoins (README: Operations)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(config, name, job), "spec": {
        "completionMode": "Indexed", "completions": tasks, "parallelism": tasks,
        "backoffLimit": 3 * tasks,  # as psflow train --max-restarts 3, per task on average
        "template": template}}


def _tfjob(config: RenderConfig, pods: dict[str, int]) -> dict[str, Any]:
    replicas = {_TFJOB_TYPES[job]: {"replicas": n, "restartPolicy": "OnFailure", "template": {
        "metadata": {"labels": _labels(config, job)}, "spec": _pod_spec(config, job, [], kind="tfjob")}}
        for job, n in pods.items()}
    # Running: the ps pods are deleted once the chief (worker 0 without a chief job) has finished. So would the
    # evaluator be, before it evaluated the final checkpoint: with one, None (the TFJob is deleted by hand).
    clean = "None" if _EVALUATOR in pods else "Running"
    return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": _meta(config, config.name),
            "spec": {"runPolicy": {"cleanPodPolicy": clean}, "tfReplicaSpecs": replicas}}


def _jobset(config: RenderConfig, services: ClusterSpec, pods: dict[str, int]) -> dict[str, Any]:
    """One JobSet: a replicated job of one Indexed Job per psflow job, pods restarted in place as the plain
    manifests' Jobs; done when the chief, the workers and the evaluator have succeeded."""
    replicated = []
    for job, n in pods.items():
        pod = _pod_spec(config, job, _index_env(job, services, statefulset=False), kind="jobset")
        pod["restartPolicy"] = "OnFailure"  # in place: the same hostname, the task rejoins
        replicated.append({"name": job, "replicas": 1, "template": {
            "metadata": {"labels": _labels(config, job)},
            "spec": {"completionMode": "Indexed", "completions": n, "parallelism": n, "backoffLimit": 3 * n,
                     "template": {"metadata": {"labels": _labels(config, job)}, "spec": pod}}}})
    return {"apiVersion": _JOBSET_API, "kind": "JobSet", "metadata": _meta(config, config.name), "spec": {
        "network": {"enableDNSHostnames": True, "subdomain": config.name, "publishNotReadyAddresses": True},
        # The ps tasks exit 0 once the run is over; what is left of them when the rest has succeeded is deleted.
        "successPolicy": {"operator": "All", "targetReplicatedJobs": [job for job in pods if job != "ps"]},
        "replicatedJobs": replicated}}


def _yaml(header: str, docs: Sequence[dict[str, Any]]) -> str:
    return header + str(yaml.safe_dump_all(list(docs), sort_keys=False, default_flow_style=False, width=120))


def write_manifests(manifests: Manifests, config: RenderConfig, output: str) -> list[str]:
    """Writes ``storage.yaml``, ``cluster.yaml``, ``tfjob.yaml``, ``cluster.json`` and ``README.md`` into
    ``output`` (with ``config.jobset``: ``storage.yaml``, ``jobset.yaml``, ``cluster.json`` and ``README.md``);
    ``output`` is created if missing; files of these names are replaced. Returns their paths.

    Raises:
        RenderError: ``output`` cannot be created or written.
    """
    ns = f"-n {config.namespace}"
    needs = f"Needs storage.yaml and the Secret {config.secret} (README.md)."
    files: dict[str, str]
    if manifests.jobset is not None and manifests.jobset_cluster is not None:
        files = {
            "storage.yaml": _yaml(f"# psflow {config.name}: checkpoints and the ps state. kubectl apply -f storage.yaml\n",
                                  manifests.storage),
            "jobset.yaml": _yaml(f"# psflow {config.name} as a JobSet ({_JOBSET_API}). {needs} "
                                 "kubectl apply -f jobset.yaml\n", [manifests.jobset]),
            "cluster.json": manifests.jobset_cluster.to_json() + "\n",
            "README.md": _jobset_readme(manifests.jobset_cluster, config, ns),
        }
    else:
        files = {
            "storage.yaml": _yaml(f"# psflow {config.name}: checkpoints (and the TFJob's ps state). "
                                  "kubectl apply -f storage.yaml\n", manifests.storage),
            "cluster.yaml": _yaml(f"# psflow {config.name}: Services, ps StatefulSet, worker Jobs. {needs} "
                                  "kubectl apply -f cluster.yaml\n", manifests.workloads),
            "tfjob.yaml": _yaml(f"# psflow {config.name} as a Kubeflow TFJob, instead of cluster.yaml. {needs} "
                                "kubectl apply -f tfjob.yaml\n", [manifests.tfjob]),
            "cluster.json": manifests.cluster.to_json() + "\n",
            "README.md": _readme(manifests, config, ns),
        }
    try:
        os.makedirs(output, exist_ok=True)
        paths = []
        for name, text in files.items():
            path = os.path.join(output, name)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            paths.append(path)
    except OSError as e:
        raise RenderError(f"--output {output}: cannot write it ({e.strerror or e})") from None
    return paths


def _readme(manifests: Manifests, config: RenderConfig, ns: str) -> str:
    chief = manifests.cluster.chief()
    tasks = ", ".join(f"{j} x{manifests.cluster.num_tasks(j)}" for j in manifests.cluster.jobs)
    evaluator, jobs, tfjob_end = "", "worker Jobs", "a TFJob deletes them itself"
    if config.evaluator:
        evaluator = f"""
   The evaluator's log, a line per evaluated checkpoint (it completes after the final one):

       kubectl {ns} logs -f job/{config.name}-{_EVALUATOR}
       kubectl {ns} logs -f pod/{config.name}-{_EVALUATOR}-0   # the TFJob's pod
"""
        tasks += ", and an evaluator"
        jobs = "worker and evaluator Jobs"
        tfjob_end = f"the TFJob, with an evaluator, keeps them too: `kubectl {ns} delete -f tfjob.yaml`"
    return f"""# psflow cluster {config.name} (namespace {config.namespace})

Rendered by `psflow k8s render`. Tasks: {tasks}.

1. The cluster token, once (never commit it):

       kubectl {ns} create secret generic {config.secret} \\
         --from-literal=token="$(openssl rand -hex 32)"

2. The checkpoint claim (ReadWriteMany), kept when the cluster is deleted:

       kubectl {ns} apply -f storage.yaml

3. Either the plain manifests (Kubernetes >= 1.28) or, with the Kubeflow training operator, the TFJob:

       kubectl {ns} apply -f cluster.yaml     # or: kubectl {ns} apply -f tfjob.yaml

4. The status page of the chief ({chief}), then at http://127.0.0.1:{config.status_port}/ here:

       kubectl {ns} port-forward svc/{config.name}-{chief.job}-{chief.index} {config.status_port}
       kubectl {ns} port-forward pod/{config.name}-{chief.job}-{chief.index} {config.status_port}   # the TFJob's pod
{evaluator}
5. When the {jobs} have completed, the ps tasks still serve: `kubectl {ns} delete -f cluster.yaml`
   ({tfjob_end}). The checkpoints stay on the claim `{config.name}-checkpoints`.

See docs/deploying.md in psflow's source tree.
"""


def _jobset_readme(cluster: ClusterSpec, config: RenderConfig, ns: str) -> str:
    chief = cluster.chief()
    tasks = ", ".join(f"{j} x{cluster.num_tasks(j)}" for j in cluster.jobs)
    evaluator, done = "", "the chief and the workers have"
    if config.evaluator:
        tasks += ", and an evaluator"
        done = "the chief, the workers and the evaluator have"
        evaluator = f"""
   The evaluator's log, a line per evaluated checkpoint (it completes after the final one):

       kubectl {ns} logs -f job/{config.name}-{_EVALUATOR}-0
"""
    selector = (f"app.kubernetes.io/instance={config.name},app.kubernetes.io/component={chief.job},"
                f"{_JOB_INDEX_KEY}={chief.index}")
    return f"""# psflow cluster {config.name} as a JobSet (namespace {config.namespace})

Rendered by `psflow k8s render --jobset`. Tasks: {tasks}. Needs Kubernetes >= 1.28 and the JobSet
controller ({_JOBSET_API}).

1. The cluster token, once (never commit it):

       kubectl {ns} create secret generic {config.secret} \\
         --from-literal=token="$(openssl rand -hex 32)"

2. The checkpoint claim (ReadWriteMany), kept when the JobSet is deleted:

       kubectl {ns} apply -f storage.yaml

3. The JobSet, its pods and a worker's log:

       kubectl {ns} apply -f jobset.yaml
       kubectl {ns} get jobset {config.name}
       kubectl {ns} get pods -l app.kubernetes.io/instance={config.name}
       kubectl {ns} logs -f job/{config.name}-worker-0
{evaluator}
4. The status page of the chief ({chief}), then at http://127.0.0.1:{config.status_port}/ here:

       kubectl {ns} port-forward "$(kubectl {ns} get pods -o name --field-selector status.phase=Running \\
         -l {selector})" {config.status_port}

5. The JobSet has succeeded once {done} (`kubectl {ns} get jobset {config.name}`); the ps
   tasks exit by themselves, and the JobSet deletes any still running. Then `kubectl {ns} delete -f jobset.yaml`.
   The checkpoints stay on the claim `{config.name}-checkpoints`.

See docs/deploying.md in psflow's source tree.
"""


def add_k8s_parser(sub: Any) -> None:
    """``psflow k8s render``'s flags."""
    k8s = sub.add_parser("k8s", help="Kubernetes: psflow k8s render writes the manifests of a cluster")
    commands = k8s.add_subparsers(dest="k8s_command", required=True)
    p = commands.add_parser("render", help="write Services, a ps StatefulSet, worker Jobs and a TFJob (or a JobSet) "
                            "for a cluster",
                            description="Write the Kubernetes manifests of a cluster: see docs/deploying.md.")
    p.add_argument("--cluster", required=True, metavar="FILE", help="cluster JSON: its jobs' task counts (addresses "
                   "are replaced by Service names)")
    p.add_argument("--image", required=True, help="the psflow container image (the Dockerfile's)")
    p.add_argument("--output", required=True, metavar="DIR", help="directory to write the manifests into")
    p.add_argument("--name", default=DEFAULT_NAME, help="the cluster's name: prefix of every object, an RFC 1035 "
                   "label (%(default)s)")
    p.add_argument("--namespace", default="default", help="of every object (%(default)s)")
    p.add_argument("--port", type=int, default=2222, help="every task's port (%(default)s)")
    p.add_argument("--status-port", type=int, default=8080, help="the chief's status page, in its pod (%(default)s)")
    p.add_argument("--data-pvc", metavar="NAME", help="an existing claim with the training data, read-only at /data "
                   "in the workers' and the evaluator's pods (-- --train /data/...)")
    p.add_argument("--cluster-domain", default="cluster.local", help="the cluster's DNS domain (%(default)s)")
    p.add_argument("--storage-class", metavar="NAME", help="of the claims (default: the cluster's); the checkpoint "
                   "claim needs ReadWriteMany")
    p.add_argument("--checkpoint-size", default="10Gi", help="the checkpoint claim (%(default)s)")
    p.add_argument("--state-size", default="1Gi", help="ps task 0's --state-dir claim (%(default)s)")
    p.add_argument("--ps-cpu", default="1", help="requested by each ps task (%(default)s)")
    p.add_argument("--ps-memory", default="2Gi", help="requested by each ps task, and its limit (%(default)s)")
    p.add_argument("--worker-cpu", default="2", help="requested by each worker and the chief (%(default)s)")
    p.add_argument("--worker-memory", default="4Gi", help="requested by each worker and the chief, and its limit "
                   "(%(default)s)")
    p.add_argument("--evaluator", action="store_true", help="also TensorFlow's evaluator task: a Job (and a TFJob "
                   "replica) that evaluates each new checkpoint on the training arguments' --eval")
    p.add_argument("--evaluator-cpu", help="requested by the evaluator (default: --worker-cpu)")
    p.add_argument("--evaluator-memory", help="requested by the evaluator, and its limit (default: --worker-memory)")
    p.add_argument("--jobset", action="store_true", help="write one JobSet (jobset.x-k8s.io/v1alpha2), jobset.yaml, "
                   "instead of cluster.yaml and tfjob.yaml")
    p.add_argument("train_args", nargs="*", metavar="-- TRAINING_ARGS",
                   help="psflow server flags for every task, after a --, e.g. -- --train /data/a9a --epochs 3")


def render_config(args: argparse.Namespace) -> RenderConfig:
    """The :class:`RenderConfig` of ``psflow k8s render``'s flags.

    Raises:
        RenderError: a flag is invalid (see :class:`RenderConfig`), or ``--evaluator-cpu`` or
            ``--evaluator-memory`` is given without ``--evaluator``.
    """
    evaluator_resources = None
    if args.evaluator_cpu is not None or args.evaluator_memory is not None:
        if not args.evaluator:
            flag = "--evaluator-cpu" if args.evaluator_cpu is not None else "--evaluator-memory"
            raise RenderError(f"{flag}: only with --evaluator (there is no evaluator to request it for)")
        evaluator_resources = Resources(args.evaluator_cpu or args.worker_cpu, args.evaluator_memory or args.worker_memory)
    return RenderConfig(
        name=args.name, image=args.image, namespace=args.namespace, port=args.port, train_args=tuple(args.train_args),
        data_pvc=args.data_pvc, status_port=args.status_port, cluster_domain=args.cluster_domain,
        storage_class=args.storage_class, checkpoint_size=args.checkpoint_size, state_size=args.state_size,
        ps_resources=Resources(args.ps_cpu, args.ps_memory), worker_resources=Resources(args.worker_cpu, args.worker_memory),
        evaluator=args.evaluator, evaluator_resources=evaluator_resources, jobset=args.jobset)


def run_k8s(args: argparse.Namespace, *, check_training: Callable[[ClusterSpec], None] | None = None) -> int:
    """``psflow k8s render``: writes the manifests, prints their paths.

    ``check_training`` checks the training arguments for the cluster's tasks (the CLI's, which knows the
    training flags), after the render's own flags and the cluster file and before anything is written.

    Raises:
        RenderError: a bad flag or cluster file; or what ``check_training`` raises.
    """
    config = render_config(args)
    cluster = load_cluster(args.cluster)
    manifests = render_manifests(cluster, config, source=f"--cluster {args.cluster}")
    if check_training is not None:
        check_training(cluster)
    for path in write_manifests(manifests, config, args.output):
        print(path)
    return 0
