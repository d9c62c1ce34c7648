"""Phase timer for benchmarks/step_phases.py: loaded by a psflow process whose PYTHONPATH starts here.

Does nothing unless ``PSFLOW_PHASE_TRACE_DIR`` is set; then wraps a few functions of the step's path with
``time.perf_counter`` and writes ``<pid>.json`` ({"argv": ..., "phases": {name: [seconds, ...]}}) into that
directory when the process exits normally. Timing only: no behaviour changes.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import time
from collections import defaultdict
from typing import Any

_PHASES: defaultdict[str, list[float]] = defaultdict(list)

#: (module, class, method, phase name): the worker's step and its parts, the ps task's handlers.
WRAPPED = [
    ("psflow.train.step", "TrainStep", "__call__", "worker: step"),
    ("psflow.train.step", "TrainStep", "compute_batch", "worker: compute"),
    ("psflow.ps.client", "ParameterClient", "push_pull", "worker: push_pull (plain)"),
    ("psflow.ps.push_calls", "PendingPushPull", "rows", "worker: wait for rows"),
    ("psflow.ps.push_calls", "PendingPushPull", "result", "worker: collect the reply (replicated: the acknowledgement)"),
    ("psflow.ps.service", "ParameterService", "push_pull", "ps: PushPull handler (plain)"),
    ("psflow.ps.replication.data_calls", "DataCalls", "push_pull", "ps: PushPull handler (replicated)"),
    ("psflow.ps.replication.data_calls", "DataCalls", "push_pull_ack_later", "ps: PushPullAckLater handler"),
    ("psflow.ps.replication.data_calls", "DataCalls", "acked", "ps: Acked handler"),
    ("psflow.ps.replication.forwarder", "BackupSender", "_send", "ps: Replicate call to the backup"),
]


def _wrap(owner: Any, method: str, phase: str) -> None:
    original = getattr(owner, method)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            _PHASES[phase].append(time.perf_counter() - start)

    setattr(owner, method, timed)


def _install(directory: str) -> None:
    import importlib

    for module, cls, method, phase in WRAPPED:
        try:
            owner = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError):
            continue  # an older psflow without this part
        if hasattr(owner, method):
            _wrap(owner, method, phase)

    @atexit.register
    def _write() -> None:
        if _PHASES:
            with open(os.path.join(directory, f"{os.getpid()}.json"), "w") as f:
                json.dump({"argv": sys.argv, "phases": _PHASES}, f)


if os.environ.get("PSFLOW_PHASE_TRACE_DIR"):
    _install(os.environ["PSFLOW_PHASE_TRACE_DIR"])
