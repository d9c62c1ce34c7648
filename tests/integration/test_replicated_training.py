"""Replicated ps shards end to end (issue 28): ``psflow train --ps-replicas 1`` with shard primaries killed
mid-run loses no acknowledged update, trains every record exactly once per epoch, and ends with the model an
undisturbed run gives. Real processes: the launcher, 2 ps + 2 ps_backup + 2 worker tasks.

* async: each shard's primary killed once (``kill:ps:0``, ``kill:ps:1``), no ``--checkpoint-dir``: the
  workers' client promotes the backup and resends to it (psflow/ps/failover.py), no checkpoint is restored;
  ``updates_lost`` 0, ``pushes_applied == pushes_acknowledged``, AUC within 0.002 of an undisturbed run;
* sync, fixed seed: shard 0's primary killed; the exported variables equal an undisturbed run's (within 1e-6:
  the aggregation sums the workers' gradients in arrival order);
* every replica of shard 0 killed at once, checkpoints every 100 steps: restored from the newest, each shard's
  ``pushes_applied`` goes on from the count the checkpoint recorded, so ``updates_lost`` (counted per worker
  process) is exactly the pushes acknowledged after it; the restarted backup is in shard 0's view again at the end;
* sync, shard 0's primary killed, then the chief, then shard 0's promoted primary: the restarted ps task 0
  rejoined as the backup, so the second kill promoted it and lost nothing;
* ``--chaos`` kills of shard 0's primary 2 steps apart: the second round waits until the restarted ps task 0
  is back in shard 0's view (psflow/launch/fault_recovery.py), so it is promoted and nothing is lost;
* one step in flight (the rows first, the acknowledgement collected after the next batch computed) and two, shard
  0's primary killed: nothing lost or applied twice, shard 0's pushes_applied equal to global_step;
* ssp with two steps in flight, shard 0's primary killed: nothing lost or applied twice;
* one worker, async, one step in flight, each shard's primary killed over the TCP carrier: the model ends bit for bit
  an unreplicated run's (each push applied once, in order, and batch t+1's rows read after push t);
* 1 ps, shard 0's primary killed: the chief's lease, replicated with shard 0, lives through the kill (one election);
* checkpoints every 50 steps, shard 0's primary killed: the checkpoint ledger, replicated with shard 0, counts in
  metrics.json exactly the saves the chiefs logged.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file
from support import A9A, A9A_T, run_cli

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

A9A_RECORDS = 32561


def train(out: Path, *extra: str, epochs: int = 3) -> subprocess.CompletedProcess[str]:
    """``psflow train`` on a9a: 2 ps, 2 workers, batch 32, seed 7 (3 epochs: ~3,050 steps)."""
    return run_cli("train", "--train", str(A9A), "--eval", str(A9A_T), "--num-features", "124", "--ps", "2",
                   "--workers", "2", "--batch-size", "32", "--epochs", str(epochs), "--log-every", "10", "--quiet",
                   "--seed", "7", "--output", str(out), "--lease-ttl", "2", *extra, timeout=240)


def metrics_of(out: Path, r: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert r.returncode == 0, r.stderr[-3000:] + _logs(out)
    metrics: dict[str, Any] = json.loads((out / "metrics.json").read_text())
    return metrics


def _logs(out: Path, pattern: str = "*.log", *, tail: int | None = 2500) -> str:
    """The run's logs matching ``pattern``, each named; the last ``tail`` characters of each (None: whole)."""
    return "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-(tail or 0):]}"
                   for p in sorted((out / "logs").glob(pattern)))


