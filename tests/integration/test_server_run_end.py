"""ps tasks of ``psflow server`` exit 0 once the run is over; ``psflow shutdown`` stops a cluster started by
hand, and refuses to without the cluster token (issue 25, item 10).

Real ``psflow server`` processes on 127.0.0.1 (free ports); each one this module starts is killed by pid
at the end if it still runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import A9A, REPO, TOKEN, run_bounded, wait_until

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.cluster import ClusterSpec
from psflow.launch.ports import free_ports
from psflow.launch.supervisor import STATE_LOST_EXIT_CODE
from psflow.optim import OptimizerSpec
from psflow.ps.protocol import PromoteRequest, ReplicaStatusReply, ReplicaStatusRequest
from psflow.rpc.api import PARAMETER_SERVICE, ConnectConfig, RpcError
from psflow.rpc.grpc_client import TaskChannel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

_SAFETY = 150.0  # s: a safety net for a passing run, never reached by one


def _env(token: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PSFLOW_TOKEN", "TF_CONFIG")}
    env["PYTHONUNBUFFERED"] = "1"
    if token is not None:
        env["PSFLOW_TOKEN"] = token
    return env


class _Tasks:
    """``psflow server`` processes of one test, started from ``cluster.json`` in ``workdir``."""

    def __init__(self, workdir: Path, cluster: ClusterSpec) -> None:
        self.workdir, self.cluster = workdir, cluster
        self.file = workdir / "cluster.json"
        self.file.write_text(cluster.to_json())
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, job: str, index: int, *flags: str) -> subprocess.Popen[bytes]:
        name = f"{job}-{index}"
        with open(self.workdir / f"{name}.log", "wb") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "psflow", "server", "--cluster", str(self.file), "--job", job,
                 "--task", str(index), *flags],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(REPO), env=_env(TOKEN))
        return self.procs[name]

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")

    def wait_serving(self, index: int) -> None:
        name, proc = f"ps-{index}", self.procs[f"ps-{index}"]
        line = f"/job:ps/task:{index}: serving at {self.cluster.task_address('ps', index)} (pid {proc.pid})"

        def serving() -> bool:
            assert proc.poll() is None, f"{name} exited ({proc.returncode}):\n{self.log(name)[-3000:]}"
            return line in self.log(name)

        wait_until(serving, f"{name} serving", limit=_SAFETY)

    def exit_code(self, name: str, limit: float = _SAFETY) -> int:
        try:
            return self.procs[name].wait(timeout=limit)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} still running after {limit} s:\n{self.log(name)[-3000:]}") from None

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)


@pytest.fixture
def tasks(tmp_path: Path) -> Iterator[Callable[[ClusterSpec], _Tasks]]:
    made: list[_Tasks] = []

    def make(cluster: ClusterSpec) -> _Tasks:
        made.append(_Tasks(tmp_path, cluster))
        return made[-1]

    try:
        yield make
    finally:
        for t in made:
            t.kill_all()


def _cluster(num_ps: int, num_workers: int) -> ClusterSpec:
    ports = free_ports(num_ps + num_workers)
    return ClusterSpec({"ps": [f"127.0.0.1:{p}" for p in ports[:num_ps]],
                        "worker": [f"127.0.0.1:{p}" for p in ports[num_ps:]]})


def _shutdown(cluster_file: Path, *flags: str, token: str | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "psflow", "shutdown", "--cluster", str(cluster_file), *flags],
                          capture_output=True, text=True, env=_env(token), cwd=str(REPO), stdin=subprocess.DEVNULL,
                          timeout=_SAFETY)


def _outcomes(stdout: str) -> dict[str, str]:
    """``/job:ps/task:N`` -> its outcome, from psflow shutdown's lines ``TASK (ADDRESS): OUTCOME``."""
    out = {}
    for line in stdout.splitlines():
        head, _, outcome = line.partition("): ")
        out[head.split(" (")[0]] = outcome
    return out


