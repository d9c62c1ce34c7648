"""psflow k8s render: schema-valid manifests whose pods, and a TFJob's, run the cluster that was rendered."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (psflow[test]) is not installed")

from psflow.cli.k8s import render_config  # noqa: E402
from psflow.cli.main import build_parser, main  # noqa: E402
from psflow.cluster import ClusterSpec, TaskId, parse_tf_config  # noqa: E402
from psflow.deploy.config import RenderConfig, RenderError, Resources, load_cluster, task_index_from_env  # noqa: E402
from psflow.deploy.files import write_manifests  # noqa: E402
from psflow.deploy.manifests import render_manifests  # noqa: E402
from psflow.launch import evaluator as evaluator_module  # noqa: E402
from psflow.launch import lifeline  # noqa: E402
from psflow.launch import task as task_module  # noqa: E402
from psflow.train.config import ConfigError  # noqa: E402

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (kubernetes-validate's) is not installed")

# The newest Kubernetes whose API schemas kubernetes-validate ships (constraints.txt pins the package).
K8S_VERSION = "1.37"
CLUSTERS = {
    "ps-workers": {"ps": ["a:1", "b:1"], "worker": ["c:1", "d:1", "e:1"]},
    "chief": {"chief": ["h:9"], "ps": ["i:9"], "worker": ["j:9", "k:9"]},
}
TOKEN = "test-token"
#: The JobSet CRD (tests/data/k8s/README.md: its source, licence and how it is checked).
JOBSET_CRD = Path(__file__).resolve().parents[2] / "data" / "k8s" / "jobset.x-k8s.io_jobsets.yaml"
TFJOB_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}
CHECKPOINTS = "/var/lib/psflow/checkpoints"
PROBES = {"startupProbe", "readinessProbe", "livenessProbe"}


class Rendered(NamedTuple):
    """The input cluster, the output directory, each YAML file's documents, and whether --evaluator was given."""

    cluster: ClusterSpec
    out: Path
    docs: dict[str, Any]
    evaluator: bool

    @property
    def pods(self) -> dict[str, int]:
        """Pods per job: the cluster's tasks, and the evaluator's one pod outside it."""
        return {job: self.cluster.num_tasks(job) for job in self.cluster.jobs} | ({"evaluator": 1} if self.evaluator else {})


@pytest.fixture(params=[(name, evaluator) for name in sorted(CLUSTERS) for evaluator in (False, True)],
                ids=lambda param: param[0] + ("+evaluator" if param[1] else ""))
def rendered(request: pytest.FixtureRequest, tmp_path: Path) -> Rendered:
    """Renders through the CLI, with and without --evaluator."""
    name, evaluator = request.param
    cluster_file = tmp_path / "cluster.json"
    cluster_file.write_text(json.dumps(CLUSTERS[name]))
    data = tmp_path / "train.libsvm"
    data.write_text("1 1:1 2:0.5\n0 3:1\n1 2:1\n")
    out = tmp_path / "out"
    rc = main(["k8s", "render", "--cluster", str(cluster_file), "--image", "registry.example.com/psflow:0.1.0",
               "--output", str(out), "--name", "ctr", "--namespace", "training", "--data-pvc", "a9a",
               *(["--evaluator"] if evaluator else []),
               "--", "--train", str(data), "--eval", str(data), "--num-features", "8", "--no-status"])
    assert rc == 0
    docs = {name: [d for d in yaml.safe_load_all((out / name).read_text()) if d is not None]
            for name in ("storage.yaml", "cluster.yaml", "tfjob.yaml")}
    return Rendered(ClusterSpec(CLUSTERS[name]), out, docs, evaluator)


def _validate(doc: dict[str, Any]) -> None:
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:  # a jsonschema.ValidationError
        where = "/".join(str(p) for p in e.absolute_path)
        pytest.fail(f"{doc['kind']} {doc['metadata'].get('name')}: {where}: {e.message}")


def _pod(template: dict[str, Any], name: str) -> dict[str, Any]:
    """A PodTemplateSpec as the Pod it makes, for the built-in schema."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {**template["metadata"], "name": name},
            "spec": template["spec"]}


def _kubelet_env(env: list[dict[str, Any]], fields: dict[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: downward API fields, the Secret, then
    ``$(VAR)`` references to variables defined earlier in the list expanded (``$$`` is a literal ``$``)."""
    out: dict[str, str] = {}
    for var in env:
        if "value" in var:
            out[var["name"]] = re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                      lambda m: "$" if m.group(0) == "$$" else out.get(m.group(1), m.group(0)),
                                      var["value"])
        elif "fieldRef" in var["valueFrom"]:
            out[var["name"]] = fields.get(var["valueFrom"]["fieldRef"]["fieldPath"], "")
        else:
            assert var["valueFrom"]["secretKeyRef"]["key"] == "token"
            out[var["name"]] = TOKEN
    return out


