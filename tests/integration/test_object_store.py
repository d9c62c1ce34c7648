"""Checkpoints and inputs on object storage (issue 26, item 8): real ``psflow`` processes against real local
stores, moto's S3 server and gcp-storage-emulator (the ``object_store`` fixture: each test runs once with
``s3://`` and once with ``gs://``; see tests/object_store_servers.py).

Shown here, on each store: a run reads its --train glob and --eval file from the bucket and checkpoints into
it; a ps task and the chief are killed and the run recovers from the bucket's checkpoints with every record
trained exactly once; a second run resumes from them; ``psflow export`` reads the checkpoint from the bucket
and writes the model there, and ``psflow predict`` reads both model and data from it, scoring exactly as the
same model read from local files; a checkpoint whose manifest never arrived (the chief killed after the shards
were written) is skipped by every reader and deleted by the next save; the run lock holds over a store; the
readers (TFRecord, GZIP, LIBSVM, schema inference) read objects as they read files; and the storage operations
themselves behave on the store as on disk.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import A9A, run_cli

from psflow import storage
from psflow.checkpoint.chain import checkpoint_chain
from psflow.checkpoint.lock import (
    LOCK_NAME,
    MUTEX_NAME,
    MUTEX_TIMEOUT,
    CheckpointDirLock,
    CheckpointError,
    directory_mutex,
)
from psflow.checkpoint.manifest import MANIFEST_NAME, read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.variables import read_variables
from psflow.data import Batch, read_all
from psflow.data.infer import infer_first_file
from psflow.data.source import iter_blocks

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TRAIN_LINES = 3000  # in each of the 2 train files
EVAL_LINES = 2000


def upload_data(bucket: str) -> tuple[str, str]:
    """a9a's first 8,000 lines into the bucket: ``data/train-0`` and ``-1`` (3,000 each), ``data/eval`` (2,000);
    returns the train glob and the eval URL."""
    lines = A9A.read_bytes().splitlines(keepends=True)
    for i in range(2):
        storage.write_atomically(f"{bucket}/data/train-{i}", b"".join(lines[i * TRAIN_LINES:(i + 1) * TRAIN_LINES]))
    storage.write_atomically(f"{bucket}/data/eval", b"".join(lines[2 * TRAIN_LINES:2 * TRAIN_LINES + EVAL_LINES]))
    return f"{bucket}/data/train-*", f"{bucket}/data/eval"


def train(out: Path, train_glob: str, ckpt: str, *extra: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``psflow train`` on the bucket's data: 2 ps, 2 workers, batch 32, a checkpoint into ``ckpt`` every 40 steps."""
    return run_cli("train", "--train", train_glob, "--num-features", "124", "--ps", "2", "--workers", "2",
                   "--batch-size", "32", "--log-every", "10", "--quiet", "--output", str(out), "--checkpoint-dir", ckpt,
                   "--save-checkpoints-steps", "40", "--lease-ttl", "2", *extra, timeout=timeout)


def logs(out: Path) -> dict[str, str]:
    return {p.stem: p.read_text(errors="replace") for p in (out / "logs").glob("*.log")}


