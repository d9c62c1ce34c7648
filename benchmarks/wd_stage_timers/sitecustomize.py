"""Stage timers inside a W&D worker process of ``psflow train`` (benchmarks/profile_wd_worker.py puts this folder
on the tasks' ``PYTHONPATH`` and sets ``PSFLOW_STAGE_TIMERS`` to a folder; a process without it is untouched).

A worker task (``python -m psflow.launch.task ... --job worker``) wraps the functions of its step with thread-CPU
and wall timers (``time.thread_time``, ``time.perf_counter``; ~1 us a call, against a step of several ms) before
its module runs, snapshots the timers and its threads' CPU (``/proc/self/task/*/stat``) at its 20th step and
every 10th after it, and writes them as JSON (``worker-<pid>.json``) when it exits. Stages nest: ``compute``
holds ``compute.forward``; ``send`` holds ``send.encode``. Nothing here changes what the step does.
"""

from __future__ import annotations

import os
import sys

_OUT = os.environ.get("PSFLOW_STAGE_TIMERS")
if _OUT and "--job" in sys.argv and "worker" in sys.argv:
    import atexit
    import json
    import runpy
    import time
    from collections.abc import Callable
    from typing import Any

    _acc: dict[str, list[float]] = {}  # stage -> [thread CPU s, wall s, calls]
    _state: dict[str, Any] = {"runs": 0, "first": None, "last": None}

    def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            cpu, wall = time.thread_time(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                entry = _acc.setdefault(name, [0.0, 0.0, 0])
                entry[0] += time.thread_time() - cpu
                entry[1] += time.perf_counter() - wall
                entry[2] += 1
        return timed

    def _patch(owner: Any, attr: str, name: str) -> None:
        setattr(owner, attr, _timed(name, getattr(owner, attr)))

    def _threads() -> dict[str, tuple[str, float]]:
        tick = os.sysconf("SC_CLK_TCK")
        out = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            out[tid] = (stat[stat.index("(") + 1:stat.rindex(")")], (int(fields[11]) + int(fields[12])) / tick)
        return out

    def _install() -> None:
        import torch

        from psflow.data import dataset, readers
        from psflow.ps import client, plans, push_calls
        from psflow.rpc import tcp
        from psflow.torch import ctr, model
        from psflow.train import session, step

        run = session.MonitoredTrainingSession.run

        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return run(self, *args, **kwargs)
            finally:
                _state["runs"] += 1
                n = _state["runs"]
                if n >= 20 and n % 10 == 0:
                    snap = [n, time.process_time(), time.perf_counter(), _threads(),
                            {k: list(v) for k, v in _acc.items()}]
                    _state["first"] = _state["first"] or snap
                    _state["last"] = snap

        session.MonitoredTrainingSession.run = _timed("session.run", counted)  # type: ignore[method-assign]
        for owner, attr, name in [
            (session.MonitoredTrainingSession, "_after", "session.hooks_after"),
            (step.TrainStep, "__call__", "step"), (step.TrainStep, "prepare_lookups", "step.lookups"),
            (step, "check_gradients", "step.check_gradients"), (step.TrainStep, "result_of", "step.result_of"),
            (model.TorchModel, "compute", "compute"), (model.TorchModel, "_inputs", "compute.inputs"),
            (ctr._CtrNet, "forward", "compute.forward"), (model.TorchModel, "loss", "compute.loss"),
            (torch.Tensor, "backward", "compute.backward"), (model.TorchModel, "outputs", "compute.outputs"),
            (client.ParameterClient, "send_push_pull", "send"), (client.ParameterClient, "_pull_plan", "send.plan_pull"),
            (client.ParameterClient, "_push_requests", "send.plan_push"), (client, "push_pull_calls", "send.calls"),
            (tcp, "encode_parts", "send.encode"), (tcp, "send_parts", "send.sendmsg"),
            (push_calls.PendingPushPull, "result", "finish"), (tcp, "recv_exact", "finish.recv"),
            (tcp, "decode", "finish.decode"), (client, "push_pull_replies", "finish.replies"),
            (plans.Planner, "assemble", "finish.assemble"), (dataset.Dataset, "__next__", "next_batch"),
            (model.TorchModel, "prepare", "data.prepare"), (readers, "parse_criteo", "data.parse"),
        ]:
            _patch(owner, attr, name)

    def _dump() -> None:
        with open(os.path.join(_OUT, f"worker-{os.getpid()}.json"), "w") as f:
            json.dump({"argv": sys.argv, "runs": _state["runs"], "first": _state["first"], "last": _state["last"]}, f)

    atexit.register(_dump)
    _run_module = runpy._run_module_as_main  # type: ignore[attr-defined]

    def _run_with_timers(*args: Any, **kwargs: Any) -> Any:
        _install()
        return _run_module(*args, **kwargs)

    runpy._run_module_as_main = _run_with_timers  # type: ignore[attr-defined]