def test_every_task_of_a_psflow_server_cluster_exits_0_after_training(
        tasks: Callable[[ClusterSpec], _Tasks], tmp_path: Path) -> None:
    cluster = tasks(_cluster(2, 2))
    ckpt = tmp_path / "ckpt"
    train = ["--train", str(A9A), "--num-features", "124", "--epochs", "1", "--batch-size", "1024", "--no-status",
             "--checkpoint-dir", str(ckpt), "--save-checkpoints-steps", "10", "--log-every", "10"]
    for i in range(2):
        cluster.start("ps", i, "--checkpoint-dir", str(ckpt))
    for i in range(2):
        cluster.start("worker", i, *train)
    for name in ("worker-0", "worker-1", "ps-0", "ps-1"):
        assert cluster.exit_code(name) == 0, f"{name}:\n{cluster.log(name)[-3000:]}"
    final = latest_checkpoint(str(ckpt))
    assert final is not None and read_manifest(final).final
    for i in range(2):
        line = (f"/job:ps/task:{i}: run over (workers 0-1 finished, final checkpoint {os.path.basename(final)} "
                f"written): exiting")
        assert line in cluster.log(f"ps-{i}"), cluster.log(f"ps-{i}")[-3000:]


def test_psflow_shutdown_stops_a_hand_started_cluster_and_refuses_without_the_token(
        tasks: Callable[[ClusterSpec], _Tasks]) -> None:
    cluster = tasks(_cluster(2, 1))  # its worker never starts: the ps tasks would serve for ever
    for i in range(2):
        cluster.start("ps", i)
    for i in range(2):
        cluster.wait_serving(i)
    ps = ["/job:ps/task:0", "/job:ps/task:1"]
    for flags, token in ((["--insecure"], None), ([], "not-the-token")):
        refused = _shutdown(cluster.file, *flags, "--timeout", "30", token=token)
        assert refused.returncode == 1, refused
        outcomes = _outcomes(refused.stdout)
        assert list(outcomes) == ps and all(o.startswith("refused (unauthenticated: ")
                                            for o in outcomes.values()), refused.stdout
        assert "0 of 2 ps tasks stopped" in refused.stderr
    assert all(p.poll() is None for p in cluster.procs.values())  # still serving
    done = _shutdown(cluster.file, "--timeout", "30", token=TOKEN)
    assert done.returncode == 0, done
    assert _outcomes(done.stdout) == dict.fromkeys(ps, "stopped"), done.stdout
    assert cluster.exit_code("ps-0") == 0 and cluster.exit_code("ps-1") == 0
    again = _shutdown(cluster.file, "--timeout", "1", token=TOKEN)
    assert again.returncode == 1 and all(o.startswith("unreachable (") for o in _outcomes(again.stdout).values())


def test_keep_serving_keeps_a_ps_task_after_the_run_until_psflow_shutdown(
        tasks: Callable[[ClusterSpec], _Tasks]) -> None:
    cluster = tasks(_cluster(2, 1))
    cluster.start("ps", 0)
    cluster.start("ps", 1, "--keep-serving")
    for i in range(2):
        cluster.wait_serving(i)
    # What worker 0 sends when its session has ended (psflow.train.worker): both tasks hear the run is over.
    config = ConnectConfig(token=TOKEN, connect_timeout=_SAFETY, rpc_timeout=30)
    ps1 = TaskChannel("/job:ps/task:1", cluster.cluster.task_address("ps", 1), PARAMETER_SERVICE, config)
    try:
        for i in range(2):
            ch = ps1 if i == 1 else TaskChannel("/job:ps/task:0", cluster.cluster.task_address("ps", 0),
                                                PARAMETER_SERVICE, config)
            reply = ch.call("Done", {"worker": "/job:worker/task:0", "incarnation": 1, "checkpoint_dir": False})
            assert reply.meta == {"ok": True, "run_over": True}
            if i == 0:
                ch.close()
        assert cluster.exit_code("ps-0") == 0
        assert ("/job:ps/task:0: run over (worker 0 finished, no checkpoint directory): exiting"
                in cluster.log("ps-0")), cluster.log("ps-0")
        assert ps1.call("Stats").meta["run_end"] == {"workers_done": ["/job:worker/task:0"], "workers_expected": 1,
                                                     "run_over": True}
    finally:
        ps1.close()
    assert cluster.procs["ps-1"].poll() is None and "run over" not in cluster.log("ps-1")
    result = _shutdown(cluster.file, "--timeout", "5", token=TOKEN)
    assert result.returncode == 1, result
    outcomes = _outcomes(result.stdout)
    assert outcomes["/job:ps/task:1"] == "stopped" and outcomes["/job:ps/task:0"].startswith("unreachable ("), outcomes
    assert "1 of 2 ps tasks stopped" in result.stderr
    assert cluster.exit_code("ps-1") == 0


