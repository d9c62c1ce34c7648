"""The evaluator task (psflow/launch/evaluator.py) on a ``--checkpoint-dir`` in a store that stops answering for
a while: an outage is transient, so the evaluator says so once, in a WARNING naming the directory, and goes on
polling; it ends on the run's final checkpoint once the store answers again, or on a stop.

Real processes: a finished run's checkpoints (``psflow train``, local) are put on moto's S3 server, which is
killed while the evaluator polls and started again on the same port. Before, the store's error
(``StoreUnreachableError``) escaped the evaluator's polling loop and the evaluator ended on it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from object_store_servers import _executable, _wait_answering, refuses_connections, run_s3
from support import A9A, A9A_T, in_fresh_process, run_cli, wait_until

from psflow.launch.evaluator import run_evaluator
from psflow.train.config import TrainConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def evaluate_through_an_outage(env: dict[str, str], store_pid: int, port: int, local: str, workdir: str
                               ) -> tuple[list[tuple[int, bool]], list[str], bool]:
    """In a fresh process (fsspec keeps one client per settings): puts ckpt-0 and ckpt-10 on the store, runs the
    evaluator in a thread, kills the store once step 10 is evaluated, starts it again on the same port once the
    evaluator met the outage, and puts the final ckpt-20 there. Returns the evaluations, the evaluator's WARNING
    lines, and whether the evaluator thread was still polling during the outage."""
    os.environ.update(env)
    import fsspec

    lines: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(f"{record.levelname} {record.getMessage()}")

    logging.getLogger("psflow.evaluator").addHandler(Lines())
    logging.getLogger("psflow.evaluator").setLevel(logging.INFO)
    fs = fsspec.filesystem("s3")

    def put(names: list[str]) -> None:
        fs.mkdir("psflow-eval")
        for name in names:
            fs.put(os.path.join(local, name), f"psflow-eval/ckpt/{name}", recursive=True)

    put(["ckpt-000000000", "ckpt-000000010"])  # no pointer: the newest complete one listed is ckpt-10
    config = TrainConfig.flat(train=(str(A9A),), eval=(str(A9A_T),), num_features=124,
                              checkpoint_dir="s3://psflow-eval/ckpt")
    stop = threading.Event()
    result: list[list[tuple[int, bool]]] = []
    thread = threading.Thread(target=lambda: result.append(
        [(e.global_step, e.final) for e in run_evaluator(config, poll_secs=0.05, stop=stop)]))
    thread.start()
    restarted: subprocess.Popen[bytes] | None = None
    try:
        wait_until(lambda: any("evaluator: step=10" in m for m in lines) or not thread.is_alive(),
                   "the evaluator evaluated ckpt-10")
        os.kill(store_pid, signal.SIGKILL)
        wait_until(lambda: refuses_connections(port), "the killed store refuses connections")
        wait_until(lambda: any(m.startswith("WARNING") and "s3://psflow-eval/ckpt" in m for m in lines)
                   or not thread.is_alive(), "the evaluator met the outage")
        stop.wait(1.0)  # twenty polls into the outage
        polling = thread.is_alive()
        exe = _executable("moto_server")
        assert exe is not None
        with open(os.path.join(workdir, "s3-again.log"), "wb") as log:
            restarted = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir)
        _wait_answering(f"http://127.0.0.1:{port}/", restarted, Path(workdir) / "s3-again.log")
        put(["ckpt-000000020"])  # moto kept nothing: the bucket anew, with the run's final checkpoint only
        thread.join(timeout=120)
    finally:
        stop.set()
        thread.join(timeout=30)
        if restarted is not None:
            os.kill(restarted.pid, signal.SIGKILL)
            restarted.wait(timeout=10)
    return (result[0] if result else []), [m for m in lines if m.startswith("WARNING")], polling


def test_an_evaluator_whose_store_stops_answering_warns_once_and_goes_on_polling(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    ckpt = tmp_path / "ckpt"
    r = run_cli("train", "--train", str(A9A), "--num-features", "124", "--ps", "1", "--workers", "1", "--quiet",
                "--max-steps", "20", "--save-checkpoints-steps", "10", "--full-checkpoint-every", "1",
                "--checkpoint-dir", str(ckpt), "--output", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr[-2000:]
    servers = run_s3(tmp_path_factory)  # a store of this test's own, to kill
    server = next(servers)
    try:
        done, warnings, polling = in_fresh_process(
            evaluate_through_an_outage, {**server.env, "AWS_MAX_ATTEMPTS": "1"}, server.pid, server.port, str(ckpt),
            str(tmp_path), limit=250)
    finally:
        servers.close()  # reaps the killed server
    assert polling, warnings
    outage = [m for m in warnings if "the store did not answer" in m]
    assert len(outage) == 1, warnings  # once, not at every poll
    assert "s3://psflow-eval/ckpt" in outage[0] and "polling" in outage[0], outage
    assert done == [(10, False), (20, True)], (done, warnings)