def _run_server(monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """``psflow <args>`` in the environment ``env`` up to the point where it would run the task (``task``,
    ``cluster``, run_task's keywords) or the evaluator (``evaluator``: its TrainConfig; ``stop``: its task name)."""
    for name in ("TF_CONFIG", "PSFLOW_TASK_INDEX", "PSFLOW_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    seen: dict[str, Any] = {}

    def run_task(cluster: ClusterSpec, job: str, index: int, config: Any, **kwargs: Any) -> int:
        seen.update(cluster=cluster, task=TaskId(job, index), **kwargs)
        return 0

    class Stop:
        """StopRequest without signal handlers or a thread."""

        exit_code = 0

        def __init__(self, name: str) -> None:
            seen["stop"] = name

        def install_handlers(self) -> bool:
            return True

        def start(self) -> None:
            pass

        def on_stop(self, callback: Any) -> None:
            pass

        def requested(self) -> None:
            return None

        def __enter__(self) -> Stop:  # the evaluator closes its StopRequest when it returns (a784ce4)
            return self

        def __exit__(self, *exc: object) -> None:
            seen["stop_closed"] = True

    monkeypatch.setattr(task_module, "run_task", run_task)
    monkeypatch.setattr(task_module, "configure_logging", lambda **kwargs: None)
    monkeypatch.setattr(evaluator_module, "run_evaluator", lambda config, **kwargs: seen.update(evaluator=config))
    monkeypatch.setattr(lifeline, "StopRequest", Stop)
    assert main(args) == 0
    return seen


def _check_started(seen: dict[str, Any], cluster: ClusterSpec, task: TaskId) -> None:
    """``psflow server`` started ``task`` of ``cluster``: listening at its port, or as the evaluator (no port)
    watching the claim's checkpoints."""
    if task.job != "evaluator":
        assert (seen["cluster"], seen["task"]) == (cluster, task)
        assert seen["bind_address"] == "0.0.0.0:2222"
        # Every pod is restarted in place when it dies (OnFailure, a StatefulSet): a finished worker waits for a
        # restarting chief instead of taking its duties over (psflow.train.take_over); a ps task never takes them.
        assert seen["supervised"] is (task.job in ("chief", "worker"))
        return
    assert "task" not in seen and seen["stop"] == f"/job:evaluator/task:{task.index}"  # not run_task: no server
    assert seen.get("stop_closed"), seen  # the evaluator gives a program that called main() its handlers back
    config = seen["evaluator"]
    assert config.checkpoint.dir == CHECKPOINTS and len(config.data.eval) == 1
    assert config.cluster.num_ps == cluster.num_tasks("ps")


def test_every_manifest_passes_the_kubernetes_schema(rendered: Rendered) -> None:
    cluster, _, docs, evaluator = rendered
    kinds = [d["kind"] for d in docs["storage.yaml"] + docs["cluster.yaml"]]
    assert kinds.count("Service") == len(cluster.tasks()) + 1  # one per task, and the StatefulSet's; none: evaluator
    assert kinds.count("StatefulSet") == 1 and kinds.count("Job") == len(cluster.jobs) - 1 + evaluator
    assert kinds.count("PersistentVolumeClaim") == 1
    for doc in docs["storage.yaml"] + docs["cluster.yaml"]:
        _validate(doc)


def test_the_schema_check_catches_a_bad_manifest(rendered: Rendered) -> None:
    [statefulset] = [d for d in rendered.docs["cluster.yaml"] if d["kind"] == "StatefulSet"]
    statefulset["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["tcpSocket"]["prot"] = 2222
    with pytest.raises(pytest.fail.Exception, match="containers/0/readinessProbe/tcpSocket: .*'prot' was unexpected"):
        _validate(statefulset)


def test_the_tfjob_is_a_tfjob_of_valid_pod_templates(rendered: Rendered) -> None:
    docs = rendered.docs
    [tfjob] = docs["tfjob.yaml"]
    assert (tfjob["apiVersion"], tfjob["kind"]) == ("kubeflow.org/v1", "TFJob")
    assert tfjob["metadata"] == {**tfjob["metadata"], "name": "ctr", "namespace": "training"}
    clean = tfjob["spec"]["runPolicy"]["cleanPodPolicy"]
    assert clean in ("None", "Running", "All")
    assert clean == ("None" if rendered.evaluator else "Running")  # Running would stop the evaluator with the chief
    specs = tfjob["spec"]["tfReplicaSpecs"]
    assert set(specs) == {TFJOB_TYPES[job] for job in rendered.pods}
    for job, replicas in rendered.pods.items():
        spec = specs[TFJOB_TYPES[job]]
        assert set(spec) == {"replicas", "restartPolicy", "template"}
        assert spec["replicas"] == replicas
        assert spec["restartPolicy"] in ("Always", "OnFailure", "Never", "ExitCode")
        _validate(_pod(spec["template"], f"ctr-{job}-0"))
        [container] = spec["template"]["spec"]["containers"]
        assert container["name"] == "tensorflow"  # the operator finds the port here: tfjob-port (the evaluator's too)
        assert {"name": "tfjob-port", "containerPort": 2222, "protocol": "TCP"} in container["ports"]


def _operator_tf_config(tfjob: dict[str, Any], rtype: str, index: int) -> str:
    """TF_CONFIG as Kubeflow's training operator writes it (genTFConfigJSONStr / genClusterSpec): per replica
    type but Evaluator ("evaluator is not part of training cluster"), lowercased,
    ``<job>-<type>-<i>.<namespace>.svc:<tfjob-port>``; the task; environment "cloud"."""
    meta = tfjob["metadata"]
    cluster = {}
    for replica_type, spec in tfjob["spec"]["tfReplicaSpecs"].items():
        if replica_type == "Evaluator":
            continue
        [container] = [c for c in spec["template"]["spec"]["containers"] if c["name"] == "tensorflow"]
        [port] = [p["containerPort"] for p in container["ports"] if p["name"] == "tfjob-port"]
        rt = replica_type.lower()
        cluster[rt] = [f"{meta['name']}-{rt}-{i}.{meta['namespace']}.svc:{port}" for i in range(spec["replicas"])]
    return json.dumps({"cluster": cluster, "task": {"type": rtype.lower(), "index": index}, "environment": "cloud"})


def test_the_operators_tf_config_is_the_rendered_cluster(rendered: Rendered, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, _, docs, _ = rendered
    [tfjob] = docs["tfjob.yaml"]
    manifests = render_manifests(cluster, RenderConfig(name="ctr", image="i", namespace="training"))
    assert manifests.tfjob_cluster.as_dict() == {
        job: [f"ctr-{job}-{i}.training.svc:2222" for i in range(n)] for job, n in
        ((job, cluster.num_tasks(job)) for job in cluster.jobs)}
    for rtype, spec in tfjob["spec"]["tfReplicaSpecs"].items():
        for index in range(spec["replicas"]):
            tf_config = _operator_tf_config(tfjob, rtype, index)
            parsed = parse_tf_config(tf_config)
            assert parsed.cluster == manifests.tfjob_cluster  # the evaluator's too: it has no evaluator job
            assert parsed.task == TaskId(rtype.lower(), index)
            [container] = spec["template"]["spec"]["containers"]
            env = _kubelet_env(container["env"], {}) | {"TF_CONFIG": tf_config}
            seen = _run_server(monkeypatch, container["args"], env)  # psflow unchanged: the operator's TF_CONFIG
            _check_started(seen, manifests.tfjob_cluster, TaskId(rtype.lower(), index))
            if rtype == "PS":  # a TFJob's ps pod exits 0 once the run is over (restartPolicy OnFailure)
                assert seen["stop_when_run_over"] is True
    assert ("Evaluator" in tfjob["spec"]["tfReplicaSpecs"]) == rendered.evaluator


def test_each_pod_computes_its_own_tf_config(rendered: Rendered, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, out, docs, _ = rendered
    services = ClusterSpec.from_json((out / "cluster.json").read_text())
    assert services.as_dict() == {job: [f"ctr-{job}-{i}.training.svc.cluster.local:2222"
                                        for i in range(cluster.num_tasks(job))] for job in cluster.jobs}
    workloads = [doc for doc in docs["cluster.yaml"] if doc["kind"] in ("StatefulSet", "Job")]
    assert sorted(doc["metadata"]["name"] for doc in workloads) == sorted(f"ctr-{job}" for job in rendered.pods)
    for doc in workloads:
        job = doc["metadata"]["name"].removeprefix("ctr-")
        tasks = doc["spec"]["replicas"] if doc["kind"] == "StatefulSet" else doc["spec"]["completions"]
        assert tasks == rendered.pods[job]
        [container] = doc["spec"]["template"]["spec"]["containers"]
        for index in range(tasks):
            fields = ({"metadata.labels['apps.kubernetes.io/pod-index']": str(index)} if doc["kind"] == "StatefulSet"
                      else {"metadata.annotations['batch.kubernetes.io/job-completion-index']": str(index)})
            env = _kubelet_env(container["env"], fields)
            parsed = parse_tf_config(env["TF_CONFIG"])
            assert (parsed.cluster, parsed.task) == (services, TaskId(job, index))  # the evaluator: not in it
            seen = _run_server(monkeypatch, container["args"], env)
            _check_started(seen, services, TaskId(job, index))
            if job != "evaluator":
                assert seen["state_dir"] == ("/var/lib/psflow/state" if job == "ps" else None)
                assert seen["checkpoint_root"] == CHECKPOINTS
                assert seen["stop_when_run_over"] is False  # a StatefulSet would restart a ps pod that exits


def test_each_task_has_a_service_that_selects_only_its_pod(rendered: Rendered) -> None:
    cluster, _, docs, _ = rendered
    services = {d["metadata"]["name"]: d["spec"] for d in docs["cluster.yaml"] if d["kind"] == "Service"}
    assert len(services) == len(cluster.tasks()) + 1  # and the StatefulSet's; none selects the evaluator
    assert not [s for s in services.values() if s["selector"].get("batch.kubernetes.io/job-name") == "ctr-evaluator"]
    for task in cluster.tasks():
        spec = services[f"ctr-{task.job}-{task.index}"]
        assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
        if task.job == "ps":
            assert spec["selector"] == {"statefulset.kubernetes.io/pod-name": f"ctr-ps-{task.index}"}
        else:
            assert spec["selector"] == {"batch.kubernetes.io/job-name": f"ctr-{task.job}",
                                        "batch.kubernetes.io/job-completion-index": str(task.index)}
        status = [p for p in spec["ports"] if p["name"] == "status"]
        assert status == ([{"name": "status", "port": 8080, "targetPort": 8080}] if task == cluster.chief() else [])


def test_the_evaluator_is_a_workers_pod_that_serves_nothing(rendered: Rendered) -> None:
    _, out, docs, evaluator = rendered
    jobs = {d["metadata"]["name"]: d for d in docs["cluster.yaml"] if d["kind"] == "Job"}
    specs = docs["tfjob.yaml"][0]["spec"]["tfReplicaSpecs"]
    readme = (out / "README.md").read_text()
    assert ("kubectl -n training logs -f job/ctr-evaluator" in readme) == evaluator
    assert "evaluator" not in ClusterSpec.from_json((out / "cluster.json").read_text()).jobs
    if not evaluator:
        assert "ctr-evaluator" not in jobs and "Evaluator" not in specs
        assert not [d for d in docs["cluster.yaml"] if d["metadata"]["labels"].get("app.kubernetes.io/component")
                    == "evaluator"]
        return
    job = jobs["ctr-evaluator"]["spec"]
    assert {k: job[k] for k in ("completionMode", "completions", "parallelism")} == {
        "completionMode": "Indexed", "completions": 1, "parallelism": 1}
    for pod, worker_pod, tfjob in ((job["template"]["spec"], jobs["ctr-worker"]["spec"]["template"]["spec"], False),
                                   (specs["Evaluator"]["template"]["spec"], specs["Worker"]["template"]["spec"], True)):
        assert pod | {"containers": None} == worker_pod | {"containers": None}  # volumes, securityContext, restarts
        [ours], [theirs] = pod["containers"], worker_pod["containers"]
        assert not PROBES & ours.keys()  # it listens on no port
        assert ours.get("ports") == (theirs["ports"] if tfjob else None)  # the operator wants tfjob-port declared
        same = set(theirs) - PROBES - {"ports", "args", "env", "volumeMounts"}  # image, resources, securityContext
        assert {k: ours[k] for k in same} == {k: theirs[k] for k in same}
        assert ours["env"][-1] == theirs["env"][-1] == {  # after TF_CONFIG (the operator's, in a TFJob)
            "name": "PSFLOW_TOKEN", "valueFrom": {"secretKeyRef": {"name": "ctr-token", "key": "token"}}}
        train_args = ours["args"][3:]
        assert ours["args"][:3] == ["server", "--checkpoint-dir", CHECKPOINTS]  # no --bind-host, no status page
        assert theirs["args"][-len(train_args):] == train_args and "--eval" in train_args
        checkpoints, *rest = theirs["volumeMounts"]
        assert checkpoints["subPath"] == "checkpoints" and rest[0]["name"] == "data" and rest[0]["readOnly"]
        assert ours["volumeMounts"] == [checkpoints | {"readOnly": True}, *rest]


def test_without_the_evaluator_the_rest_is_the_same() -> None:
    cluster, train_args = ClusterSpec(CLUSTERS["chief"]), ("--train", "t", "--eval", "e")
    plain = render_manifests(cluster, RenderConfig(name="demo", image="psflow:1", train_args=train_args))
    with_it = render_manifests(cluster, RenderConfig(name="demo", image="psflow:1", train_args=train_args,
                                                     evaluator=True))
    assert [d["metadata"]["name"] for d in with_it.workloads[len(plain.workloads):]] == ["demo-evaluator"]
    assert with_it.workloads[:len(plain.workloads)] == plain.workloads
    assert (with_it.cluster, with_it.tfjob_cluster, with_it.storage) == (plain.cluster, plain.tfjob_cluster, plain.storage)
    specs = dict(with_it.tfjob["spec"]["tfReplicaSpecs"])
    assert list(specs).pop() == "Evaluator"
    del specs["Evaluator"]
    assert specs == plain.tfjob["spec"]["tfReplicaSpecs"]


def _evaluator_container(config: RenderConfig) -> dict[str, Any]:
    [job] = [d for d in render_manifests(ClusterSpec(CLUSTERS["chief"]), config).workloads
             if d["metadata"]["name"] == f"{config.name}-evaluator"]
    [container] = job["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize(("train_args", "read_only"), [
    (("--eval", "e"), True),
    (("--eval=e",), True),
    (("--eval", "e", "--summary-dir", "/var/lib/psflow/checkpoints/summaries"), False),  # writes eval/ there
    (("--eval", "e", "--summary-dir=s"), False),
    (("--eval", "e", "--summary=s"), True),  # not the flag: render refuses it (flags are matched whole)
])
def test_the_evaluator_may_write_the_claim_only_for_summaries(train_args: tuple[str, ...], read_only: bool) -> None:
    container = _evaluator_container(RenderConfig(name="demo", image="i", train_args=train_args, evaluator=True))
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "checkpoints"]
    assert mount.get("readOnly", False) is read_only and mount["subPath"] == "checkpoints"


def test_the_evaluators_resources_default_to_a_workers() -> None:
    base = ["k8s", "render", "--cluster", "c.json", "--image", "i", "--output", "o", "--name", "demo",
            "--worker-cpu", "3", "--worker-memory", "6Gi", "--evaluator"]
    for extra, want in (([], Resources("3", "6Gi")), (["--evaluator-cpu", "500m"], Resources("500m", "6Gi")),
                        (["--evaluator-memory", "1Gi"], Resources("3", "1Gi"))):
        config = render_config(build_parser().parse_args([*base, *extra, "--", "--eval", "e"]))
        assert config.resources("evaluator") == want
        assert _evaluator_container(config)["resources"] == {"requests": {"cpu": want.cpu, "memory": want.memory},
                                                             "limits": {"memory": want.memory}}


def test_psflow_server_takes_its_task_index_from_the_environment(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cluster_file = tmp_path / "c.json"
    cluster_file.write_text(json.dumps({"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3"]}))
    args = ["server", "--cluster", str(cluster_file), "--job", "ps"]
    env = {"PSFLOW_TOKEN": TOKEN, "PSFLOW_TASK_INDEX": "1"}
    assert _run_server(monkeypatch, args, env)["task"] == TaskId("ps", 1)
    assert _run_server(monkeypatch, [*args, "--task", "0"], env)["task"] == TaskId("ps", 0)  # the flag wins
    seen = _run_server(monkeypatch, [*args, "--bind-host", "::"], env)
    assert (seen["task"], seen["bind_address"]) == (TaskId("ps", 1), "[::]:2")
    assert task_index_from_env(None) is None and task_index_from_env("12") == 12
    for bad in ("", "-1", "ps-1", "1.0"):
        with pytest.raises(ConfigError, match="PSFLOW_TASK_INDEX"):
            task_index_from_env(bad)
    with pytest.raises(ConfigError, match="apps.kubernetes.io/pod-index"):
        task_index_from_env("")


def test_psflow_server_restarted_by_manager_never_takes_the_chief_duties_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``--restarted-by-manager`` reaches run_task as ``supervised`` (run_worker's ``take_over=False``); without it a
    worker of ``psflow server`` may take the duties of a chief that nothing restarts."""
    cluster_file = tmp_path / "c.json"
    cluster_file.write_text(json.dumps({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}))
    data = tmp_path / "train.libsvm"
    data.write_text("1 1:1 2:0.5\n0 3:1\n")
    args = ["server", "--cluster", str(cluster_file), "--job", "worker", "--task", "1", "--train", str(data),
            "--num-features", "4", "--no-status"]
    env = {"PSFLOW_TOKEN": TOKEN}
    assert _run_server(monkeypatch, args, env)["supervised"] is False
    assert _run_server(monkeypatch, [*args, "--restarted-by-manager"], env)["supervised"] is True
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["server", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "restartPolicy OnFailure" in help_text and "waits for the chief" in help_text


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(("cluster", "extra", "named"), [
    (None, [], "missing.json: cannot read it"),
    ({"worker": ["a:1"]}, [], "no 'ps' job"),
    ({"ps": ["a:1"], "worker": ["b:1"], "evaluator": ["c:1"]}, [], "job 'evaluator'"),
    ({"ps": {"1": "a:1"}, "worker": ["b:1"]}, [], "job 'ps' is sparse"),
    ({"ps": ["a:1"]}, [], "no 'worker' or 'chief' job"),
    ({"ps": ["a:1"], "worker": ["b:1"]}, ["--name", "My_Job"], "--name 'My_Job': not a valid Kubernetes name"),
    ({"ps": ["a:1"], "worker": ["b:1"]}, ["--name", "x" * 60], "longer than 63 characters"),
    ({"ps": ["a:1"], "worker": ["b:1"]}, ["--namespace", "Team A"], "--namespace 'Team A'"),
    ({"ps": ["a:1"], "worker": ["b:1"]}, ["--worker-memory", "4 GB"], "--worker-memory '4 GB'"),
    ({"ps": ["a:1"], "worker": ["b:1"]}, ["--", "--epocs", "3"], "after --: unrecognized arguments: --epocs"),
    ({"ps": ["a:1"], "worker": ["b:1"]}, ["--", "--train", "t", "--summary=s"],
     "after --: unrecognized arguments: --summary=s"),  # flags are matched whole
    ({"ps": ["a:1"], "worker": ["b:1"]}, ["--", "--task", "1"], "after --: --task: the manifests set it"),
    # Checked as psflow train checks them (issue 30, item 4), before anything is written.
    ({"ps": ["a:1"], "worker": ["b:1"]}, ["--", "--train", "/data/t", "--epochs", "-3"],
     "the training arguments after --: --epochs must be >= 1, got -3"),
    ({"ps": ["a:1"], "worker": ["b:1"]}, ["--", "--epochs", "3"], "the training arguments after --: --train is required"),
    ({"ps": ["a:1"], "worker": ["b:1"]}, [], "the training arguments after --: --train is required"),
    ({"ps": ["a:1"], "worker": ["b:1"]}, ["--", "--train", "/data/t", "--model", "nosuch"],
     "the training arguments after --: unknown model 'nosuch'"),
    ({"ps": ["a:1"], "worker": ["b:1"]}, ["--", "--train", "/data/t", "--hidden", "0"],
     "the training arguments after --: --hidden '0': want layer sizes >= 1"),
    ({"ps": ["a:1"], "worker": ["b:1", "c:1"]},
     ["--", "--train", "/data/t", "--mode", "sync", "--replicas-to-aggregate", "3"],
     "the training arguments after --: --replicas-to-aggregate 3 exceeds --workers (2)"),
    ({"ps": ["a:1"], "worker": ["b:1"]}, ["--", "--train", "/data/t", "--partitions", "2", "--num-features", "1"],
     "the training arguments after --: --partitions (2) exceeds --num-features (1)"),
    ({"ps": ["a:1"], "worker": ["b:1"]}, ["--evaluator"],
     "--evaluator: the training arguments after -- have no --eval"),
    ({"ps": ["a:1"], "worker": ["b:1"]}, ["--evaluator", "--", "--train", "t", "--eval-every-steps", "5"],
     "--evaluator: the training arguments after -- have no --eval"),
    ({"ps": ["a:1"], "worker": ["b:1"]}, ["--evaluator-cpu", "1", "--", "--eval", "e"],
     "--evaluator-cpu: only with --evaluator"),
    ({"ps": ["a:1"], "worker": ["b:1"]}, ["--evaluator", "--evaluator-memory", "8 GB", "--", "--eval", "e"],
     "--evaluator-memory '8 GB'"),
])
def test_bad_input_is_one_line_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str], cluster: Any,
                                         extra: list[str], named: str) -> None:
    path = tmp_path / ("missing.json" if cluster is None else "c.json")
    if cluster is not None:
        path.write_text(json.dumps(cluster))
    flags = {"--name": "demo", "--image": "psflow:0.1.0", "--output": str(tmp_path / "out")}
    head = extra[:extra.index("--")] if "--" in extra else extra
    argv = ["k8s", "render", "--cluster", str(path)]
    for flag, value in flags.items():
        if flag not in head:
            argv += [flag, value]
    err = _one_line_error(capsys, argv + extra)
    assert err.startswith("psflow k8s: error: ") and named in err, err
    assert not (tmp_path / "out").exists()


def test_render_errors_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(RenderError, match="no such file|cannot read"):
        load_cluster(str(tmp_path / "none.json"))
    assert issubclass(RenderError, ConfigError)
    with pytest.raises(RenderError, match="--status-port 2222: the same as --port"):
        RenderConfig(name="a", image="i", status_port=2222)
    with pytest.raises(RenderError, match="--evaluator: the training arguments after -- have no --eval"):
        RenderConfig(name="a", image="i", train_args=("--eval-poll-secs", "2"), evaluator=True)


@pytest.mark.parametrize("jobset", [False, True], ids=["plain", "jobset"])
def test_the_render_is_deterministic_and_writes_no_token(tmp_path: Path, jobset: bool) -> None:
    cluster = ClusterSpec(CLUSTERS["chief"])
    config = RenderConfig(name="demo", image="psflow:1", train_args=("--epochs", "2"), jobset=jobset)
    first = write_manifests(render_manifests(cluster, config), config, str(tmp_path / "a"))
    second = write_manifests(render_manifests(cluster, config), config, str(tmp_path / "b"))
    for a, b in zip(first, second, strict=True):
        assert Path(a).read_text() == Path(b).read_text()
    text = "".join(Path(p).read_text() for p in first)
    assert "kind: Secret" not in text and "secretKeyRef" in text and "create secret generic demo-token" in text


def test_the_module_does_not_import_grpc() -> None:
    code = "import sys, psflow.deploy.files, psflow.cli.k8s; sys.exit('grpc' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def _kubernetes_expand(text: str, env: dict[str, str]) -> str:
    """``$(VAR)`` expansion as the kubelet applies it to a container's command and args (Kubernetes'
    third_party/forked/golang/expansion): ``$$`` is a literal ``$``; ``$(NAME)`` is the variable's value, or kept
    as written when the container has no such variable; ``$`` before anything else, and a ``$(`` never closed,
    are kept as written."""
    out, i = [], 0
    while i < len(text):
        if text[i] != "$" or i + 1 == len(text):
            out.append(text[i])
            i += 1
        elif text[i + 1] == "$":
            out.append("$")
            i += 2
        elif text[i + 1] == "(" and ")" in text[i + 2:]:
            close = text.index(")", i + 2)
            name = text[i + 2:close]
            out.append(env.get(name, f"$({name})"))
            i = close + 1
        else:
            out.append(text[i:i + 2])
            i += 2
    return "".join(out)


def test_the_expansion_model_is_kubernetes() -> None:
    env = {"A": "x", "PSFLOW_TOKEN": TOKEN}
    assert _kubernetes_expand("$(A)/$(B)/$$(A)/$$$(A)/$x/$(/$", env) == "x/$(B)/$(A)/$x/$x/$(/$"
    assert _kubernetes_expand("/data/$(PSFLOW_TOKEN)", env) == f"/data/{TOKEN}"


TRICKY_ARGS = ["--train", "/data/$(PSFLOW_TOKEN)/a$$b$", "--eval", "/data/$(TF_CONFIG)", "--summary-dir", "/s/$x$("]


def _containers(config: RenderConfig) -> list[tuple[str, dict[str, Any]]]:
    """Every container the render makes, with its kind: cluster.yaml's workloads, the TFJob's and the JobSet's."""
    manifests = render_manifests(ClusterSpec(CLUSTERS["chief"]), config)
    out = [(doc["kind"], c) for doc in manifests.workloads if doc["kind"] in ("StatefulSet", "Job")
           for c in doc["spec"]["template"]["spec"]["containers"]]
    out += [("TFJob", c) for spec in manifests.tfjob["spec"]["tfReplicaSpecs"].values()
            for c in spec["template"]["spec"]["containers"]]
    if manifests.jobset is not None:
        out += [("JobSet", c) for rjob in manifests.jobset["spec"]["replicatedJobs"]
                for c in rjob["template"]["spec"]["template"]["spec"]["containers"]]
    return out


@pytest.mark.parametrize("jobset", [False, True], ids=["plain", "jobset"])
def test_training_arguments_reach_the_process_as_given(jobset: bool) -> None:
    """Kubernetes expands ``$(VAR)`` in a container's args: an argument naming ``$(PSFLOW_TOKEN)`` must not put the
    cluster token into argv (nor ``$$`` lose a ``$``): every ``$`` of the training arguments is escaped."""
    config = RenderConfig(name="demo", image="i", train_args=tuple(TRICKY_ARGS), evaluator=True, jobset=jobset)
    containers = _containers(config)
    assert {kind for kind, _ in containers} == {"StatefulSet", "Job", "TFJob"} | ({"JobSet"} if jobset else set())
    for kind, container in containers:
        env = _kubelet_env(container["env"], {}) | {"TF_CONFIG": "{}"}
        argv = [_kubernetes_expand(arg, env) for arg in container["args"]]
        assert argv[-len(TRICKY_ARGS):] == TRICKY_ARGS, (kind, container["args"])
        assert not [arg for arg in argv if TOKEN in arg], kind


def _render(tmp_path: Path, *extra: str, cluster: dict[str, Any] | None = None) -> Path:
    cluster_file = tmp_path / "c.json"
    cluster_file.write_text(json.dumps(cluster or CLUSTERS["chief"]))
    out = tmp_path / "out"
    assert main(["k8s", "render", "--cluster", str(cluster_file), "--image", "psflow:1", "--output", str(out),
                 *extra]) == 0
    return out


def test_the_name_defaults_to_psflow(tmp_path: Path) -> None:
    out = _render(tmp_path, "--", "--train", "/data/t")
    docs = list(yaml.safe_load_all((out / "cluster.yaml").read_text()))
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "Job"} == {"psflow-chief", "psflow-worker"}
    assert "create secret generic psflow-token" in (out / "README.md").read_text()


def test_the_training_arguments_name_files_of_the_pods_not_of_this_machine(tmp_path: Path) -> None:
    """Checked as psflow train checks its settings, but no path is opened here: they are the pods' files (a
    TFRecord schema inferred from the first training file, a --schema file, a --warm-start)."""
    for args in (["--train", "/data/none/*.libsvm", "--eval", "/data/none.t"],
                 ["--train", "/data/none.tfrecord", "--format", "tfrecord"],
                 ["--train", "/data/none.tfrecord", "--format", "tfrecord", "--schema", "/data/none.yaml"],
                 ["--train", "/data/none.tsv", "--format", "criteo", "--warm-start", "/data/none.safetensors",
                  "--model", "mymodels.ctr:Model"]):
        out = _render(tmp_path, "--", *args)
        [worker] = [d for d in yaml.safe_load_all((out / "cluster.yaml").read_text())
                    if d["kind"] == "Job" and d["metadata"]["name"] == "psflow-worker"]
        assert worker["spec"]["template"]["spec"]["containers"][0]["args"][-len(args):] == args


# --- psflow k8s render --jobset: one JobSet (jobset.x-k8s.io/v1alpha2), issue 30 item 7 ---------------------------


def _strict(schema: Any) -> Any:
    """A CRD's OpenAPI schema as a strict Draft 7 schema: the API server prunes a field its schema does not list
    (no error), so here every object schema that lists ``properties`` and does not preserve unknown fields gets
    ``additionalProperties: false``, and a misspelt field fails."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (schema.get("type") == "object" and isinstance(schema.get("properties"), dict)
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out.setdefault("additionalProperties", False)
    return out


@pytest.fixture(scope="module")
def jobset_validator() -> Any:
    with JOBSET_CRD.open(encoding="utf-8") as f:
        crd = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    [version] = crd["spec"]["versions"]
    assert (crd["spec"]["group"], version["name"], crd["spec"]["names"]["kind"]) == ("jobset.x-k8s.io", "v1alpha2",
                                                                                       "JobSet")
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def _validate_jobset(validator: Any, doc: dict[str, Any]) -> None:
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        pytest.fail("; ".join(f"{'/'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in errors[:5]))


class RenderedJobSet(NamedTuple):
    cluster: ClusterSpec
    out: Path
    jobset: dict[str, Any]
    storage: list[dict[str, Any]]
    evaluator: bool

    @property
    def pods(self) -> dict[str, int]:
        return {job: self.cluster.num_tasks(job) for job in self.cluster.jobs} | ({"evaluator": 1} if self.evaluator else {})

    def replicated(self) -> dict[str, dict[str, Any]]:
        return {r["name"]: r for r in self.jobset["spec"]["replicatedJobs"]}


@pytest.fixture(params=[(name, evaluator) for name in sorted(CLUSTERS) for evaluator in (False, True)],
                ids=lambda param: param[0] + ("+evaluator" if param[1] else ""))
def rendered_jobset(request: pytest.FixtureRequest, tmp_path: Path) -> RenderedJobSet:
    """``psflow k8s render --jobset`` through the CLI, with and without --evaluator."""
    name, evaluator = request.param
    cluster_file = tmp_path / "cluster.json"
    cluster_file.write_text(json.dumps(CLUSTERS[name]))
    data = tmp_path / "train.libsvm"
    data.write_text("1 1:1 2:0.5\n0 3:1\n1 2:1\n")
    out = tmp_path / "out"
    rc = main(["k8s", "render", "--jobset", "--cluster", str(cluster_file), "--image", "registry.example.com/psflow:0.1.0",
               "--output", str(out), "--name", "ctr", "--namespace", "training", "--data-pvc", "a9a",
               *(["--evaluator"] if evaluator else []),
               "--", "--train", str(data), "--eval", str(data), "--num-features", "8", "--no-status"])
    assert rc == 0
    [jobset] = [d for d in yaml.safe_load_all((out / "jobset.yaml").read_text()) if d is not None]
    storage = [d for d in yaml.safe_load_all((out / "storage.yaml").read_text()) if d is not None]
    return RenderedJobSet(ClusterSpec(CLUSTERS[name]), out, jobset, storage, evaluator)


def test_the_jobset_passes_the_jobset_crd_schema(rendered_jobset: RenderedJobSet, jobset_validator: Any) -> None:
    jobset = rendered_jobset.jobset
    assert (jobset["apiVersion"], jobset["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert jobset["metadata"] == {**jobset["metadata"], "name": "ctr", "namespace": "training"}
    _validate_jobset(jobset_validator, jobset)
    assert sorted(p.name for p in rendered_jobset.out.iterdir()) == ["README.md", "cluster.json", "jobset.yaml",
                                                                      "storage.yaml"]  # one JobSet, no alternatives


def test_the_crd_check_catches_a_bad_jobset(rendered_jobset: RenderedJobSet, jobset_validator: Any) -> None:
    for path, key, value, message in ((("spec", "network"), "enableDNSHostname", True, "'enableDNSHostname' was unexpected"),
                                      (("spec", "successPolicy"), "operator", "Every", "'Every' is not one of"),
                                      (("spec", "replicatedJobs", 0), "replicas", "1", "'1' is not of type 'integer'")):
        bad = json.loads(json.dumps(rendered_jobset.jobset))
        where = bad
        for step in path:
            where = where[step]
        where[key] = value
        with pytest.raises(pytest.fail.Exception, match=message):
            _validate_jobset(jobset_validator, bad)


def test_the_jobsets_jobs_pods_and_claim_pass_the_kubernetes_schema(rendered_jobset: RenderedJobSet) -> None:
    """Each replicated job's template as the Job JobSet makes of it (``<jobset>-<name>-<job index>``), and its pod
    template as the Pod: kubernetes-validate's built-in schemas, strict."""
    for doc in rendered_jobset.storage:
        _validate(doc)
    for name, rjob in rendered_jobset.replicated().items():
        template = rjob["template"]
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {**template["metadata"], "name": f"ctr-{name}-0", "namespace": "training"},
               "spec": template["spec"]}
        _validate(job)
        _validate(_pod(template["spec"]["template"], f"ctr-{name}-0-0-abcde"))


def test_the_jobset_has_a_replicated_job_per_psflow_job_on_one_network(rendered_jobset: RenderedJobSet) -> None:
    spec = rendered_jobset.jobset["spec"]
    assert spec["network"] == {"enableDNSHostnames": True, "subdomain": "ctr", "publishNotReadyAddresses": True}
    replicated = rendered_jobset.replicated()
    assert set(replicated) == set(rendered_jobset.pods)
    for name, rjob in replicated.items():
        job = rjob["template"]["spec"]
        assert rjob["replicas"] == 1  # one Job per psflow job: job index 0; the task is the completion index
        assert {k: job[k] for k in ("completionMode", "completions", "parallelism")} == {
            "completionMode": "Indexed", "completions": rendered_jobset.pods[name], "parallelism": rendered_jobset.pods[name]}
        pod = job["template"]["spec"]
        assert pod["restartPolicy"] == "OnFailure" and "hostname" not in pod and "subdomain" not in pod  # JobSet's
        claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]}
        assert claims == ({"ctr-checkpoints"} if name == "ps" else {"ctr-checkpoints", "a9a"})
        [container] = pod["containers"]
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        if name == "ps":  # ps task 0's --state-dir on the checkpoint claim, as in the TFJob (no per-pod claims)
            assert mounts["/var/lib/psflow/state"] == {"name": "checkpoints", "mountPath": "/var/lib/psflow/state",
                                                       "subPath": "state"}
            assert "--keep-serving" not in container["args"]  # it exits 0 once the run is over
        else:
            assert mounts["/data"]["readOnly"] is True
    assert {d["metadata"]["name"] for d in rendered_jobset.storage} == {"ctr-checkpoints"}


