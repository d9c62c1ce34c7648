"""``psflow k8s render``: its flags (:func:`add_k8s_parser`), read into a
:class:`~psflow.deploy.config.RenderConfig` (:func:`render_config`), and the command (:func:`run_k8s`): the
training arguments after ``--`` checked as ``psflow server`` parses them and as ``psflow train`` checks its
settings, then the manifests rendered and written (:func:`render_command`, :mod:`psflow.deploy`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn

from psflow.cli.parser import CommandParser
from psflow.cli.server import add_server_arguments
from psflow.cli.training import train_config
from psflow.cluster import ClusterSpec
from psflow.deploy.config import DEFAULT_NAME, RenderConfig, RenderError, Resources, load_cluster
from psflow.deploy.files import write_manifests
from psflow.deploy.manifests import render_manifests
from psflow.models.api import ModelError
from psflow.models.registry import model_class, model_names
from psflow.optim import OptimizerError
from psflow.optim.schedules import ScheduleError
from psflow.ps.dynamic import DynamicTableError
from psflow.train.config import ConfigError

__all__ = ["add_k8s_parser", "render_config", "render_command", "run_k8s"]

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
    p.add_argument("--ps-replicas", type=int, default=0, metavar="N",
                   help="N backups of every ps shard (job ps_backup, a StatefulSet <name>-ps-backup; no tfjob.yaml: "
                        "a TFJob cannot name that job) (%(default)s)")
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
        evaluator=args.evaluator, evaluator_resources=evaluator_resources, jobset=args.jobset,
        ps_replicas=args.ps_replicas)


def render_command(args: argparse.Namespace, *, check_training: Callable[[ClusterSpec], None] | None = None) -> int:
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


class _TrainingArgsParser(CommandParser):
    """``psflow server``'s flags, checked for ``psflow k8s render``: an error raises ConfigError (one line)."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"the training arguments after --: {message}")


def run_k8s(args: argparse.Namespace) -> int:
    """``psflow k8s render``: checks the training arguments as ``psflow server`` will parse them, and their
    settings as ``psflow train`` checks them (:func:`_check_k8s_training`), then renders."""
    check = _TrainingArgsParser(prog="psflow server", add_help=False)
    add_server_arguments(check)
    given = check.parse_args(args.train_args)
    for flag in ("cluster", "job", "task", "bind_host"):
        if getattr(given, flag) is not None:
            raise ConfigError(f"the training arguments after --: --{flag.replace('_', '-')}: the manifests set it "
                              "for each task")
    given.command = "server"
    return render_command(args, check_training=lambda cluster: _check_k8s_training(given, cluster))


def _check_k8s_training(given: argparse.Namespace, cluster: ClusterSpec) -> None:
    """The training settings of ``psflow k8s render`` checked as ``psflow train`` checks its own, for
    ``cluster``'s tasks: ranges and combinations, the optimizer and schedule, the model's own flags, a
    built-in model's name. Nothing is read: the paths are the pods' (a schema inferred from the first
    training file, ``--schema``, a user's model module in the image), and no device is looked for.

    Raises:
        ConfigError: the first setting refused, after ``the training arguments after --: ``.
    """
    try:
        if not given.train:
            raise ConfigError("--train is required: the chief and the workers train on it (e.g. --train /data/...)")
        trainers = sum(cluster.num_tasks(j) for j in ("chief", "worker") if j in cluster.jobs)
        config = train_config(given, num_ps=cluster.num_tasks("ps"), num_workers=trainers)
        if ":" not in config.model.name and config.model.name not in model_names():
            model_class(config.model.name)  # refuses the unknown name, naming the known ones (imports nothing)
    except (ConfigError, ModelError, OptimizerError, ScheduleError, DynamicTableError) as e:
        raise ConfigError(f"the training arguments after --: {e}") from None