def test_a_worker_restarted_after_its_done_must_finish_again(tasks: Callable[[ClusterSpec], _Tasks]) -> None:
    """What the workers send, by hand: worker 0 finishes, is restarted (its new process registers), worker 1
    finishes: the ps task keeps serving until worker 0's new process is done too."""
    cluster = tasks(_cluster(1, 2))
    cluster.start("ps", 0)
    cluster.wait_serving(0)
    ch = TaskChannel("/job:ps/task:0", cluster.cluster.task_address("ps", 0), PARAMETER_SERVICE,
                     ConnectConfig(token=TOKEN, connect_timeout=_SAFETY, rpc_timeout=30))
    w0, w1 = "/job:worker/task:0", "/job:worker/task:1"
    try:
        assert ch.call("Done", {"worker": w0, "incarnation": 1}).meta["run_over"] is False
        joined = ch.call("Register", {"layout": [], "optimizer": OptimizerSpec("sgd", {"learning_rate": 0.1}).to_json(),
                                      "client": w0, "chief": False})
        assert joined.meta["ready"] is False  # no chief yet: it would wait for one
        assert ch.call("Done", {"worker": w1, "incarnation": 1}).meta["run_over"] is False
        assert ch.call("Stats").meta["run_end"]["workers_done"] == [w1]
        assert cluster.procs["ps-0"].poll() is None
        assert ch.call("Done", {"worker": w0, "incarnation": 2}).meta["run_over"] is True
    finally:
        ch.close()
    assert cluster.exit_code("ps-0") == 0
    assert "/job:ps/task:0: run over (workers 0-1 finished, no checkpoint directory): exiting" in cluster.log("ps-0")


def test_shutdown_without_a_token_or_a_cluster_file_is_one_line(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "psflow", "shutdown", "--cluster", str(tmp_path / "missing.json")]
    no_token = run_bounded(cmd, timeout=_SAFETY, env=_env(None))
    assert no_token.returncode == 1 and len(no_token.stderr.strip().splitlines()) == 1, no_token
    assert "PSFLOW_TOKEN" in no_token.stderr and "--insecure" in no_token.stderr
    no_file = run_bounded(cmd, timeout=_SAFETY, env=_env(TOKEN))
    assert no_file.returncode == 1 and len(no_file.stderr.strip().splitlines()) == 1, no_file
    assert "missing.json" in no_file.stderr


def _global_step(ch: TaskChannel) -> int:
    try:
        return int(ch.call("Stats").meta.get("global_step") or 0)
    except RpcError:
        return 0


def _wait_for_step(cluster: _Tasks, step: int) -> None:
    """Waits (at most _SAFETY s) until ps task 0's global_step reached ``step``."""
    ps0 = _channel(cluster, "ps", 0)
    try:
        wait_until(lambda: _global_step(ps0) >= step, f"training reached step {step}", limit=_SAFETY)
    finally:
        ps0.close()


def test_psflow_server_workers_exit_3_when_a_ps_task_comes_back_empty(
        tasks: Callable[[ClusterSpec], _Tasks], tmp_path: Path) -> None:
    """A cluster run by hand without --checkpoint-dir: ps task 1 killed and started again (empty). The workers
    stop with the state-lost line and exit 3, as docs/deploying.md says (STATE_LOST_EXIT_CODE, which no restart
    policy restarts), not 1 as any other error."""
    cluster = tasks(_cluster(2, 2))
    train = ["--train", str(A9A), "--num-features", "124", "--epochs", "5", "--batch-size", "32", "--no-status",
             "--summary-dir", str(tmp_path / "summaries"), "--log-every", "50"]  # summaries: the chief has duties
    for i in range(2):
        cluster.start("ps", i)
    for i in range(2):
        cluster.start("worker", i, *train)
    _wait_for_step(cluster, 200)
    os.kill(cluster.procs["ps-1"].pid, signal.SIGKILL)
    cluster.procs["ps-1"].wait(timeout=30)
    cluster.start("ps", 1)  # back at its address, empty
    line = ("/job:ps/task:1 restarted with no checkpoint to restore from (the run has no --checkpoint-dir): its "
            "variables (bias) would be fresh beside trained ones on /job:ps/task:0; rerun with --checkpoint-dir")
    for i in range(2):
        code = cluster.exit_code(f"worker-{i}")
        assert code == STATE_LOST_EXIT_CODE, f"worker-{i} exited {code}:\n{cluster.log(f'worker-{i}')[-3000:]}"
        assert f"psflow server: error: {line}" in cluster.log(f"worker-{i}"), cluster.log(f"worker-{i}")[-3000:]