def test_a_run_on_the_store_survives_a_killed_ps_and_chief_resumes_and_exports(object_store: str, tmp_path: Path) -> None:
    train_glob, evaluation = upload_data(object_store)
    ckpt = f"{object_store}/ckpt"
    out = tmp_path / "run"
    # Sync mode: no step is taken while the chief saves (every step needs its gradient), so the kills land after
    # the saves at steps 0, 40 and 80 completed however slow the store is (a process's first put imports s3fs
    # or gcsfs: about a second, in which an async run trains past step 120).
    r = train(out, train_glob, ckpt, "--eval", evaluation, "--epochs", "2", "--mode", "sync",
              "--restart-policy", "on-failure", "--chaos", "kill:ps:1@step=120", "--chaos", "kill:chief@step=200")
    assert r.returncode == 0, r.stderr[-4000:]
    metrics: dict[str, Any] = json.loads((out / "metrics.json").read_text())
    assert [f["task"] for f in metrics["faults"]][0] == "/job:ps/task:1" and len(metrics["faults"]) == 2, metrics["faults"]
    assert all(f["signal"] == "SIGKILL" and f["recovery_seconds"] is not None for f in metrics["faults"]), metrics["faults"]
    # Every record trained exactly once per epoch in the surviving model's history, through a restore from the bucket.
    assert metrics["ps"][0]["examples"] == 2 * 2 * TRAIN_LINES, metrics["ps"][0]
    text = "\n".join(logs(out).values())
    restored = re.search(rf"restored checkpoint ({re.escape(ckpt)}/ckpt-\d+) \(step (\d+)\) onto every ps task", text)
    assert restored, text[-4000:]
    assert metrics["eval"]["examples"] == EVAL_LINES and metrics["eval"]["auc"] > 0.85, metrics["eval"]
    newest = latest_checkpoint(ckpt)
    assert newest is not None and newest.startswith(f"{ckpt}/ckpt-")
    final = read_manifest(newest)
    assert final.final and final.global_step == metrics["global_step"], (final.global_step, metrics["global_step"])
    pointer = json.loads(storage.read_bytes(f"{ckpt}/checkpoint"))
    assert pointer["latest"] == newest.rsplit("/", 1)[1]
    # --max-to-keep 5 restorable checkpoints, plus the older ones their increments build on (and nothing else).
    newest_five = pointer["all"][-5:]
    chains = {p.rsplit("/", 1)[1] for name in newest_five for p, _ in checkpoint_chain(f"{ckpt}/{name}")}
    assert set(pointer["all"]) <= chains | set(newest_five), (pointer["all"], chains)
    for name in pointer["all"]:  # every kept checkpoint complete and readable from the bucket
        read_variables(f"{ckpt}/{name}", slots=True)
    assert not storage.exists(f"{ckpt}/{LOCK_NAME}") and not storage.exists(f"{ckpt}/{MUTEX_NAME}")  # released

    # A second run resumes from the bucket's newest checkpoint and trains a third epoch; its shards travel to the
    # chief, which puts them (--checkpoint-transport rpc), where the first run's ps tasks put their own.
    again = tmp_path / "again"
    r = train(again, train_glob, ckpt, "--epochs", "3", "--checkpoint-transport", "rpc")
    assert r.returncode == 0, r.stderr[-4000:]
    assert f"restored checkpoint {newest} at step {final.global_step}" in logs(again)["worker-0"]
    assert json.loads((again / "metrics.json").read_text())["ps"][0]["examples"] == 3 * 2 * TRAIN_LINES

    # psflow export reads the checkpoint from the bucket and writes the model into it; predict reads both from it.
    resumed = latest_checkpoint(ckpt)
    r = run_cli("export", ckpt, f"{object_store}/model")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["exported"] == resumed
    assert json.loads(storage.read_bytes(f"{object_store}/model/model.json"))["checkpoint"] == resumed
    r = run_cli("predict", f"{object_store}/model", evaluation, "--output", str(tmp_path / "remote.txt"))
    assert r.returncode == 0, r.stderr[-3000:]
    # The same model exported to a local directory scores a local copy of the data alike, to the last digit.
    (tmp_path / "eval").write_bytes(storage.read_bytes(evaluation))
    r = run_cli("export", resumed or "", str(tmp_path / "model"))
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_cli("predict", str(tmp_path / "model"), str(tmp_path / "eval"), "--output", str(tmp_path / "local.txt"))
    assert r.returncode == 0, r.stderr[-3000:]
    remote = (tmp_path / "remote.txt").read_text()
    assert remote == (tmp_path / "local.txt").read_text() and len(remote.splitlines()) == EVAL_LINES
    scores = np.array([float(x) for x in remote.split()])
    assert np.all((scores > 0) & (scores < 1))


def test_a_checkpoint_whose_manifest_never_arrived_is_skipped(object_store: str, tmp_path: Path) -> None:
    train_glob, _ = upload_data(object_store)
    ckpt = f"{object_store}/ckpt"
    r = train(tmp_path / "a", train_glob, ckpt, "--max-steps", "10")
    assert r.returncode == 0, r.stderr[-3000:]
    first = latest_checkpoint(ckpt)
    assert first is not None
    before = read_variables(first, slots=True)
    # The chief dies right after every ps task put its shard: the manifest (and the pointer) never arrive.
    r = train(tmp_path / "b", train_glob, ckpt, "--max-steps", "30", "--save-checkpoints-steps", "5",
              "--fault-point", "shards_written")
    assert r.returncode != 0 and "exited with code 75" in r.stderr, r.stderr[-3000:]
    incomplete = [p for p in storage.subdirectories(ckpt, "ckpt-") if not storage.exists(f"{p}/{MANIFEST_NAME}")]
    assert len(incomplete) == 1, storage.subdirectories(ckpt, "ckpt-")
    (partial,) = incomplete
    assert sorted(n for n in storage.listdir(partial) if n.startswith("shard-")) == [
        "shard-00000-of-00002.safetensors", "shard-00001-of-00002.safetensors"]
    assert latest_checkpoint(ckpt) == first  # the readers skip it
    after = read_variables(first, slots=True)
    assert all(np.array_equal(after[name], before[name]) for name in before)
    r = run_cli("export", ckpt, str(tmp_path / "model"))
    assert r.returncode == 0 and json.loads(r.stdout)["exported"] == first, r.stderr[-3000:]
    # A new run restores the complete checkpoint, never the partial one, and its first save deletes the partial one.
    r = train(tmp_path / "c", train_glob, ckpt, "--max-steps", "20")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"restored checkpoint {first} at step {read_manifest(first).global_step}" in logs(tmp_path / "c")["worker-0"]
    assert not storage.exists(partial)
    assert read_manifest(latest_checkpoint(ckpt) or "").global_step >= 20


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid


