"""psflow.deploy: ``psflow k8s render`` -- Kubernetes manifests for a psflow cluster.

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

With ``--ps-replicas N`` (replicated ps shards, :mod:`psflow.cluster.replicas`) the cluster gains the job
``ps_backup`` (``num_ps * N`` tasks), rendered as the ps job is (a StatefulSet ``<name>-ps-backup``, its
Services ``<name>-ps-backup-<i>``: Kubernetes names have no ``_``; in a JobSet, the replicated job
``ps-backup``); no TFJob then, whose operator would name that job after a replica type.

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
status page on 127.0.0.1 in its pod: ``kubectl port-forward``) and ``--restarted-by-manager`` (their pods are
restarted in place, ``restartPolicy: OnFailure``: a finished worker waits for a restarting chief rather than
take its duties over, :mod:`psflow.train.take_over`), then the
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

Classes and functions, by file:

* ``config.py`` -- :class:`~psflow.deploy.config.RenderConfig` (the flags, checked on construction),
  :class:`~psflow.deploy.config.Resources`, :class:`~psflow.deploy.config.RenderError`,
  :func:`~psflow.deploy.config.load_cluster`, :data:`~psflow.deploy.config.TASK_INDEX_ENV` and
  :func:`~psflow.deploy.config.task_index_from_env` (what ``psflow server`` reads of them).
* ``manifests.py`` -- :func:`~psflow.deploy.manifests.render_manifests` and
  :class:`~psflow.deploy.manifests.Manifests`: every object as a plain dict.
* ``files.py`` -- :func:`~psflow.deploy.files.write_manifests`: the YAML files, ``cluster.json`` and the
  README beside them.

The command's flags are :mod:`psflow.cli.k8s`. This package imports no gRPC and nothing of the training
code (the evaluator job's name is written here, not imported).
"""