def test_killing_each_shards_primary_mid_run_loses_no_acknowledged_update(tmp_path: Path) -> None:
    base = metrics_of(tmp_path / "base", train(tmp_path / "base"))
    out = tmp_path / "run"
    metrics = metrics_of(out, train(out, "--ps-replicas", "1", "--restart-policy", "on-failure",
                                    "--chaos", "kill:ps:0@step=900", "--chaos", "kill:ps:1@step=2000"))
    assert sorted(f["task"] for f in metrics["faults"]) == ["/job:ps/task:0", "/job:ps/task:1"], metrics["faults"]
    assert metrics["updates_lost"] == 0, metrics
    assert metrics["pushes_applied"] == metrics["pushes_acknowledged"] > 0, metrics
    assert metrics["examples"] == 3 * A9A_RECORDS == metrics["ps"][0]["examples"], metrics["ps"]
    workers = "".join(p.read_text() for p in sorted((out / "logs").glob("worker-*.log")))
    # Each primary's backup took over; the cluster was never restored from a checkpoint.
    for shard in (0, 1):
        assert re.search(rf"ps shard {shard} routes to /job:ps_backup/task:{shard} at epoch \d+", workers), _logs(out)
    assert "restored checkpoint" not in workers and "cluster restored" not in workers
    steps = re.findall(r"\bstep=(\d+)", workers)
    assert steps and len(steps) == len(set(steps)), "a step value was handed out twice"
    assert abs(metrics["eval"]["auc"] - base["eval"]["auc"]) <= 0.002, (metrics["eval"], base["eval"])
    _final_checkpoint_written(out / "checkpoints", metrics)  # --restart-policy's default checkpoint directory


@pytest.mark.parametrize("in_flight", ["1", "2"])
def test_two_steps_in_flight_lose_and_repeat_nothing_when_a_primary_dies(tmp_path: Path, in_flight: str) -> None:
    """``--steps-in-flight 2``: the push of a step travels while the next batch computes; 1 (async): the rows
    come first and the next batch computes while the push's acknowledgement comes (psflow/train/step.py). The
    primary killed mid-run, the push it held (or never got, or never had acknowledged) is resent to the promoted
    backup and applied once."""
    out = tmp_path / "run"
    r = train(out, "--ps-replicas", "1", "--restart-policy", "on-failure", "--steps-in-flight", in_flight,
              "--chaos", "kill:ps:0@step=700", epochs=2)
    metrics = metrics_of(out, r)
    # (Once, beside other helpers' suites at load ~6, the kill was not fired in ~1,300 steps after its step; not
    # seen again in 7 runs beside 2-4 CPU hogs: the chaos lines say why if it comes back.)
    chaos = [line for line in r.stderr.splitlines() if "chaos" in line]
    assert [f["task"] for f in metrics["faults"]] == ["/job:ps/task:0"], (metrics["faults"], chaos)
    assert metrics["updates_lost"] == 0, metrics
    assert metrics["pushes_applied"] == metrics["pushes_acknowledged"] > 0, metrics
    assert metrics["examples"] == 2 * A9A_RECORDS == metrics["ps"][0]["examples"], metrics["ps"]
    workers = _logs(out, "worker-*.log", tail=None)
    assert re.search(r"ps shard 0 routes to /job:ps_backup/task:0 at epoch \d+", workers), _logs(out)
    assert "restored checkpoint" not in workers and "cluster restored" not in workers
    steps = re.findall(r"\bstep=(\d+)", workers)
    assert steps and len(steps) == len(set(steps)), "a step value was handed out twice"
    # shard 0 holds global_step: each push it holds moved the step once (none applied twice, none lost)
    shard0 = next(s for s in metrics["shards"] if s["shard"] == 0)
    assert shard0["pushes_applied"] == metrics["global_step"], (shard0, metrics["global_step"])


def test_ssp_with_two_steps_in_flight_loses_and_repeats_nothing_when_shard_0s_primary_dies(tmp_path: Path) -> None:
    """``--mode ssp --steps-in-flight 2``: a worker's pushes wait for the slowest worker's clock and two travel at
    once; shard 0 (global_step, the ssp clock) loses its primary mid-run and the promoted backup goes on."""
    out = tmp_path / "run"
    r = train(out, "--mode", "ssp", "--steps-in-flight", "2", "--ps-replicas", "1", "--restart-policy", "on-failure",
              "--chaos", "kill:ps:0@step=300", epochs=1)
    metrics = metrics_of(out, r)
    assert [f["task"] for f in metrics["faults"]] == ["/job:ps/task:0"], metrics["faults"]
    assert metrics["updates_lost"] == 0, metrics
    assert metrics["pushes_applied"] == metrics["pushes_acknowledged"] > 0, metrics
    assert metrics["examples"] == A9A_RECORDS == metrics["ps"][0]["examples"], metrics["ps"]
    assert re.search(r"ps shard 0 routes to /job:ps_backup/task:0 at epoch \d+", _logs(out, "worker-*.log", tail=None))
    # One promotion, one client WARNING line (the client whose Promote made it) beside the member's own, however many
    # clients (both workers, the chief's other clients, the launcher's) sent a Promote or followed it.
    logs = _logs(out, tail=None)
    warned = re.findall(r"WARNING psflow\.ps\.client: .*(?:promoting|routes to) .*", logs)
    assert len(warned) == 1 and "promoting /job:ps_backup/task:0 (epoch 1)" in warned[0], warned
    assert len(re.findall(r"WARNING .*promoted to primary of shard 0 at epoch 2 by", logs)) == 1, _logs(out)
    assert "routes to" not in r.stderr, r.stderr[-3000:]


