"""The manifests of a psflow cluster, as plain dicts: :func:`render_manifests` builds every object
(:class:`Manifests`: Services, the ps StatefulSet, the Indexed Jobs, the checkpoint claim, a TFJob, a JobSet)
from a cluster's task counts and a :class:`~psflow.deploy.config.RenderConfig`.

A function of its inputs: no clock, no randomness, no environment, no cluster is asked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from psflow.cluster import ClusterError, ClusterSpec, TaskId
from psflow.cluster.replicas import ps_replicas
from psflow.deploy.config import (
    CHECKPOINTS,
    DATA,
    EVALUATOR,
    JOB_INDEX_KEY,
    JOBS,
    JOBSET_API,
    MAX_STATEFULSET_NAME,
    PS_BACKUP,
    SERVES,
    STATE,
    STS_INDEX_LABEL,
    TASK_INDEX_ENV,
    TFJOB_TYPES,
    UID,
    RenderConfig,
    RenderError,
    has_flag,
    k8s_name,
)

__all__ = ["Manifests", "render_manifests"]

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
    tfjob: dict[str, Any] | None  # None with ps backups: a TFJob's TF_CONFIG names jobs after its replica types
    jobset: dict[str, Any] | None = None
    jobset_cluster: ClusterSpec | None = None


def _task_counts(cluster: ClusterSpec, source: str, replicas: int = 0) -> dict[str, int]:
    """Tasks per job, in the order chief, worker, ps, ps_backup (``replicas`` per ps task, or the cluster's own
    ps_backup job); refuses what Kubernetes pods cannot be."""
    for job in cluster.jobs:
        if job == PS_BACKUP:
            try:
                given = ps_replicas(cluster)
            except ClusterError as e:
                raise RenderError(f"{source}: {e}") from None
            if replicas and given != replicas:
                raise RenderError(f"--ps-replicas {replicas}: {source} has {given} backup(s) per ps task already")
            continue
        if job not in JOBS:
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
    counts = {job: cluster.num_tasks(job) for job in JOBS if job in cluster.jobs}
    backups = cluster.num_tasks(PS_BACKUP) if PS_BACKUP in cluster.jobs else counts["ps"] * replicas
    return counts | ({PS_BACKUP: backups} if backups else {})


def _service_cluster(counts: dict[str, int], config: RenderConfig, domain: str) -> ClusterSpec:
    return ClusterSpec({job: [f"{config.name}-{k8s_name(job)}-{i}.{config.namespace}.{domain}:{config.port}"
                              for i in range(n)] for job, n in counts.items()})


def _jobset_cluster(counts: dict[str, int], config: RenderConfig) -> ClusterSpec:
    """Each task at its JobSet pod's hostname, ``<jobset>-<replicated job>-<job index>-<pod index>``, in the
    JobSet's Service (its subdomain, the JobSet's name); one Job per replicated job, so job index 0."""
    domain = f"{config.name}.{config.namespace}.svc.{config.cluster_domain}"
    return ClusterSpec({job: [f"{config.name}-{k8s_name(job)}-0-{i}.{domain}:{config.port}" for i in range(n)]
                        for job, n in counts.items()})


def render_manifests(cluster: ClusterSpec, config: RenderConfig, *, source: str = "--cluster") -> Manifests:
    """Builds every manifest for ``cluster``'s task counts (its addresses are replaced by Service names).

    Raises:
        RenderError: the cluster has a job other than chief, worker and ps (an evaluator is
            ``config.evaluator``, outside the cluster), a sparse job, no ps job, no worker or chief, more
            than one chief, or a name that would exceed Kubernetes' limits.
    """
    counts = _task_counts(cluster, source, config.ps_replicas)
    pods = counts | ({EVALUATOR: 1} if config.evaluator else {})  # the evaluator: a pod, not in the cluster
    hostname = "{name}-{job}-0-{i}" if config.jobset else "{name}-{job}-{i}"  # a JobSet's: job index 0
    longest = max((hostname.format(name=config.name, job=k8s_name(job), i=n - 1) for job, n in pods.items()), key=len)
    if len(longest) > 63:
        raise RenderError(f"--name {config.name!r}: the pod hostname {longest!r} would be longer than 63 characters")
    statefulset = f"{config.name}-{k8s_name(PS_BACKUP if PS_BACKUP in counts else 'ps')}"  # the longer name
    if not config.jobset and len(statefulset) > MAX_STATEFULSET_NAME:  # a JobSet has no StatefulSet
        raise RenderError(f"--name {config.name!r}: the StatefulSet {statefulset} would be longer than "
                          f"{MAX_STATEFULSET_NAME} characters")
    services = _service_cluster(counts, config, f"svc.{config.cluster_domain}")
    chief = services.chief()
    workloads: list[dict[str, Any]] = [_service(config, job, i, chief=TaskId(job, i) == chief)
                                       for job, n in counts.items() for i in range(n)]
    workloads += [_governing_service(config, job) for job in SERVES if job in counts]
    workloads += [_workload(config, services, job, n) for job, n in pods.items()]
    jobset_cluster = _jobset_cluster(counts, config) if config.jobset else None
    return Manifests(cluster=services, tfjob_cluster=_service_cluster(counts, config, "svc"),
                     storage=(_checkpoint_claim(config),), workloads=tuple(workloads),
                     tfjob=None if PS_BACKUP in pods else _tfjob(config, pods),
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
    selector = ({"statefulset.kubernetes.io/pod-name": f"{config.name}-{k8s_name(job)}-{index}"} if job in SERVES else
                {"batch.kubernetes.io/job-name": f"{config.name}-{job}", JOB_INDEX_KEY: str(index)})
    ports = [{"name": "grpc", "port": config.port, "targetPort": config.port}]
    if chief:
        ports.append({"name": "status", "port": config.status_port, "targetPort": config.status_port})
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(config, f"{config.name}-{k8s_name(job)}-{index}", job),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": selector, "ports": ports}}


def _governing_service(config: RenderConfig, job: str = "ps") -> dict[str, Any]:
    """A StatefulSet's ``serviceName``: pod DNS records ``<pod>.<name>-ps``; tasks are addressed by their own."""
    name = f"{config.name}-{k8s_name(job)}"
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(config, name, job),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": _labels(config, job),
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
    if job == EVALUATOR:  # serves nothing: no --bind-host, no status page
        return ["server", "--checkpoint-dir", CHECKPOINTS, *train_args]
    args = ["server", "--bind-host", "0.0.0.0", "--checkpoint-dir", CHECKPOINTS]
    if job in SERVES:
        args += ["--state-dir", STATE]
        if kind == "plain":  # a StatefulSet restarts a pod that exits; a TFJob's or JobSet's ps pod exits 0 at the end
            args += ["--keep-serving"]
    else:
        # Restarted in place when it dies (OnFailure): a finished worker must not take a restarting chief's duties
        # over, whose restart (an image pull, CrashLoopBackOff's pause) may outlast --lease-ttl.
        args += ["--status-port", str(config.status_port), "--restarted-by-manager"]
    return args + train_args


