"""Bad input gets one clear line and exit status 1: no traceback, no gRPC C-core log line (issue 16).

Each case is a row of the README's "When something is wrong" table: the
command, and the line it must print. Most are refused before any process
starts; two are found by a worker (past the launcher's pre-check), and the
launcher's failure report then shows the worker's one line. Nothing here
depends on machine speed: every run is bounded by a timeout (the whole process
group is killed past it), and none waits on a rate.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from support import REPO, run_bounded, run_cli, wait_until

from psflow.data import TFRecordWriter, encode_example
from psflow.data.checks import COUNT_BYTES
from psflow.launch.ports import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: An absl/gRPC C-core log line: severity letter, MMDD, time (``E1125 03:25:25.220134 12509 add_port.cc:83]``,
#: ``I0000 00:00:...`` before absl is initialized).
GRPC_LOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d", re.MULTILINE)
GOOD = "1 3:1 11:1 14:1\n0 5:1 7:1 14:1\n" * 50  # 100 LIBSVM records
TRAIN = ("--num-features", "124", "--ps", "1", "--workers", "1", "--quiet", "--no-status")


@dataclass(frozen=True)
class Case:
    """One row: ``args(tmp_path)`` is the command line after ``psflow``; ``line(tmp_path)`` what it prints."""

    args: Callable[[Path], list[str]]
    line: Callable[[Path], str]
    worker: bool = False  # found by a worker: the failure report names it, its log holds the line
    in_tmp: bool = False  # run in tmp_path (its own modules beside it), not in the repository
    env: Mapping[str, str] | None = None  # environment variables set for the command (PSFLOW_TOKEN is unset otherwise)
    alone: bool = False  # the line is all the command prints on stderr


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def good(tmp: Path) -> str:
    return write(tmp / "good.libsvm", GOOD)


def train(tmp: Path, *args: str) -> list[str]:
    return ["train", *TRAIN, "--output", str(tmp / "run"), *args]


#: Wide records (~7 KB) for a malformed line past what the launcher reads before it starts tasks
#: (COUNT_BYTES), with few records, and training steps, before it.
WIDE = " ".join(f"{i}:1" for i in range(1, 1200))
LATE_LINE = COUNT_BYTES // len(WIDE) + 150  # about 1 MB past COUNT_BYTES


def late_bad_record(tmp: Path) -> str:
    return write(tmp / "late.libsvm", "".join(f"{k % 2} {WIDE}\n" for k in range(LATE_LINE - 1)) + "1 x:2\n")


def bad_crc_tfrecord(tmp: Path) -> str:
    path = tmp / "bad.tfrecord"
    with TFRecordWriter(str(path)) as writer:
        for k in range(20):
            writer.write(encode_example({"label": ("float32", [float(k % 2)]), "C1": ("int64", [k])}))
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF  # a byte of the first record's data: its CRC no longer matches
    path.write_bytes(bytes(data))
    return str(path)


def labelled_tfrecord(tmp: Path, name: str, labels: list[float]) -> str:
    path = tmp / name
    with TFRecordWriter(str(path)) as writer:
        for k, label in enumerate(labels):
            writer.write(encode_example({"label": ("float32", [label]), "C1": ("int64", [k])}))
    return str(path)


def late_bad_label(tmp: Path) -> str:
    return write(tmp / "late7.libsvm", "".join(f"{k % 2} {WIDE}\n" for k in range(LATE_LINE - 1)) + "7 3:1\n")


TFRECORD = ("--format", "tfrecord", "--feature", "C1:int64:100")

CASES = {
    "missing train file": Case(
        lambda t: train(t, "--train", str(t / "nope.libsvm")),
        lambda t: f"psflow train: error: --train: {t / 'nope.libsvm'}: no such file"),
    "empty train file": Case(
        lambda t: train(t, "--train", write(t / "empty.libsvm", "")),
        lambda t: f"psflow train: error: --train {t / 'empty.libsvm'}: the file holds no libsvm records"),
    "missing train file, --in-process": Case(  # the in-process banner said the run was starting, before it
        lambda t: train(t, "--train", str(t / "nope.libsvm"), "--in-process"),
        lambda t: f"psflow train: error: --train: {t / 'nope.libsvm'}: no such file", alone=True),
    "missing eval file": Case(
        lambda t: train(t, "--train", good(t), "--eval", str(t / "nope.t")),
        lambda t: f"psflow train: error: --eval: {t / 'nope.t'}: no such file"),
    "malformed LIBSVM token, first record": Case(
        lambda t: train(t, "--train", write(t / "bad.libsvm", "1 x:2\n" + GOOD)),
        lambda t: f"psflow train: error: --train: {t / 'bad.libsvm'}:1: malformed token 'x:2' (want <id>:<value>)"),
    "malformed LIBSVM token found by a worker": Case(
        lambda t: train(t, "--train", late_bad_record(t), "--num-features", "2048", "--batch-size", "256"),
        lambda t: f"{t / 'late.libsvm'}:{LATE_LINE}: malformed token 'x:2' (want <id>:<value>)",
        worker=True),
    "more bad records than --max-bad-records": Case(
        lambda t: train(t, "--train", write(t / "bad2.libsvm", GOOD + "1 x:2\n1 y:3\n"), "--skip-bad-records",
                        "--max-bad-records", "1"),
        lambda t: f"2 bad records in one epoch exceeds max_bad_records=1; last: {t / 'bad2.libsvm'}:102: "
                  "malformed token 'y:3' (want <id>:<value>)",
        worker=True),
    "TFRecord with a bad CRC": Case(
        lambda t: train(t, "--train", bad_crc_tfrecord(t), "--format", "tfrecord", "--feature", "C1:int64:100"),
        lambda t: f"psflow train: error: --train: {t / 'bad.tfrecord'}: record 0 at byte 0: data checksum mismatch"),
    "NaN label in a TFRecord": Case(
        lambda t: train(t, "--train", labelled_tfrecord(t, "nan.tfrecord", [math.nan, 1.0, 0.0]), *TFRECORD),
        lambda t: f"psflow train: error: --train: {t / 'nan.tfrecord'}: record 0 at byte 0: label nan is not one the "
                  "model accepts: want 0 or 1 (a binary model)"),
    "label 7.0 in a TFRecord for a binary model": Case(
        lambda t: train(t, "--train", labelled_tfrecord(t, "seven.tfrecord", [7.0, 1.0, 0.0]), *TFRECORD),
        lambda t: f"psflow train: error: --train: {t / 'seven.tfrecord'}: record 0 at byte 0: label 7 is not one the "
                  "model accepts: want 0 or 1 (a binary model)"),
    "LIBSVM label 7 for a binary model": Case(
        lambda t: train(t, "--train", write(t / "seven.libsvm", GOOD + "7 3:1\n")),
        lambda t: f"psflow train: error: --train: {t / 'seven.libsvm'}:101: label 7 is not one the model accepts: "
                  "want -1, 0 or +1 (a binary model; LIBSVM's -1 reads as 0)"),
    "LIBSVM label 7 found by a worker": Case(
        lambda t: train(t, "--train", late_bad_label(t), "--num-features", "2048", "--batch-size", "256"),
        lambda t: f"{t / 'late7.libsvm'}:{LATE_LINE}: label 7 is not one the model accepts: want -1, 0 or +1",
        worker=True),
    "negative --batch-size": Case(
        lambda t: train(t, "--train", good(t), "--batch-size", "-5"),
        lambda t: "psflow train: error: --batch-size must be >= 1, got -5"),
    "--workers 0": Case(
        lambda t: train(t, "--train", good(t), "--workers", "0"),
        lambda t: "psflow train: error: --workers must be >= 1, got 0"),
    "--ps 0": Case(
        lambda t: train(t, "--train", good(t), "--ps", "0"),
        lambda t: "psflow train: error: --ps must be >= 1, got 0"),
    "--mode ssp with in-graph replication": Case(  # was found by the in-graph client, restarted --max-restarts times
        lambda t: train(t, "--train", good(t), "--replication", "in-graph", "--mode", "ssp",
                        "--restart-policy", "on-failure"),
        lambda t: "psflow train: error: --mode ssp needs between-graph replication"),
    "--sync-timeout with in-graph replication": Case(  # had no effect and said nothing (the flag's default value too)
        lambda t: train(t, "--train", good(t), "--replication", "in-graph", "--mode", "sync", "--sync-timeout", "30"),
        lambda t: "psflow train: error: --sync-timeout 30 is for between-graph replication: an in-graph step waits "
                  "for a failed worker up to --connect-timeout and runs its slice again, never without it"),
    "--on-timeout with in-graph replication": Case(
        lambda t: train(t, "--train", good(t), "--replication", "in-graph", "--on-timeout", "proceed"),
        lambda t: "psflow train: error: --on-timeout proceed is for between-graph replication: an in-graph step "
                  "waits for a failed worker up to --connect-timeout and runs its slice again, never without it"),
    "a flag of another --mode": Case(  # --mode async trained and said nothing of the timeout it never used
        lambda t: train(t, "--train", good(t), "--mode", "async", "--sync-timeout", "5"),
        lambda t: "psflow train: error: --sync-timeout 5 is for --mode sync or ssp (this run: --mode async, which "
                  "applies each push on arrival and waits for no worker)", alone=True),
    "--replicas-to-aggregate above --workers": Case(  # named replicas_to_aggregate, the ps module's name
        lambda t: train(t, "--train", good(t), "--mode", "sync", "--replicas-to-aggregate", "3"),
        lambda t: "psflow train: error: --replicas-to-aggregate 3 exceeds --workers (1): a sync step aggregates "
                  "at most one gradient per worker", alone=True),
    "--workers with --in-process": Case(  # the in-process banner was printed before it
        lambda t: train(t, "--train", good(t), "--in-process", "--workers", "2"),
        lambda t: "psflow train: error: --in-process runs one worker, got --workers 2", alone=True),
    "--workers 0 with --in-process": Case(  # said "--in-process runs one worker", as if 0 were a worker count
        lambda t: train(t, "--train", good(t), "--in-process", "--workers", "0"),
        lambda t: "psflow train: error: --workers must be >= 1, got 0", alone=True),
    "--replication in-graph with --in-process": Case(  # the in-process banner ("--mode async") was printed before it
        lambda t: train(t, "--train", good(t), "--in-process", "--replication", "in-graph"),
        lambda t: "psflow train: error: --replication in-graph needs a client task and worker tasks: not with "
                  "--in-process", alone=True),
    "--chaos with --in-process": Case(  # was ignored: a clean run, no fault injected, nothing said
        lambda t: train(t, "--train", good(t), "--in-process", "--chaos", "kill:ps:0@step=5"),
        lambda t: "psflow train: error: --chaos kill:ps:0@step=5 kills tasks of a cluster of processes: not with "
                  "--in-process"),
    "unknown --model": Case(
        lambda t: train(t, "--train", good(t), "--model", "nosuch"),
        lambda t: "psflow train: error: unknown model 'nosuch': use one of"),
    "unknown --optimizer": Case(
        lambda t: train(t, "--train", good(t), "--optimizer", "nosuch"),
        lambda t: "psflow train: error: argument --optimizer: invalid choice: 'nosuch'"),
    "bad --feature spec": Case(
        lambda t: train(t, "--train", good(t), "--format", "tfrecord", "--feature", "C1:int65"),
        lambda t: "psflow train: error: schema: --feature 'C1:int65': unknown kind 'int65'"),
    "schema file that does not parse": Case(
        lambda t: train(t, "--train", good(t), "--format", "tfrecord", "--schema", write(t / "s.yaml", "label: [\n")),
        lambda t: f"psflow train: error: schema: {t / 's.yaml'}: cannot parse schema: line 2, column 1: "
                  "expected the node content, but found '<stream end>'"),
    "missing schema file": Case(
        lambda t: train(t, "--train", good(t), "--format", "tfrecord", "--schema", str(t / "nope.yaml")),
        lambda t: f"psflow train: error: --schema {t / 'nope.yaml'}: cannot read it: No such file or directory"),
    "--model-param NaN": Case(
        lambda t: train(t, "--train", good(t), "--model-param", "dropout=NaN"),
        lambda t: "psflow train: error: --model-param 'dropout=NaN': want a finite value"),
    # Settings the tasks used to refuse after four processes started, with a traceback (issue 25, item 8).
    "--seed -1": Case(
        lambda t: train(t, "--train", good(t), "--seed", "-1"),
        lambda t: "psflow train: error: --seed must be in [0, 2**63 - 1], got -1"),
    "dynamic table flags without --embedding-table dynamic": Case(  # named the options (capacity_rows), not the flags
        lambda t: train(t, "--train", good(t), "--capacity", "1000", "--ttl-steps", "5"),
        lambda t: "psflow train: error: --capacity 1000, --ttl-steps 5: these options are for dynamic tables; add "
                  "--embedding-table dynamic"),
    "dynamic table smaller than one row": Case(
        lambda t: train(t, "--train", good(t), "--embedding-table", "dynamic", "--capacity-bytes", "1"),
        lambda t: "psflow train: error: --capacity-bytes 1 cannot hold one row of dynamic table 'weights': a row takes "
                  "109 bytes (dim 1, 2 ftrl slots, metadata and index), and the table's share on each of the 1 ps task "
                  "gets 1; give at least 109"),
    "tables larger than this machine's memory": Case(  # 745,058 GiB: more than any machine has
        lambda t: train(t, "--train", good(t), "--model", "fm", "--num-features", "1000000", "--embedding-dim",
                        "100000000"),
        lambda t: "psflow train: error: variable 'embedding' needs 745058.1 GiB on ps/0 with its 1 adagrad slot; this "
                  "machine has "),
    # psflow k8s render checks the training arguments as psflow train does, before it writes a manifest; their
    # paths are the pods' and are not opened here (issue 30, item 4).
    "psflow k8s render: a training setting out of range": Case(
        lambda t: k8s_render(t, "--train", "/data/a9a", "--epochs", "-3"),
        lambda t: "psflow k8s: error: the training arguments after --: --epochs must be >= 1, got -3"),
    "psflow k8s render: no --train": Case(
        lambda t: k8s_render(t, "--epochs", "3"),
        lambda t: "psflow k8s: error: the training arguments after --: --train is required"),
    # Issue 30, items 1, 3 and 5.
    "--train a directory": Case(
        lambda t: train(t, "--train", str(t)),
        lambda t: f"psflow train: error: --train: {t}: is a directory, not a file: name its files, e.g. '{t / '*'}'"),
    "--model a class its module lacks": Case(
        lambda t: train(t, "--train", good(t), "--model", "examples.wide_deep_numpy:Missing"),
        lambda t: "psflow train: error: model 'examples.wide_deep_numpy:Missing': module 'examples.wide_deep_numpy' "
                  f"({REPO / 'examples' / 'wide_deep_numpy.py'}) has no class 'Missing'", alone=True),
    "--model a module that does not parse": Case(
        lambda t: train(t, "--train", good(t), "--model", broken_module(t)),
        lambda t: f"psflow train: error: model 'broken_net:Net': module 'broken_net' does not parse: "
                  f"{t / 'broken_net.py'}:2: invalid syntax", in_tmp=True, alone=True),
    "psflow predict: model.json names a module the user did not": Case(
        lambda t: ["predict", exported_model(t, "evilmod:X"), good(t)],
        lambda t: f"psflow predict: error: {t / 'export' / 'model.json'} names the model 'evilmod:X': psflow imports "
                  "a module a file names (which runs its code) only when you name it yourself: if you trust module "
                  "'evilmod', pass --model evilmod:X", in_tmp=True, alone=True),
    "PSFLOW_TOKEN of only whitespace: psflow server": Case(
        lambda t: ["server", "--cluster", cluster_file(t), "--job", "ps", "--task", "0"],
        lambda t: "psflow server: error: PSFLOW_TOKEN holds only whitespace (1 character(s)): that is no secret; set "
                  "it to the cluster's token (the same on every task), or unset it", env={"PSFLOW_TOKEN": " "},
        alone=True),
    "PSFLOW_TOKEN of only whitespace: psflow shutdown": Case(
        lambda t: ["shutdown", "--cluster", cluster_file(t)],
        lambda t: "psflow shutdown: error: PSFLOW_TOKEN holds only whitespace (2 character(s))",
        env={"PSFLOW_TOKEN": "\t\n"}, alone=True),
    "PSFLOW_TOKEN of only whitespace: psflow train": Case(
        lambda t: train(t, "--train", good(t)),
        lambda t: "psflow train: error: PSFLOW_TOKEN holds only whitespace (3 character(s))",
        env={"PSFLOW_TOKEN": "   "}, alone=True),
    "psflow status: a status.json of another shape": Case(
        lambda t: ["status", write(t / "status.json", '{"run": 5, "tasks": []}')],
        lambda t: f"psflow status: error: {t / 'status.json'}: not a psflow status snapshot of this version "
                  "(AttributeError: 'int' object has no attribute 'get'); psflow status --json prints it as it is",
        alone=True),
    "psflow status: a URL that does not parse": Case(
        lambda t: ["status", "http://[::1"],
        lambda t: "psflow status: error: http://[::1: not a URL psflow can ask (Invalid IPv6 URL); want e.g. "
                  "http://127.0.0.1:PORT/ as psflow train printed it", alone=True),
}


def exported_model(tmp: Path, model: str) -> str:
    """A hand-written export of logistic regression (8 features) whose model.json names ``model``, and beside it
    (in the directory the command runs in) a module ``evilmod`` whose top level leaves a file ``RAN``."""
    out = tmp / "export"
    out.mkdir()
    save_file({"weights": np.zeros((8, 1), np.float32), "bias": np.zeros(1, np.float32)}, str(out / "model.safetensors"))
    (out / "model.json").write_text(json.dumps({
        "format": "psflow-model", "format_version": 2, "model": model, "global_step": 7, "variables": {},
        "model_config": {"num_features": 8}, "data": {"format": "libsvm", "schema": None, "num_features": 8}}))
    write(tmp / "evilmod.py", "import pathlib\npathlib.Path('RAN').write_text('ran')\nclass X:\n    pass\n")
    return str(out)


def broken_module(tmp: Path) -> str:
    """A model module that does not parse (line 2), in the directory the command runs in; returns its model name."""
    write(tmp / "broken_net.py", "x = 1\ndef (\n")
    return "broken_net:Net"


def cluster_file(tmp: Path) -> str:
    return write(tmp / "cluster.json", f'{{"ps": ["127.0.0.1:{free_ports(1)[0]}"]}}')


def k8s_render(tmp: Path, *train_args: str) -> list[str]:
    """``psflow k8s render`` of a 1 ps + 2 workers cluster into ``tmp/k8s``, with ``train_args`` after ``--``."""
    cluster = write(tmp / "cluster.json", '{"ps": ["a:1"], "worker": ["b:1", "c:1"]}')
    return ["k8s", "render", "--cluster", cluster, "--image", "psflow:1", "--output", str(tmp / "k8s"), "--",
            *train_args]


def check_one_line(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "GOAWAY" not in stderr and not GRPC_LOG_LINE.search(stderr), stderr[-3000:]


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_gets_one_line(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    env = {k: v for k, v in os.environ.items() if k != "PSFLOW_TOKEN"} | dict(case.env or {})
    r = run_bounded([sys.executable, "-m", "psflow", *case.args(tmp_path)], timeout=240,
                    cwd=tmp_path if case.in_tmp else REPO, env=env)
    assert r.returncode == 1, r.stderr[-3000:]
    assert case.line(tmp_path) in r.stderr, r.stderr[-3000:]
    check_one_line(r.stderr)
    if case.alone:
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr[-3000:]
    logs = tmp_path / "run" / "logs"
    if not case.worker:
        assert not list(logs.glob("*.log")), "a task was started"
        assert not (tmp_path / "k8s").exists(), "a manifest was written"
        return
    # The report keeps its shape: the failed task (pid, exit status) as the root cause, its one line, the
    # tasks stopped after it; the worker's log holds the line as an ERROR, without a traceback.
    assert re.search(r"/job:worker/task:0 \(pid \d+\) exited with code 1: root cause; log: ", r.stderr), r.stderr
    assert re.search(r"stopped /job:ps/task:0 \(pid \d+\) after the failure", r.stderr), r.stderr
    assert "last lines of its log" not in r.stderr
    worker_log = (logs / "worker-0.log").read_text()
    assert "Traceback" not in worker_log and case.line(tmp_path) in worker_log, worker_log[-3000:]
    # status.json and psflow status: the task that failed is dead, the tasks the launcher stopped after it are
    # stopped (not "dead (exited on SIGTERM)"), as the failure report says.
    states = {t["task"]: (t["state"], t["exit"]) for t in json.loads((tmp_path / "run" / "status.json").read_text())["tasks"]}
    assert states == {"/job:worker/task:0": ("dead", "exited with code 1"), "/job:ps/task:0": ("stopped", None)}, states
    shown = run_bounded([sys.executable, "-m", "psflow", "status", str(tmp_path / "run")], timeout=60).stdout
    assert re.search(r"/job:ps/task:0 .* stopped ", shown) and "SIGTERM" not in shown, shown


def test_predict_imports_a_module_model_json_names_only_when_the_user_names_it(tmp_path: Path) -> None:
    """A model.json is data: naming a module in it does not run that module (issue 30, item 1)."""
    export, data = exported_model(tmp_path, "evilmod:X"), good(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PSFLOW_TOKEN"}

    def predict(*flags: str) -> str:
        r = run_bounded([sys.executable, "-m", "psflow", "predict", export, data, *flags], timeout=120, cwd=tmp_path,
                        env=env)
        assert r.returncode == 1, r.stderr[-3000:]
        check_one_line(r.stderr)
        return r.stderr

    assert "names the model 'evilmod:X'" in predict() and not (tmp_path / "RAN").exists()
    for flags in (["--model", "evilmod:X"], ["--trust-model-module"]):  # the user names it: it is imported
        assert "evilmod:X is not a subclass of psflow.models.Model" in predict(*flags)
        (tmp_path / "RAN").unlink()


def a9a_with_a_huge_value(tmp: Path) -> str:
    """The first 3,000 lines of a9a with a finite but huge feature value, ``3:3e38``, on line 1,500: after its
    batch's update, a later batch's loss is NaN (issue 25, item 7)."""
    lines = (REPO / "data" / "a9a" / "a9a").read_text().splitlines()[:3000]
    label, rest = lines[1499].split(" ", 1)
    lines[1499] = f"{label} 3:3e38 {rest}"
    return write(tmp / "huge.libsvm", "\n".join(lines) + "\n")


@pytest.mark.parametrize("where", ["cluster", "in-process", "in-graph"])
def test_a_nan_loss_names_the_worker_the_step_and_the_batch(where: str, tmp_path: Path) -> None:
    path = a9a_with_a_huge_value(tmp_path)
    extra = {"cluster": [], "in-process": ["--in-process"], "in-graph": ["--replication", "in-graph"]}[where]
    r = run_cli(*train(tmp_path, "--train", path, "--batch-size", "128", "--epochs", "2", *extra), timeout=240)
    assert r.returncode == 1, r.stderr[-3000:]
    found = re.search(r"/job:worker/task:0: loss is (nan|inf|-inf) at global_step (\d+), on the batch of (\S+) lines "
                      r"(\d+)-(\d+), epoch ([01]); ", r.stderr)
    assert found is not None, r.stderr[-3000:]
    first, last = int(found.group(4)), int(found.group(5))
    assert found.group(3) == path and last - first + 1 == 128 and first % 128 == 1, found.group(0)
    assert int(found.group(2)) >= 1500 // 128  # not before the batch with the huge value
    check_one_line(r.stderr)
    if where == "in-process":
        assert f"psflow train: error: {found.group(0)}" in r.stderr
        return
    driver = "client" if where == "in-graph" else "worker"  # the in-graph client reads the data and checks the losses
    assert re.search(rf"/job:{driver}/task:0 \(pid \d+\) exited with code 1: root cause; log: ", r.stderr), r.stderr
    worker_log = (tmp_path / "run" / "logs" / f"{driver}-0.log").read_text()
    assert "Traceback" not in worker_log and worker_log.count("/job:worker/task:0: loss is") == 1, worker_log[-3000:]


def test_resuming_with_another_optimizer_is_refused_before_any_task_starts(tmp_path: Path) -> None:
    """A run resumed with another --optimizer used to die inside a task ("slot 'm' missing")."""
    ck, data = tmp_path / "ck", good(tmp_path)
    first = run_cli("train", *TRAIN, "--train", data, "--checkpoint-dir", str(ck), "--output", str(tmp_path / "r1"),
                    timeout=240)
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_cli("train", *TRAIN, "--train", data, "--checkpoint-dir", str(ck), "--optimizer", "adam",
                    "--output", str(tmp_path / "r2"), timeout=240)
    assert again.returncode == 1, again.stderr[-3000:]
    found = re.search(rf"psflow train: error: --checkpoint-dir {re.escape(str(ck))}: its newest checkpoint (\S+) was "
                      r"written with --optimizer ftrl \(variable 'weights' has slots accum, linear\); this run asks "
                      r"for adam \(slots m, v\)\. Resume with --optimizer ftrl, or start from its variables alone, "
                      r"with fresh optimizer state: --warm-start (\S+) and another --checkpoint-dir", again.stderr)
    assert found is not None, again.stderr[-3000:]
    assert found.group(1) == found.group(2) and (Path(found.group(1)) / "manifest.json").is_file()
    check_one_line(again.stderr)
    assert not (tmp_path / "r2" / "logs").exists(), "a task was started"
    # The way on the message gives works: the variables alone, into another directory, with adam.
    warm = run_cli("train", *TRAIN, "--train", data, "--optimizer", "adam", "--warm-start", found.group(1),
                   "--checkpoint-dir", str(tmp_path / "ck2"), "--output", str(tmp_path / "r3"), timeout=240)
    assert warm.returncode == 0, warm.stderr[-3000:]


def test_a_port_in_use_for_psflow_server(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        cluster = tmp_path / "cluster.json"
        cluster.write_text(f'{{"ps": ["127.0.0.1:{port}"], "worker": ["127.0.0.1:1"]}}')
        r = run_cli("server", "--cluster", str(cluster), "--job", "ps", "--task", "0", "--insecure", timeout=120)
    assert r.returncode == 1, r.stderr[-3000:]
    assert (f"psflow server: error: /job:ps/task:0: cannot listen on 127.0.0.1:{port}: port {port} is already in use"
            in r.stderr), r.stderr[-3000:]
    check_one_line(r.stderr)


def test_verbose_shows_the_traceback_too(tmp_path: Path) -> None:
    r = run_cli(*train(tmp_path, "--train", good(tmp_path), "--batch-size", "-5", "--verbose"), timeout=120)
    assert r.returncode == 1
    assert "Traceback" in r.stderr and r.stderr.rstrip().endswith("--batch-size must be >= 1, got -5"), r.stderr


def test_a_cluster_file_that_gives_a_ps_task_another_tasks_address(tmp_path: Path) -> None:
    """A worker's cluster file names, as ps task 0's, the address of a task that serves no ps (a worker of
    the cluster, by a slip in one host's copy): the line says the process there is no ps task and which
    address to check, beside gRPC's bare 'Register: UNIMPLEMENTED: Method not found!'."""
    ps, other, taken, mine = (f"127.0.0.1:{p}" for p in free_ports(4))
    right = tmp_path / "cluster.json"
    right.write_text(json.dumps({"ps": [ps], "worker": [mine, taken]}))
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"ps": [taken], "worker": [mine, other]}))
    env = {k: v for k, v in os.environ.items() if k not in ("PSFLOW_TOKEN", "TF_CONFIG")}
    log = tmp_path / "worker-1.log"
    with open(log, "wb") as out:  # worker 1 serves at `taken` and waits for its ps task, which never comes
        worker1 = subprocess.Popen([sys.executable, "-m", "psflow", "server", "--cluster", str(right), "--job", "worker",
                                    "--task", "1", "--insecure", "--train", good(tmp_path), *TRAIN[:2], "--no-status",
                                    "--connect-timeout", "250"],
                                   stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(REPO), env=env)
    try:
        wait_until(lambda: f"serving at {taken}" in log.read_text(errors="replace"), "worker 1 serving")
        r = run_bounded([sys.executable, "-m", "psflow", "server", "--cluster", str(wrong), "--job", "worker",
                         "--task", "0", "--insecure", "--train", good(tmp_path), *TRAIN[:2], "--no-status"],
                        timeout=120, env=env)
    finally:
        worker1.kill()
        worker1.wait(timeout=30)
    assert r.returncode == 1, r.stderr[-3000:]
    assert ("psflow server: error: /job:ps/task:0: Register: UNIMPLEMENTED: Method not found! "
            f"(the process at {taken} serves no such call: is another task listening there? check the "
            "cluster's address for /job:ps/task:0)") in r.stderr, r.stderr[-3000:]
    check_one_line(r.stderr)