def test_one_worker_with_its_rows_first_ends_with_an_unreplicated_runs_model_when_both_primaries_die(
        tmp_path: Path) -> None:
    """Async at one step in flight, replicated: the rows come before the backups' acknowledgement
    (PushPullAckLater, then Acked; psflow/train/step.py). With one worker the run is deterministic, so the model
    must be bit for bit an unreplicated run's, however the kills land (between the rows and the Acked call the
    push alone is resent to the promoted backup): a push applied twice or lost, or batch t+1's rows read before
    push t was applied, changes the weights."""
    def one_worker(out: Path, *extra: str) -> dict[str, np.ndarray]:
        metrics = metrics_of(out, run_cli(
            "train", "--train", str(A9A), "--num-features", "124", "--ps", "2", "--workers", "1", "--batch-size",
            "32", "--epochs", "2", "--log-every", "100", "--quiet", "--seed", "7", "--output", str(out),
            "--checkpoint-dir", str(out / "ckpt"), *extra, timeout=240))
        assert metrics["examples"] == 2 * A9A_RECORDS and metrics["global_step"] == 2 * 1018, metrics
        _final_checkpoint_written(out / "ckpt", metrics)
        return _exported(tmp_path, out)

    # Two epochs: the second kill's round comes due only once the first's replacement is back in its shard and
    # 300 steps more (psflow.launch.chaos); a restart takes ~1 s, ~450 steps at this rate, so in one epoch (1,018
    # steps) the second kill missed the end of training now and then (CI: recovered at 746, due 1,046).
    base = one_worker(tmp_path / "base")
    killed = one_worker(tmp_path / "run", "--ps-replicas", "1", "--transport", "tcp", "--restart-policy",
                        "on-failure", "--chaos", "kill:ps:0@step=300", "--chaos", "kill:ps:1@step=600")
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert sorted(f["task"] for f in metrics["faults"]) == ["/job:ps/task:0", "/job:ps/task:1"], metrics["faults"]
    assert metrics["updates_lost"] == 0 and metrics["pushes_applied"] == metrics["pushes_acknowledged"], metrics
    assert sorted(killed) == sorted(base)
    for name, value in base.items():
        assert np.array_equal(killed[name], value), (name, np.max(np.abs(killed[name] - value)))


def _exported(tmp_path: Path, run: Path) -> dict[str, np.ndarray]:
    model = tmp_path / f"{run.name}-model"
    r = run_cli("export", str(run / "ckpt"), str(model))
    assert r.returncode == 0, r.stderr
    return load_file(str(model / "model.safetensors"))


def _final_checkpoint_written(checkpoints: Path, metrics: dict[str, Any]) -> None:
    """The newest checkpoint in ``checkpoints`` is the run's final one, at its last global_step: the model the
    run ends with is saved (its export and a restore read it), not an older checkpoint such as the initial one.
    The launcher's eval reads the ps tasks, so only this shows it."""
    manifest = read_manifest(str(latest_checkpoint(str(checkpoints))))
    assert manifest.final and manifest.global_step == metrics["global_step"], (manifest.global_step, metrics)


def test_a_sync_run_whose_primary_dies_ends_with_an_undisturbed_runs_variables(tmp_path: Path) -> None:
    sync = ("--mode", "sync", "--save-checkpoints-steps", "100000")
    base, out = tmp_path / "base", tmp_path / "run"
    metrics_of(base, train(base, *sync, "--checkpoint-dir", str(base / "ckpt"), epochs=1))
    metrics = metrics_of(out, train(out, *sync, "--checkpoint-dir", str(out / "ckpt"), "--ps-replicas", "1",
                                    "--restart-policy", "on-failure", "--chaos", "kill:ps:0@step=200", epochs=1))
    assert [f["task"] for f in metrics["faults"]] == ["/job:ps/task:0"], metrics["faults"]
    assert metrics["updates_lost"] == 0 and metrics["pushes_applied"] == metrics["pushes_acknowledged"], metrics
    assert "restored checkpoint" not in _logs(out, "worker-*.log", tail=None)
    _final_checkpoint_written(out / "ckpt", metrics)
    want, got = _exported(tmp_path, base), _exported(tmp_path, out)
    assert sorted(want) == sorted(got)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6, err_msg=name)