def _mounts(config: RenderConfig, job: str, *, kind: str) -> list[dict[str, Any]]:
    checkpoints: dict[str, Any] = {"name": "checkpoints", "mountPath": CHECKPOINTS, "subPath": "checkpoints"}
    if job == EVALUATOR and not has_flag(config.train_args, "--summary-dir"):
        checkpoints["readOnly"] = True  # it only reads them; with --summary-dir it may write eval/ on the claim
    mounts = [checkpoints]
    if job in SERVES:
        # A StatefulSet pod's own claim; a TFJob's or JobSet's ps pods share the checkpoint claim (only ps task 0
        # writes).
        mounts.append({"name": "state", "mountPath": STATE} if kind == "plain" else
                      {"name": "checkpoints", "mountPath": STATE, "subPath": "state"})
    elif config.data_pvc is not None:
        mounts.append({"name": "data", "mountPath": DATA, "readOnly": True})
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
    listens = job != EVALUATOR
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
    if job not in SERVES and config.data_pvc is not None:
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": config.data_pvc, "readOnly": True}})
    return {
        "enableServiceLinks": False,  # no *_SERVICE_HOST variables for every Service of the namespace
        "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [_container(config, job, env, kind=kind)],
        "volumes": volumes,
    }


def _index_env(job: str, services: ClusterSpec, *, statefulset: bool) -> list[dict[str, Any]]:
    """``PSFLOW_TASK_INDEX`` from the pod's index (a StatefulSet's pod index, else the Indexed Job's completion
    index), then ``TF_CONFIG`` with it (Kubernetes expands ``$(...)``). Not ``JOB_COMPLETION_INDEX``: the Job
    controller appends it to the container's variables, after ``TF_CONFIG``, where ``$(...)`` cannot see it."""
    source = f"metadata.labels['{STS_INDEX_LABEL}']" if statefulset else f"metadata.annotations['{JOB_INDEX_KEY}']"
    tf_config = json.dumps({"cluster": services.as_dict(), "task": {"type": job, "index": f"$({TASK_INDEX_ENV})"}},
                           sort_keys=True, separators=(",", ":"))
    return [{"name": TASK_INDEX_ENV, "valueFrom": {"fieldRef": {"fieldPath": source}}},
            {"name": "TF_CONFIG", "value": tf_config}]