def test_the_run_lock_over_a_store(object_store: str) -> None:
    ckpt = f"{object_store}/locked"
    first = CheckpointDirLock(ckpt, "run-a")
    first.acquire()
    assert json.loads(storage.read_bytes(f"{ckpt}/{LOCK_NAME}"))["run_id"] == "run-a"
    with pytest.raises(CheckpointError, match=r"is in use by run run-a \(pid \d+"):
        CheckpointDirLock(ckpt, "run-b").acquire()  # another live run (this process vouches for run-a)
    assert first.release() and not storage.exists(f"{ckpt}/{LOCK_NAME}")
    CheckpointDirLock(ckpt, "run-b").acquire()  # free again
    # The directory's mutex: a lock object left behind by a process killed inside the block (on this host, or
    # on another host and older than MUTEX_TIMEOUT) is taken over, and this holder's is deleted when it lets go.
    for stale in ({"token": "x", "host": socket.gethostname(), "pid": _dead_pid(), "since": time.time()},
                  {"token": "x", "host": "another-host", "pid": 1, "since": time.time() - 2 * MUTEX_TIMEOUT}):
        storage.write_atomically(f"{ckpt}/{MUTEX_NAME}", json.dumps(stale).encode())
        with directory_mutex(ckpt, timeout=30):
            assert json.loads(storage.read_bytes(f"{ckpt}/{MUTEX_NAME}"))["pid"] == os.getpid()
        assert not storage.exists(f"{ckpt}/{MUTEX_NAME}")
    if object_store.startswith("s3://"):  # (the GCS emulator ignores preconditions: there it is best effort)
        live = {"token": "y", "host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
        storage.write_atomically(f"{ckpt}/{MUTEX_NAME}", json.dumps(live).encode())
        with pytest.raises(CheckpointError, match="another process held its lock object"), \
                directory_mutex(ckpt, timeout=1.0):
            pass
        assert json.loads(storage.read_bytes(f"{ckpt}/{MUTEX_NAME}"))["token"] == "y"  # a live holder's is kept


def test_storage_operations_on_a_store(object_store: str) -> None:
    """What the checkpoints and readers rely on, on the store itself (tests/unit/test_storage.py: the local side)."""
    root = f"{object_store}/ops"
    assert not storage.exists(root) and storage.subdirectories(root, "ckpt-") == []
    for name in ("ckpt-1/a", "ckpt-1/b", "ckpt-10/a", "ckpt-2/deeper/a", "train-0", "train-1", "other/train-2"):
        storage.write_atomically(f"{root}/{name}", name.encode())
    assert storage.read_bytes(f"{root}/ckpt-1/b") == b"ckpt-1/b" and storage.read_head(f"{root}/train-1", 5) == b"train"
    assert storage.subdirectories(root, "ckpt-") == [f"{root}/ckpt-1", f"{root}/ckpt-10", f"{root}/ckpt-2"]
    assert sorted(storage.listdir(root)) == ["ckpt-1", "ckpt-10", "ckpt-2", "other", "train-0", "train-1"]
    assert storage.glob(f"{root}/train-*") == [f"{root}/train-0", f"{root}/train-1"]  # '*' stays in its directory
    assert storage.glob(f"{root}/ckpt-1*") == []  # directories are no files
    assert storage.isdir(f"{root}/ckpt-1") and storage.isfile(f"{root}/train-0") and not storage.isfile(f"{root}/ckpt-1")
    with storage.open_for_read(f"{root}/ckpt-10/a") as f:
        f.seek(5)
        assert f.read() == b"10/a"
    before = storage.version(f"{root}/train-0")
    storage.write_atomically(f"{root}/train-0", b"rewritten")
    assert storage.read_bytes(f"{root}/train-0") == b"rewritten" and storage.version(f"{root}/train-0") != before
    storage.remove_tree(f"{root}/ckpt-1")  # the prefix ckpt-1/ only: ckpt-10 stays
    assert not storage.exists(f"{root}/ckpt-1") and storage.read_bytes(f"{root}/ckpt-10/a") == b"ckpt-10/a"
    storage.remove_tree(f"{root}/ckpt-1", ignore_errors=True)
    storage.remove(f"{root}/train-1")
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(f"{root}/train-1")
    with pytest.raises(FileNotFoundError):
        storage.remove(f"{root}/train-1")


def _same(a: Batch, b: Batch) -> bool:
    return (a.labels.tobytes() == b.labels.tobytes() and list(a.sparse) == list(b.sparse)
            and all(getattr(c, f).tobytes() == getattr(b.sparse[n], f).tobytes()
                    for n, c in a.sparse.items() for f in ("indptr", "ids", "values")))


def test_readers_stream_objects_as_they_read_files(object_store: str, tmp_path: Path) -> None:
    """TFRecord (plain and GZIP, as TensorFlow wrote them) and gzipped LIBSVM read from the store give the same
    batches as the local files; a read resumed at an offset seeks into the object; the schema is inferred from it."""
    fixtures = Path(__file__).resolve().parent.parent / "data" / "tfrecord_fixtures"
    head = b"".join(A9A.read_bytes().splitlines(keepends=True)[:700])
    (tmp_path / "a9a.gz").write_bytes(gzip.compress(head, mtime=0))
    local = {"sparse_lr.tfrecord": fixtures / "sparse_lr.tfrecord", "sparse_lr.tfrecord.gz": fixtures / "sparse_lr.tfrecord.gz",
             "a9a.gz": tmp_path / "a9a.gz"}
    for name, path in local.items():
        storage.write_atomically(f"{object_store}/in/{name}", path.read_bytes())
    for name, fmt in (("sparse_lr.tfrecord", "tfrecord"), ("sparse_lr.tfrecord.gz", "tfrecord"), ("a9a.gz", "libsvm")):
        remote, here = read_all(f"{object_store}/in/{name}", fmt), read_all(str(local[name]), fmt)
        assert remote.num_examples == here.num_examples > 0 and _same(remote, here), name
    assert b"".join(iter_blocks(f"{object_store}/in/a9a.gz", "gzip", 1000, 4096)) == head[1000:]
    plain = local["sparse_lr.tfrecord"].read_bytes()
    assert b"".join(iter_blocks(f"{object_store}/in/sparse_lr.tfrecord", "none", 100, 64)) == plain[100:]
    inferred = infer_first_file([f"{object_store}/in/sparse_lr.tfrecord*"])
    assert inferred.schema.to_dict() == infer_first_file([str(local["sparse_lr.tfrecord"])]).schema.to_dict()


def test_a_chief_with_an_epoch_goes_past_a_lock_object_held_too_long(object_store: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A live process of this host holds ``directory.mutex`` (stopped inside a save): a save with a lease epoch
    goes on past it and publishes through ``checkpoint.e<epoch>`` and ``checkpoint``; one without fails."""
    from two_ps_in_process import SGD, two_ps_cluster

    from psflow.checkpoint import lock
    from psflow.checkpoint.save import CheckpointManager

    if not object_store.startswith("s3://"):
        pytest.skip("the GCS emulator ignores preconditions: the lock object is never held there")
    monkeypatch.setattr(lock, "MUTEX_TIMEOUT", 1.0)
    ckpt = f"{object_store}/passed"
    client, _ = two_ps_cluster()
    client.register(SGD, chief=True)
    live = {"token": "z", "host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
    storage.write_atomically(f"{ckpt}/{MUTEX_NAME}", json.dumps(live).encode())
    with pytest.raises(CheckpointError, match="held its lock object"):
        CheckpointManager(ckpt, run_id="run-a").save(client)
    saved = CheckpointManager(ckpt, run_id="run-a").save(client, epoch=4, holder="new chief")
    assert latest_checkpoint(ckpt) == saved.path
    published = json.loads(storage.read_bytes(f"{ckpt}/checkpoint.e4"))
    assert published["latest"] == saved.path.rsplit("/", 1)[1] and published["epoch"] == 4
    assert json.loads(storage.read_bytes(f"{ckpt}/checkpoint")) == published
    assert json.loads(storage.read_bytes(f"{ckpt}/{MUTEX_NAME}"))["token"] == "z"  # the holder's is kept