def test_a_restarted_primary_rejoins_as_the_backup_the_next_kill_of_its_shard_promotes(tmp_path: Path) -> None:
    """Sync, shard 0's primary killed, then the chief, then shard 0's (promoted) primary again: the restarted ps
    task 0 rebuilt from the promoted primary while training went on, so the second kill promoted it and lost
    nothing. The promoted primary logs "backups: none" at its promotion (the dead member is no backup then); the
    member's return is its "caught up" line. Without the rebuild the second kill leaves shard 0 no member with
    its state: the cluster is restored from a checkpoint and acknowledged pushes are lost."""
    out = tmp_path / "run"
    metrics = metrics_of(out, train(out, "--mode", "sync", "--ps-replicas", "1", "--restart-policy", "on-failure",
                                    "--chaos", "kill:ps:0@step=200", "--chaos", "kill:chief@step=205",
                                    "--chaos", "kill:ps:0@step=700"))
    faults = [f["task"] for f in metrics["faults"]]
    assert faults == ["/job:ps/task:0", "/job:worker/task:0", "/job:ps_backup/task:0"], metrics["faults"]
    assert metrics["updates_lost"] == 0, metrics
    assert metrics["examples"] == 3 * A9A_RECORDS == metrics["ps"][0]["examples"], metrics["ps"]
    workers = _logs(out, "worker-*.log", tail=None)
    assert "restored checkpoint" not in workers and "cluster restored" not in workers, workers
    first = _logs(out, "ps_backup-0.log", tail=None)  # primary at epoch 2, from the first kill to the second
    promoted = first.index("/job:ps_backup/task:0: promoted to primary of shard 0 at epoch 2")
    rejoined = first.index("/job:ps/task:0 caught up: shard 0's backups are /job:ps/task:0")
    assert promoted < rejoined, first
    assert "/job:ps/task:0: promoted to primary of shard 0 at epoch 3" in _logs(out, "ps-0.log", tail=None)
    shard0 = next(s for s in metrics["shards"] if s["shard"] == 0)  # the second kill's victim is back as well
    assert (shard0["primary"], [b["task"] for b in shard0["backups"]]) == (
        "/job:ps/task:0", ["/job:ps_backup/task:0"]), (shard0, _logs(out, "ps*.log"))


def test_a_chaos_round_after_a_primarys_kill_waits_for_the_restarted_member_to_be_a_backup(tmp_path: Path) -> None:
    """Two kills of shard 0's primary 2 steps apart: the second round waits until the first one's restarted ps
    task 0 is back in shard 0's view, so it promotes it and loses nothing. It fired once the promoted backup
    trained on, before ps task 0 served again: every replica lost, 978 acknowledged pushes of 3,014.

    Three epochs (~1,500 sync steps): the second round fires only once ps task 0 rejoined, and with one epoch
    (509 steps) a loaded machine ended the run first (the rejoin took 4.2 s, steps 202 to 509 less)."""
    out = tmp_path / "run"
    metrics = metrics_of(out, train(out, "--mode", "sync", "--ps-replicas", "1", "--restart-policy", "on-failure",
                                    "--chaos", "kill:ps:0@step=200", "--chaos", "kill:ps:0@step=202"))
    assert [f["task"] for f in metrics["faults"]] == ["/job:ps/task:0", "/job:ps_backup/task:0"], (
        metrics["faults"], "the second round never fired: did the run end before ps task 0 rejoined?")
    assert metrics["updates_lost"] == 0, metrics
    assert "cluster restored" not in _logs(out, "worker-*.log", tail=None)
    assert "/job:ps/task:0: promoted to primary of shard 0 at epoch 3" in _logs(out, "ps-0.log", tail=None)