def test_the_ps_tasks_of_an_in_graph_run_exit_0_once_the_client_is_done(
        tasks: Callable[[ClusterSpec], _Tasks], tmp_path: Path) -> None:
    """``--replication in-graph`` by hand: the client is the chief and the only reader; once its session ended
    (the final checkpoint written) it tells every ps task that the cluster's workers are done, as between-graph
    workers do each for themselves. Before, no ``Done`` came and the ps tasks served for ever."""
    ports = free_ports(5)
    cluster = tasks(ClusterSpec({"ps": [f"127.0.0.1:{p}" for p in ports[:2]],
                                 "worker": [f"127.0.0.1:{p}" for p in ports[2:4]],
                                 "client": [f"127.0.0.1:{ports[4]}"]}))
    ckpt = tmp_path / "ckpt"
    train = ["--train", str(A9A), "--num-features", "124", "--epochs", "1", "--batch-size", "1024", "--no-status",
             "--replication", "in-graph", "--checkpoint-dir", str(ckpt), "--save-checkpoints-steps", "10"]
    for i in range(2):
        cluster.start("ps", i, "--checkpoint-dir", str(ckpt))
    for i in range(2):
        cluster.start("worker", i, *train)
    cluster.start("client", 0, *train)
    assert cluster.exit_code("client-0") == 0, cluster.log("client-0")[-3000:]
    final = latest_checkpoint(str(ckpt))
    assert final is not None and read_manifest(final).final
    for i in range(2):
        try:
            code = cluster.procs[f"ps-{i}"].wait(timeout=60)  # Done is sent as the client ends: seconds, not minutes
        except subprocess.TimeoutExpired:
            raise AssertionError(f"ps-{i} still serving 60 s after the in-graph client ended:\n"
                                 f"{cluster.log(f'ps-{i}')[-3000:]}") from None
        assert code == 0, cluster.log(f"ps-{i}")[-3000:]
        line = (f"/job:ps/task:{i}: run over (workers 0-1 finished, final checkpoint {os.path.basename(final)} "
                f"written): exiting")
        assert line in cluster.log(f"ps-{i}"), cluster.log(f"ps-{i}")[-3000:]


def test_the_backups_of_a_replicated_hand_started_cluster_exit_0_after_training(
        tasks: Callable[[ClusterSpec], _Tasks], tmp_path: Path) -> None:
    """A cluster file with a ps_backup job (--ps-replicas by hand): every task exits by itself once the run is
    over, the backups too (they never hear the workers' Done: the shard's primary, which does, stops them).
    Before, both ps_backup tasks served for ever, and psflow shutdown did not name them."""
    ports = free_ports(6)
    cluster = tasks(ClusterSpec({"ps": [f"127.0.0.1:{p}" for p in ports[:2]],
                                 "ps_backup": [f"127.0.0.1:{p}" for p in ports[2:4]],
                                 "worker": [f"127.0.0.1:{p}" for p in ports[4:]]}))
    ckpt = tmp_path / "ckpt"
    train = ["--train", str(A9A), "--num-features", "124", "--epochs", "1", "--batch-size", "1024", "--no-status",
             "--checkpoint-dir", str(ckpt), "--log-every", "10"]
    for job in ("ps", "ps_backup"):
        for i in range(2):
            cluster.start(job, i, "--checkpoint-dir", str(ckpt))
    for i in range(2):
        cluster.start("worker", i, *train)
    for name in ("worker-0", "worker-1", "ps-0", "ps-1"):
        assert cluster.exit_code(name) == 0, f"{name}:\n{cluster.log(name)[-3000:]}"
    for name in ("ps_backup-0", "ps_backup-1"):  # stopped as their primaries exit: 30 s is far more than enough
        assert cluster.exit_code(name, limit=30.0) == 0, f"{name}:\n{cluster.log(name)[-3000:]}"
    for i in range(2):
        assert f"/job:ps_backup/task:{i}: stopped by /job:ps/task:{i}, its shard's primary: the run is over" in \
            cluster.log(f"ps_backup-{i}"), cluster.log(f"ps_backup-{i}")[-3000:]