def test_the_jobset_succeeds_when_the_training_jobs_and_the_evaluator_have(rendered_jobset: RenderedJobSet) -> None:
    policy = rendered_jobset.jobset["spec"]["successPolicy"]
    trainers = [job for job in ("chief", "worker") if job in rendered_jobset.cluster.jobs]
    assert policy == {"operator": "All",
                      "targetReplicatedJobs": trainers + (["evaluator"] if rendered_jobset.evaluator else [])}
    assert set(policy["targetReplicatedJobs"]) <= set(rendered_jobset.replicated())  # the webhook's rule
    assert "failurePolicy" not in rendered_jobset.jobset["spec"]  # a Job past its backoffLimit fails the JobSet


def test_each_jobset_pod_computes_its_own_tf_config(rendered_jobset: RenderedJobSet,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pod of each replicated job, as the kubelet starts it: its completion index from the downward API,
    TF_CONFIG naming every task at its JobSet hostname (``<jobset>-<job>-<job index>-<pod index>.<subdomain>``),
    and ``psflow server`` starting exactly that task of that cluster."""
    cluster, out = rendered_jobset.cluster, rendered_jobset.out
    services = ClusterSpec.from_json((out / "cluster.json").read_text())
    assert services.as_dict() == {job: [f"ctr-{job}-0-{i}.ctr.training.svc.cluster.local:2222"
                                        for i in range(cluster.num_tasks(job))] for job in cluster.jobs}
    for name, rjob in rendered_jobset.replicated().items():
        [container] = rjob["template"]["spec"]["template"]["spec"]["containers"]
        for index in range(rjob["template"]["spec"]["completions"]):
            env = _kubelet_env(container["env"], {
                "metadata.annotations['batch.kubernetes.io/job-completion-index']": str(index)})
            parsed = parse_tf_config(env["TF_CONFIG"])
            assert (parsed.cluster, parsed.task) == (services, TaskId(name, index))
            if name != "evaluator":
                hostname = f"{rendered_jobset.jobset['metadata']['name']}-{name}-0-{index}"
                subdomain = rendered_jobset.jobset["spec"]["network"]["subdomain"]
                assert services.task_address(name, index).startswith(f"{hostname}.{subdomain}.training.svc.")
            seen = _run_server(monkeypatch, [_kubernetes_expand(arg, env) for arg in container["args"]], env)
            _check_started(seen, services, TaskId(name, index))
            if name != "evaluator":
                assert seen["checkpoint_root"] == CHECKPOINTS
                assert seen["state_dir"] == ("/var/lib/psflow/state" if name == "ps" else None)
                assert seen["stop_when_run_over"] is (name == "ps")  # a ps exits 0 with the run


def test_the_jobset_readme_says_how_to_run_it(rendered_jobset: RenderedJobSet) -> None:
    readme = (rendered_jobset.out / "README.md").read_text()
    chief = rendered_jobset.cluster.chief()
    assert "kubectl -n training apply -f jobset.yaml" in readme and "kubectl -n training apply -f storage.yaml" in readme
    assert "create secret generic ctr-token" in readme and "cluster.yaml" not in readme
    assert (f"app.kubernetes.io/instance=ctr,app.kubernetes.io/component={chief.job},"
            f"batch.kubernetes.io/job-completion-index={chief.index}") in readme
    assert ("logs -f job/ctr-evaluator-0" in readme) == rendered_jobset.evaluator


def test_the_jobsets_hostnames_bound_the_name() -> None:
    """JobSet's own rule: the longest pod hostname, ``<jobset>-<job>-<job index>-<pod index>``, is a DNS label
    (at most 63 characters); a JobSet has no StatefulSet, whose name bounds the plain manifests' name more."""
    cluster = ClusterSpec(CLUSTERS["ps-workers"])
    assert render_manifests(cluster, RenderConfig(name="x" * 52, image="i", jobset=True)).jobset is not None
    with pytest.raises(RenderError, match="'x{53}-worker-0-2' would be longer than 63 characters"):
        render_manifests(cluster, RenderConfig(name="x" * 53, image="i", jobset=True))
    with pytest.raises(RenderError, match="the StatefulSet x{52}-ps would be longer than 52 characters"):
        render_manifests(cluster, RenderConfig(name="x" * 52, image="i"))


# --- psflow k8s render --ps-replicas N: the shards' backups (issue 28) ---------------------------------------------


def test_ps_replicas_render_a_backup_statefulset_whose_pods_serve_their_task(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    out = _render(tmp_path, "--name", "ctr", "--ps-replicas", "1", "--", "--train", "/data/t",
                  cluster=CLUSTERS["ps-workers"])
    assert not (out / "tfjob.yaml").exists()  # a TFJob's operator cannot name the ps_backup job
    assert "there is no TFJob" in (out / "README.md").read_text()
    services = ClusterSpec.from_json((out / "cluster.json").read_text())
    assert services.as_dict()["ps_backup"] == [f"ctr-ps-backup-{i}.default.svc.cluster.local:2222" for i in range(2)]
    docs = [d for d in yaml.safe_load_all((out / "cluster.yaml").read_text()) if d is not None]
    for doc in docs:
        _validate(doc)
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    backups = by_name[("StatefulSet", "ctr-ps-backup")]
    assert backups["spec"]["replicas"] == 2 and backups["spec"]["serviceName"] == "ctr-ps-backup"
    assert ("Service", "ctr-ps-backup") in by_name  # the StatefulSet's governing Service
    assert by_name[("Service", "ctr-ps-backup-1")]["spec"]["selector"] == {
        "statefulset.kubernetes.io/pod-name": "ctr-ps-backup-1"}
    [container] = backups["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["requests"]["memory"] == "2Gi"  # a ps task's requests
    for index in range(2):
        env = _kubelet_env(container["env"], {"metadata.labels['apps.kubernetes.io/pod-index']": str(index)})
        seen = _run_server(monkeypatch, container["args"], env)
        _check_started(seen, services, TaskId("ps_backup", index))
        assert seen["state_dir"] == "/var/lib/psflow/state"


def test_ps_replicas_in_a_jobset_and_a_cluster_file_that_disagrees(tmp_path: Path,
                                                                    jobset_validator: Any) -> None:
    out = _render(tmp_path, "--jobset", "--name", "ctr", "--ps-replicas", "2", "--", "--train", "/data/t",
                  cluster=CLUSTERS["chief"])
    [jobset] = [d for d in yaml.safe_load_all((out / "jobset.yaml").read_text()) if d is not None]
    _validate_jobset(jobset_validator, jobset)
    replicated = {r["name"]: r for r in jobset["spec"]["replicatedJobs"]}
    assert replicated["ps-backup"]["template"]["spec"]["completions"] == 2  # 1 ps task x 2
    assert jobset["spec"]["successPolicy"]["targetReplicatedJobs"] == ["chief", "worker"]
    cluster = ClusterSpec.from_json((out / "cluster.json").read_text())
    assert cluster.task_address("ps_backup", 1) == "ctr-ps-backup-0-1.ctr.default.svc.cluster.local:2222"
    given = dict(CLUSTERS["chief"], ps_backup=["x:1"])
    with pytest.raises(RenderError, match=r"--ps-replicas 2: --cluster has 1 backup\(s\) per ps task already"):
        render_manifests(ClusterSpec(given), RenderConfig(name="ctr", image="psflow:1", ps_replicas=2))
    with pytest.raises(RenderError, match=r"--ps-replicas -1: want a whole number >= 0"):
        RenderConfig(name="ctr", image="psflow:1", ps_replicas=-1)