def test_every_replica_of_a_shard_lost_at_once_is_restored_from_the_checkpoint_and_the_loss_reported(
        tmp_path: Path) -> None:
    out = tmp_path / "run"
    metrics = metrics_of(out, train(out, "--ps-replicas", "1", "--restart-policy", "on-failure",
                                    "--checkpoint-dir", str(out / "ckpt"), "--save-checkpoints-steps", "100",
                                    "--max-to-keep", "100",
                                    # between two checkpoints (every 100 steps): pushes are acknowledged after
                                    # the newest, however late the chief's save of step 300 begins
                                    "--chaos", "kill:ps:0@step=350", "--chaos", "kill:ps-backup:0@step=350",
                                    epochs=2))  # the second epoch: time for the restarted backup to rejoin
    assert sorted(f["task"] for f in metrics["faults"]) == ["/job:ps/task:0", "/job:ps_backup/task:0"]
    workers = _logs(out, "worker-*.log", tail=None)  # the restore's lines come long before each log's end
    assert "every replica of ps shard 0 was lost at once" in workers, workers
    restored = re.findall(r"restored checkpoint (\S+) \(step (\d+)\) onto every ps task; generation \d+, "
                          r"global_step (\d+)", workers)
    assert len(restored) == 1, workers
    path, step, resumed_at = restored[0][0], int(restored[0][1]), int(restored[0][2])
    manifest = json.loads((Path(path) / "manifest.json").read_text())
    assert step == manifest["global_step"] > 0, path  # a checkpoint of the run, not its initial one
    # Each shard's checkpoint holds its count of the pushes it holds; on shard 0 (global_step's) each push
    # moved the step by one, so the count is the checkpoint's step.
    held = [shard["pushes_applied"] for shard in manifest["shards"]]
    assert held[0] == step, manifest["shards"]
    shards = {s["shard"]: s for s in metrics["shards"]}
    # Shard 0's count went on from the checkpoint's: every push since the restore moved the step by one.
    assert shards[0]["pushes_applied"] == held[0] + metrics["global_step"] - resumed_at, (shards, resumed_at)
    assert shards[1]["pushes_applied"] > held[1], shards
    # So the loss is exactly the pushes each shard acknowledged after the checkpoint, and nothing else: counted
    # per worker process, it is the totals' difference plus the pushes the checkpoint holds whose replies never
    # came back (at most one per worker process and shard: one push call in flight each).
    for shard in shards.values():
        gap = shard["pushes_acknowledged"] - shard["pushes_applied"]
        assert max(0, gap) <= shard["updates_lost"] <= max(0, gap + 2), shards
    assert shards[0]["updates_lost"] > 0 and shards[1]["updates_lost"] > 0, (shards, _logs(out, "*.log"))
    assert metrics["updates_lost"] == sum(s["updates_lost"] for s in shards.values()), metrics
    assert metrics["examples"] == 2 * A9A_RECORDS == metrics["ps"][0]["examples"], metrics["ps"]
    # Both restarted members are in shard 0's view again (a client may have had the backup dropped an instant after
    # both restarted, its channel still holding the dead process's refused connection, or asked for that drop while
    # the backup's Join was served, or promoted it over the empty primary, which then rebuilt from it), so the shard
    # ends replicated again.
    view = [shards[0]["primary"], *(b["task"] for b in shards[0]["backups"])]
    assert sorted(view) == ["/job:ps/task:0", "/job:ps_backup/task:0"], (shards[0], _logs(out, "ps*.log"))