def test_psflow_shutdown_stops_the_backups_of_a_replicated_cluster_too(tasks: Callable[[ClusterSpec], _Tasks]) -> None:
    """A failed run leaves its ps tasks serving; with a ps_backup job its backups too, which psflow shutdown
    left running (it asked the ps job alone and said every task stopped)."""
    ports = free_ports(5)
    cluster = tasks(ClusterSpec({"ps": [f"127.0.0.1:{p}" for p in ports[:2]],
                                 "ps_backup": [f"127.0.0.1:{p}" for p in ports[2:4]], "worker": [f"127.0.0.1:{ports[4]}"]}))
    for job in ("ps", "ps_backup"):
        for i in range(2):
            cluster.start(job, i)
    for i in range(2):
        cluster.wait_serving(i)
    done = _shutdown(cluster.file, "--timeout", "30", token=TOKEN)
    members = ["/job:ps/task:0", "/job:ps/task:1", "/job:ps_backup/task:0", "/job:ps_backup/task:1"]
    assert _outcomes(done.stdout) == dict.fromkeys(members, "stopped"), done
    assert done.returncode == 0, done
    for name in ("ps-0", "ps-1", "ps_backup-0", "ps_backup-1"):
        assert cluster.exit_code(name, limit=30.0) == 0, f"{name}:\n{cluster.log(name)[-3000:]}"


def _replicated_shard(tasks: Callable[[ClusterSpec], _Tasks], workers: int, *backup_flags: str) -> _Tasks:
    """ps task 0 and its backup (``psflow server``; ``backup_flags`` its own), serving: the backup holds the
    shard (it joined the view from the primary's snapshot)."""
    ports = free_ports(2 + workers)
    cluster = tasks(ClusterSpec({"ps": [f"127.0.0.1:{ports[0]}"], "ps_backup": [f"127.0.0.1:{ports[1]}"],
                                 "worker": [f"127.0.0.1:{p}" for p in ports[2:]]}))
    cluster.start("ps", 0)
    cluster.start("ps_backup", 0, *backup_flags)
    cluster.wait_serving(0)
    backup = _channel(cluster, "ps_backup", 0)

    def holds_the_shard() -> bool:
        assert cluster.procs["ps_backup-0"].poll() is None, cluster.log("ps_backup-0")[-3000:]
        try:
            return ReplicaStatusReply.from_frame(backup.call(ReplicaStatusRequest.METHOD, {})).has_state
        except RpcError:  # not serving yet
            return False

    try:
        wait_until(holds_the_shard, "the backup holding the shard", limit=_SAFETY)
    finally:
        backup.close()
    return cluster


def _channel(cluster: _Tasks, job: str, index: int) -> TaskChannel:
    config = ConnectConfig(token=TOKEN, connect_timeout=_SAFETY, rpc_timeout=30)
    return TaskChannel(f"/job:{job}/task:{index}", cluster.cluster.task_address(job, index), PARAMETER_SERVICE, config)


def _done(channel: TaskChannel, worker: int) -> bool:
    """What worker ``worker`` sends when its session has ended (psflow.train.worker); whether the run is over."""
    return bool(channel.call("Done", {"worker": f"/job:worker/task:{worker}", "incarnation": 1,
                                      "checkpoint_dir": False}).meta["run_over"])