def _workload(config: RenderConfig, services: ClusterSpec, job: str, tasks: int) -> dict[str, Any]:
    name = f"{config.name}-{k8s_name(job)}"
    template = {"metadata": {"labels": _labels(config, job)},
                "spec": _pod_spec(config, job, _index_env(job, services, statefulset=job in SERVES), kind="plain")}
    if job in SERVES:
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
    replicas = {TFJOB_TYPES[job]: {"replicas": n, "restartPolicy": "OnFailure", "template": {
        "metadata": {"labels": _labels(config, job)}, "spec": _pod_spec(config, job, [], kind="tfjob")}}
        for job, n in pods.items()}
    # Running: the ps pods are deleted once the chief (worker 0 without a chief job) has finished. So would the
    # evaluator be, before it evaluated the final checkpoint: with one, None (the TFJob is deleted by hand).
    clean = "None" if EVALUATOR in pods else "Running"
    return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": _meta(config, config.name),
            "spec": {"runPolicy": {"cleanPodPolicy": clean}, "tfReplicaSpecs": replicas}}


def _jobset(config: RenderConfig, services: ClusterSpec, pods: dict[str, int]) -> dict[str, Any]:
    """One JobSet: a replicated job of one Indexed Job per psflow job, pods restarted in place as the plain
    manifests' Jobs; done when the chief, the workers and the evaluator have succeeded."""
    replicated = []
    for job, n in pods.items():
        pod = _pod_spec(config, job, _index_env(job, services, statefulset=False), kind="jobset")
        pod["restartPolicy"] = "OnFailure"  # in place: the same hostname, the task rejoins
        replicated.append({"name": k8s_name(job), "replicas": 1, "template": {
            "metadata": {"labels": _labels(config, job)},
            "spec": {"completionMode": "Indexed", "completions": n, "parallelism": n, "backoffLimit": 3 * n,
                     "template": {"metadata": {"labels": _labels(config, job)}, "spec": pod}}}})
    return {"apiVersion": JOBSET_API, "kind": "JobSet", "metadata": _meta(config, config.name), "spec": {
        "network": {"enableDNSHostnames": True, "subdomain": config.name, "publishNotReadyAddresses": True},
        # The ps tasks exit 0 once the run is over; what is left of them when the rest has succeeded is deleted.
        "successPolicy": {"operator": "All", "targetReplicatedJobs": [job for job in pods if job not in SERVES]},
        "replicatedJobs": replicated}}