def test_the_chief_keeps_its_lease_when_shard_0s_primary_dies(tmp_path: Path) -> None:
    """The embedded chief election's lease table is replicated with shard 0 (psflow/ps/replication/leases.py):
    when its primary dies the promoted backup serves the same lease, so the chief renews it there and nobody
    else is elected; at ps task 0 restarted empty (before), another worker was elected, or nobody could be."""
    out = tmp_path / "run"
    r = run_cli("train", "--train", str(A9A), "--num-features", "124", "--ps", "1", "--workers", "2",
                "--batch-size", "32", "--epochs", "3", "--log-every", "10", "--quiet", "--seed", "7", "--output",
                str(out), "--lease-ttl", "3", "--checkpoint-dir", str(out / "ckpt"), "--ps-replicas", "1",
                "--restart-policy", "on-failure", "--chaos", "kill:ps:0@step=400", timeout=120)
    metrics = metrics_of(out, r)
    assert [f["task"] for f in metrics["faults"]] == ["/job:ps/task:0"], metrics["faults"]
    assert metrics["updates_lost"] == 0 and metrics["pushes_applied"] == metrics["pushes_acknowledged"], metrics
    workers = _logs(out, "worker-*.log", tail=None)
    # Before the first worker's data ended (then the chief hands its duties to a worker that still trains, or
    # keeps them, the last to finish) exactly one election: the chief's lease lived through the kill.
    stamp = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "
    finished = min(re.findall(stamp + r".*finished its data", workers, re.M))
    elections = [e for e in re.findall(stamp + r".*(/job:worker/task:\d): elected chief", workers, re.M) if e[0] < finished]
    assert len(elections) == 1, workers
    chief = _logs(out, f"worker-{elections[0][1][-1]}.log", tail=None)
    moved = re.findall(stamp + r".*coordination calls go to /job:ps_backup/task:0", chief, re.M)
    assert moved and moved[0] < finished, chief  # it renewed its lease at the promoted backup, still the chief
    assert "lost its lease" not in workers and "not acting as chief" not in workers, workers
    _final_checkpoint_written(out / "ckpt", metrics)


def test_the_checkpoint_ledger_counts_every_save_the_chiefs_logged_when_shard_0s_primary_dies(tmp_path: Path) -> None:
    """The ledger (``CheckpointStatus``, psflow/ps/replication/save_ledger.py) is replicated with shard 0: the
    promoted backup serves the saves counted before the kill, so metrics.json's ``checkpoints`` says what the chiefs
    logged. Before, the promoted backup's ledger was empty: the launcher's count lost the saves between its last
    reading (every 2 s) and the kill, or missed the new ledger altogether once its count passed the old one's."""
    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    metrics = metrics_of(out, train(out, "--ps-replicas", "1", "--restart-policy", "on-failure", "--checkpoint-dir",
                                    str(ckpt), "--save-checkpoints-steps", "50", "--max-to-keep", "100",
                                    "--chaos", "kill:ps:0@step=500", epochs=1))
    assert [f["task"] for f in metrics["faults"]] == ["/job:ps/task:0"], metrics["faults"]
    assert metrics["updates_lost"] == 0, metrics
    workers = _logs(out, "worker-*.log", tail=None)  # the chief's duties may move: every worker's log
    assert "could not report the checkpoint outcome" not in workers, workers
    saves = [(path, int(step)) for path, step in re.findall(r": saved checkpoint (\S+) at step (\d+)", workers)]
    assert any(step < 500 for _, step in saves) and any(step > 500 for _, step in saves), saves
    ledger = metrics["checkpoints"]
    assert (ledger["saved"], ledger["failed"], ledger["failed_in_a_row"]) == (len(saves), 0, 0), (ledger, saves)
    assert metrics["checkpoints_saved"] == len(saves), metrics
    newest = max(saves, key=lambda s: s[1])
    assert (ledger["last_saved_path"], ledger["last_saved_step"]) == newest, (ledger, newest)
    assert latest_checkpoint(str(ckpt)) == newest[0]
    _final_checkpoint_written(ckpt, metrics)


def test_an_in_graph_runs_shards_count_every_push_they_acknowledged(tmp_path: Path) -> None:
    """The in-graph client never told the shards its final acknowledged counts (a worker does when it leaves),
    so every replicated in-graph run reported one push per shard fewer acknowledged than applied (126 of 128
    for one epoch on 2 shards): a shard lost after the last push would have had that push missing from
    updates_lost."""
    out = tmp_path / "run"
    metrics = metrics_of(out, run_cli("train", "--train", str(A9A), "--num-features", "124", "--ps", "2",
                                      "--workers", "2", "--batch-size", "512", "--epochs", "1", "--quiet",
                                      "--replication", "in-graph", "--ps-replicas", "1", "--output", str(out),
                                      timeout=240))
    assert metrics["examples"] == A9A_RECORDS, metrics
    assert metrics["pushes_acknowledged"] == metrics["pushes_applied"] == 2 * 64, metrics  # 32 batches x 2 slices
    assert metrics["updates_lost"] == 0
    assert all(s["pushes_acknowledged"] == s["pushes_applied"] == 64 for s in metrics["shards"]), metrics["shards"]