def test_a_backup_promoted_after_a_worker_finished_ends_the_run_when_the_others_do(
        tasks: Callable[[ClusterSpec], _Tasks]) -> None:
    """Worker 0 finished, then shard 0's primary died and its backup was promoted: the backup never heard
    worker 0's Done (not replicated), so once worker 1 finished too it still waited for worker 0, serving for
    ever, its Stats naming worker 1 alone done."""
    cluster = _replicated_shard(tasks, 2)
    primary, backup = _channel(cluster, "ps", 0), _channel(cluster, "ps_backup", 0)
    try:
        assert _done(primary, 0) is False
        cluster.procs["ps-0"].kill()  # SIGKILL: it stops nothing, tells no one
        cluster.procs["ps-0"].wait(timeout=_SAFETY)
        # What worker 1's client does when its push finds the primary gone (psflow.ps.failover)
        backup.call(PromoteRequest.METHOD, PromoteRequest(0, 1, "/job:worker/task:1").to_frame().meta)
        assert backup.call("Stats").meta["run_end"]["workers_done"] == ["/job:worker/task:0"]
        assert _done(backup, 1) is True
    finally:
        primary.close()
        backup.close()
    assert cluster.exit_code("ps_backup-0") == 0
    log = cluster.log("ps_backup-0")
    assert "/job:ps_backup/task:0: run over (workers 0-1 finished, no checkpoint directory): exiting" in log, log
    # The primary it was promoted over is gone: not "it serves until stopped" (a false warning)
    assert "/job:ps_backup/task:0: /job:ps/task:0, a member of its shard, is not running (" in log, log
    assert "could not stop" not in log, log


def test_a_backup_started_with_keep_serving_serves_on_after_the_run(tasks: Callable[[ClusterSpec], _Tasks]) -> None:
    """--keep-serving on a backup: its primary's Shutdown at the run's end stopped it anyway. It now serves on,
    holding the workers' Done (the primary stopped its backups once they held the last one), until psflow
    shutdown stops it."""
    cluster = _replicated_shard(tasks, 1, "--keep-serving")
    primary, backup = _channel(cluster, "ps", 0), _channel(cluster, "ps_backup", 0)
    try:
        assert _done(primary, 0) is True
        assert cluster.exit_code("ps-0") == 0
        told = "serving on until stopped"
        wait_until(lambda: told in cluster.log("ps_backup-0") or cluster.procs["ps_backup-0"].poll() is not None,
                   "the backup told the run is over", limit=_SAFETY)
        assert cluster.procs["ps_backup-0"].poll() is None, cluster.log("ps_backup-0")[-3000:]
        assert backup.call("Stats").meta["run_end"] == {"workers_done": ["/job:worker/task:0"], "workers_expected": 1,
                                                        "run_over": True}
    finally:
        primary.close()
        backup.close()
    assert "WARNING" not in cluster.log("ps-0"), cluster.log("ps-0")
    result = _shutdown(cluster.file, "--timeout", "5", token=TOKEN)
    assert _outcomes(result.stdout)["/job:ps_backup/task:0"] == "stopped", result
    assert cluster.exit_code("ps_backup-0") == 0


def test_a_backup_promoted_after_a_finished_worker_registered_again_waits_for_its_new_process(
        tasks: Callable[[ClusterSpec], _Tasks]) -> None:
    """Worker 0 finished, was restarted (its new process registered: its Done no longer counts), then shard 0's
    primary died before recording anything else: the promoted backup still counted the old Done (a Register that
    creates nothing recorded no entry), so worker 1's Done ended the run while worker 0's new process trained."""
    cluster = _replicated_shard(tasks, 2)
    primary, backup = _channel(cluster, "ps", 0), _channel(cluster, "ps_backup", 0)
    w0 = "/job:worker/task:0"
    try:
        assert _done(primary, 0) is False
        primary.call("Register", {"layout": [], "optimizer": OptimizerSpec("sgd", {"learning_rate": 0.1}).to_json(),
                                  "client": w0, "chief": False})
        assert primary.call("Stats").meta["run_end"]["workers_done"] == []
        cluster.procs["ps-0"].kill()  # SIGKILL: it records nothing more
        cluster.procs["ps-0"].wait(timeout=_SAFETY)
        backup.call(PromoteRequest.METHOD, PromoteRequest(0, 1, "/job:worker/task:1").to_frame().meta)
        assert backup.call("Stats").meta["run_end"]["workers_done"] == []
        assert _done(backup, 1) is False
        assert cluster.procs["ps_backup-0"].poll() is None, cluster.log("ps_backup-0")[-3000:]
        assert backup.call("Done", {"worker": w0, "incarnation": 2, "checkpoint_dir": False}).meta["run_over"] is True
    finally:
        primary.close()
        backup.close()
    assert cluster.exit_code("ps_backup-0") == 0
