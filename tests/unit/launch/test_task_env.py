"""The environment the local launcher gives each task process (psflow.launch.processes.task_env)."""

from __future__ import annotations

from psflow.launch.console import GRPC_VERBOSITY_ENV
from psflow.launch.processes import task_env
from psflow.launch.task import TOKEN_ENV
from psflow.train.config import TORCH_THREADS_ENV


def test_each_task_gets_its_share_of_the_cores_for_pytorch_and_openblas() -> None:
    env = task_env({"PATH": "/bin"}, token="t0k", workers=2, cpus=2, verbose=False)
    assert env[TORCH_THREADS_ENV] == "1" and env["OPENBLAS_NUM_THREADS"] == "1"
    assert env[TOKEN_ENV] == "t0k" and env["PYTHONUNBUFFERED"] == "1" and env["PATH"] == "/bin"
    assert env[GRPC_VERBOSITY_ENV] == "NONE"
    env = task_env({}, token="t", workers=3, cpus=16, verbose=True)
    assert env[TORCH_THREADS_ENV] == env["OPENBLAS_NUM_THREADS"] == "5" and GRPC_VERBOSITY_ENV not in env
    assert task_env({}, token="t", workers=0, cpus=1, verbose=False)["OPENBLAS_NUM_THREADS"] == "1"


def test_a_thread_count_the_user_set_wins() -> None:
    env = task_env({"OPENBLAS_NUM_THREADS": "4", TORCH_THREADS_ENV: "3"}, token="t", workers=2, cpus=2, verbose=False)
    assert env["OPENBLAS_NUM_THREADS"] == "4" and env[TORCH_THREADS_ENV] == "3"
    # OMP_NUM_THREADS is OpenBLAS's fallback setting: set, it is left to decide.
    assert "OPENBLAS_NUM_THREADS" not in task_env({"OMP_NUM_THREADS": "2"}, token="t", workers=2, cpus=2, verbose=False)


def test_the_launcher_environment_is_not_changed() -> None:
    base = {"PATH": "/bin"}
    task_env(base, token="t", workers=2, cpus=2, verbose=False)
    assert base == {"PATH": "/bin"}
