"""The files ``psflow k8s render`` writes: the manifests as YAML, ``cluster.json`` and a ``README.md`` on how to
create the token Secret, apply, watch and clean up (:func:`write_manifests`). Nothing here writes a token.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any

from psflow.cluster import ClusterSpec
from psflow.deploy.config import EVALUATOR, JOB_INDEX_KEY, JOBSET_API, RenderConfig, RenderError
from psflow.deploy.manifests import Manifests

# PyYAML ships no type information (as in psflow.data.schema); one call, typed Any here.
yaml: Any = importlib.import_module("yaml")

__all__ = ["write_manifests"]

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
            "jobset.yaml": _yaml(f"# psflow {config.name} as a JobSet ({JOBSET_API}). {needs} "
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
        }
        if manifests.tfjob is not None:  # none with ps backups (--ps-replicas): see Manifests
            files["tfjob.yaml"] = _yaml(f"# psflow {config.name} as a Kubeflow TFJob, instead of cluster.yaml. {needs} "
                                        "kubectl apply -f tfjob.yaml\n", [manifests.tfjob])
        files["cluster.json"] = manifests.cluster.to_json() + "\n"
        files["README.md"] = _readme(manifests, config, ns)
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


def _apply_step(manifests: Manifests, ns: str) -> str:
    """Step 3 of the README: the plain manifests, or the TFJob (none with ps backups: a TFJob's operator names
    the jobs of ``TF_CONFIG`` after its replica types, and has none for ``ps_backup``)."""
    if manifests.tfjob is None:
        return f"""3. The plain manifests (Kubernetes >= 1.28; with ps backups, --ps-replicas, there is no TFJob: its
   operator would name the backups' job after a replica type, not ps_backup):

       kubectl {ns} apply -f cluster.yaml
"""
    return f"""3. Either the plain manifests (Kubernetes >= 1.28) or, with the Kubeflow training operator, the TFJob:

       kubectl {ns} apply -f cluster.yaml     # or: kubectl {ns} apply -f tfjob.yaml
"""


def _readme(manifests: Manifests, config: RenderConfig, ns: str) -> str:
    chief = manifests.cluster.chief()
    tasks = ", ".join(f"{j} x{manifests.cluster.num_tasks(j)}" for j in manifests.cluster.jobs)
    evaluator, jobs, tfjob_end = "", "worker Jobs", "a TFJob deletes them itself"
    if config.evaluator:
        evaluator = f"""
   The evaluator's log, a line per evaluated checkpoint (it completes after the final one):

       kubectl {ns} logs -f job/{config.name}-{EVALUATOR}
       kubectl {ns} logs -f pod/{config.name}-{EVALUATOR}-0   # the TFJob's pod
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

{_apply_step(manifests, ns)}
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

       kubectl {ns} logs -f job/{config.name}-{EVALUATOR}-0
"""
    selector = (f"app.kubernetes.io/instance={config.name},app.kubernetes.io/component={chief.job},"
                f"{JOB_INDEX_KEY}={chief.index}")
    return f"""# psflow cluster {config.name} as a JobSet (namespace {config.namespace})

Rendered by `psflow k8s render --jobset`. Tasks: {tasks}. Needs Kubernetes >= 1.28 and the JobSet
controller ({JOBSET_API}).

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
