"""Dynamic embedding tables end to end (issue #14): real ps processes over gRPC, checkpoints re-split by id, bad input.

Sizes are small (a9a: 123 distinct ids) so every test is quick; what is checked is exactness and who holds what.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from support import A9A, A9A_T, TOKEN, run_cli

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.save import CheckpointManager
from psflow.checkpoint.shards import ShardFiles, saved_table
from psflow.checkpoint.variables import read_variables
from psflow.data import read_all
from psflow.gradients import SparseGradient
from psflow.models.api import ModelError, VariableSpec
from psflow.placement import PlacementError, replica_device_setter
from psflow.ps.client import ClientError, ParameterClient
from psflow.ps.dynamic import owner_of
from psflow.rpc.api import ConnectConfig, RpcError
from psflow.train.build import build_model, declare_variables
from psflow.train.chief import join_cluster
from psflow.train.config import TrainConfig
from psflow.train.step import TrainStep

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _config(**kw: object) -> TrainConfig:
    base: dict[str, object] = dict(
        train=(str(A9A),), eval=(str(A9A_T),), model="fm", embedding_dim=4, optimizer="adagrad", batch_size=256,
        num_ps=2, num_workers=1, connect_timeout=30.0, model_params={"dynamic_table": {"admit_after": 2}})
    base.update(kw)
    return TrainConfig.flat(**base)  # type: ignore[arg-type]


def _client(config: TrainConfig, handle, name: str = "/job:worker/task:0") -> ParameterClient:  # type: ignore[no-untyped-def]
    _, variables = build_model(config, handle.cluster)
    client = ParameterClient(handle.cluster, variables.placements(), client_name=name,
                             config=ConnectConfig(connect_timeout=30, token=TOKEN))
    client.connect()
    return client


def _train(client: ParameterClient, config: TrainConfig, steps: int) -> None:
    model, _ = build_model(config, client.cluster)
    batch = read_all([str(A9A)], "libsvm")
    step = TrainStep(model, client)
    for k in range(steps):
        lo = (k * 256) % 30000
        step(batch.slice(lo, lo + 256))


def _tables(stats: dict[str, object]) -> dict[str, dict[str, int]]:
    return stats.get("dynamic_tables") or {}  # type: ignore[return-value]


def test_restore_onto_one_and_three_ps_tasks_keeps_every_row_and_slot_on_its_owner(local_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = _config()
    source = local_cluster(2)
    client = _client(config, source)
    assert join_cluster(client, config.optimizer_spec(), chief=True).created
    _train(client, config, 12)
    # Admission by the sketch: every a9a id was seen in >= 2 of the 12 batches, and counted as such.
    totals = [_tables(client.stats(i)) for i in (0, 1)]
    assert {key for t in totals for key in t} == {"linear/part_0", "linear/part_1", "embedding/part_0", "embedding/part_1"}
    assert sum(t["embedding/part_0"]["rows"] if "embedding/part_0" in t else t["embedding/part_1"]["rows"]
               for t in totals) > 100
    assert sum(c["rejected_lookups"] for t in totals for c in t.values()) > 0  # first sightings read zeros
    saved = CheckpointManager(str(tmp_path / "ckpt")).save(client, optimizer=config.optimizer_spec().to_json())
    client.shutdown_servers()
    client.close()
    want = read_variables(saved.path, slots=True)
    assert {"linear", "linear@ids", "linear:accumulator", "embedding", "embedding@ids", "embedding:accumulator"} <= set(want)
    assert np.all(np.diff(want["embedding@ids"]) > 0) and want["embedding"].shape == (want["embedding@ids"].size, 4)
    for num_ps in (1, 3):
        target_config = config.with_(num_ps=num_ps)
        target = local_cluster(num_ps)
        chief = _client(target_config, target)
        result = join_cluster(chief, target_config.optimizer_spec(), chief=True, checkpoint_dir=str(tmp_path / "ckpt"))
        assert result.restored == saved.path and result.global_step == 12
        again = CheckpointManager(str(tmp_path / f"again-{num_ps}")).save(chief)
        got = read_variables(again.path, slots=True)
        assert set(got) == set(want)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name} after restore on {num_ps} ps")
        # Each task holds exactly the ids owner_of gives it, and the client routes every id there: a read-only
        # pull of every saved id returns its saved row, from whichever task holds it.
        manifest = read_manifest(again.path)
        for part in manifest.variables["embedding"]["partitions"]:
            assert part["task"] == part["index"]
        for task in range(num_ps):
            rows = _tables(chief.stats(task))[f"embedding/part_{task}"]["rows"]
            assert rows == int(np.count_nonzero(owner_of(want["embedding@ids"], num_ps) == task))
        pulled = chief.pull({"embedding": want["embedding@ids"], "linear": want["linear@ids"]})
        np.testing.assert_array_equal(pulled["embedding"], want["embedding"])
        np.testing.assert_array_equal(pulled["linear"], want["linear"])
        chief.shutdown_servers()
        chief.close()


def test_capacity_holds_eviction_is_counted_and_unseen_ids_read_zeros_without_growing(local_cluster) -> None:  # type: ignore[no-untyped-def]
    config = _config(model="logistic", model_params={"dynamic_table": {"capacity_rows": 40}})
    handle = local_cluster(2)
    client = _client(config, handle)
    join_cluster(client, config.optimizer_spec(), chief=True)
    _train(client, config, 10)
    tables = [_tables(client.stats(i))[f"weights/part_{i}"] for i in (0, 1)]
    assert all(t["rows"] <= 20 and t["row_limit"] == 20 for t in tables), tables
    assert sum(t["evicted_capacity"] for t in tables) > 0
    # Evaluation-style reads (create=False) of ids never seen: zeros, counted, and no row is made.
    unseen = np.array([-(2**63), -1, 2**62 + 12345, 10**15], dtype=np.int64)
    before = sum(_tables(client.stats(i))[f"weights/part_{i}"]["rows"] for i in (0, 1))
    np.testing.assert_array_equal(client.pull({"weights": unseen})["weights"], np.zeros((4, 1), np.float32))
    after = [_tables(client.stats(i))[f"weights/part_{i}"] for i in (0, 1)]
    assert sum(t["rows"] for t in after) == before and sum(t["absent_reads"] for t in after) == 4
    # A training lookup of them admits them (the whole int64 range is a valid id).
    client.pull({"weights": unseen}, create=True)
    assert sum(_tables(client.stats(i))[f"weights/part_{i}"]["admitted"] for i in (0, 1)) >= \
        sum(t["admitted"] for t in after) + 4
    client.shutdown_servers()
    client.close()


def test_bad_input_names_the_table_and_changes_nothing(local_cluster) -> None:  # type: ignore[no-untyped-def]
    config = _config(model="logistic", model_params={"dynamic_table": {}})
    handle = local_cluster(2)
    client = _client(config, handle)
    join_cluster(client, config.optimizer_spec(), chief=True)
    _train(client, config, 3)
    ids = np.arange(1, 60, dtype=np.int64)
    before = client.pull({"weights": ids})["weights"]
    counts = [_tables(client.stats(i)) for i in (0, 1)]
    # Ids of another dtype: refused on the client, naming the table (a cast could change them silently).
    for bad in (ids.astype(np.float64), ids.astype(np.uint64), ids.astype(np.int32)):
        with pytest.raises(PlacementError, match=r"dynamic table 'weights': lookup ids must be int64"):
            client.pull({"weights": bad})
        with pytest.raises(PlacementError, match=r"dynamic table 'weights': gradient ids must be int64"):
            client.push({"weights": SparseGradient(bad, np.ones((bad.size, 1), np.float32))})
    # A row width that does not match the table, or a non-finite gradient: refused as a whole before anything is
    # sent (each ps task would see only its own ids); a ps task refuses them too, naming the table.
    with pytest.raises(ClientError, match=r"dynamic table 'weights': sparse gradient for 59 ids must have shape \(59, 1\)"):
        client.push({"weights": SparseGradient(ids, np.ones((ids.size, 3), np.float32))})
    nan = np.ones((ids.size, 1), np.float32)
    nan[7] = np.nan
    with pytest.raises(ClientError, match=r"dynamic table 'weights': the gradient of id 8 is not finite"):
        client.push({"weights": SparseGradient(ids, nan)})
    part = "weights/part_0"
    for arrays, error in (({f"i/{part}": ids, f"g/{part}": np.ones((ids.size, 3), np.float32)},
                           r"dynamic table 'weights' partition 0: sparse gradient for 59 rows must have shape \(59, 1\)"),
                          ({f"i/{part}": ids, f"g/{part}": nan}, r"dynamic table 'weights' partition 0: the gradient of id 8")):
        with pytest.raises(RpcError, match=error):
            client.channels[0].call("Push", {"grads": [[part, "sparse"]], "step": True}, arrays)
    assert [_tables(client.stats(i)) for i in (0, 1)] == counts
    np.testing.assert_array_equal(client.pull({"weights": ids})["weights"], before)
    client.shutdown_servers()
    client.close()
    # A capacity of 0: the API refuses the table by name before anything is sent; so does the CLI, in one line.
    model, _ = build_model(config, handle.cluster)
    model.variables = lambda: [VariableSpec("emb", (0, 4), dynamic={"capacity_rows": 0})]  # type: ignore[method-assign]
    with pytest.raises(ModelError, match=r"dynamic table 'emb': capacity_rows must be an int >= 1, got 0"):
        declare_variables(model, replica_device_setter(cluster=handle.cluster))
    r = run_cli("train", "--train", str(A9A), "--embedding-table", "dynamic", "--capacity", "0", "--in-process")
    assert r.returncode != 0 and "--capacity must be an int >= 1, got 0" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("train", "--train", str(A9A), "--capacity", "10", "--in-process")
    assert r.returncode != 0 and "add --embedding-table dynamic" in r.stderr


@pytest.mark.parametrize("extra", [["--mode", "sync", "--workers", "2"], ["--workers", "2"], ["--in-process"]])
def test_cli_runs_train_dynamic_tables_in_every_mode_and_report_them(tmp_path: Path, extra: list[str]) -> None:
    out = tmp_path / "run"
    r = run_cli("train", "--train", str(A9A), "--eval", str(A9A_T), "--model", "fm", "--embedding-table", "dynamic",
                "--admit-after", "2", "--capacity", "100", "--ps", "2", "--epochs", "1", "--output", str(out), *extra)
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    tables = metrics["dynamic_tables"]
    assert set(tables) == {"linear", "embedding"}
    assert all(t["rows"] <= t["row_limit"] == 100 for t in tables.values()), tables
    assert all(t["evicted_capacity"] > 0 and t["rejected_lookups"] > 0 for t in tables.values()), tables
    assert re.search(r"dynamic table 'embedding': \d+ rows .* admitted, [\d,]+ lookups of ids not admitted", r.stderr)
    assert metrics["eval"]["auc"] > 0.8  # a9a: the static table gets ~0.90


def test_a_killed_ps_task_is_restored_with_its_share_of_the_tables(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_cli("train", "--train", str(A9A), "--eval", str(A9A_T), "--model", "fm", "--embedding-table", "dynamic",
                "--admit-after", "2", "--epochs", "4", "--batch-size", "256", "--checkpoint-dir", str(tmp_path / "ckpt"),
                "--save-checkpoints-steps", "50", "--restart-policy", "on-failure", "--chaos", "kill:ps:1@step=150",
                "--output", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    log = (out / "logs" / "worker-0.log").read_text()
    assert re.search(r"restored checkpoint \S+ \(step \d+\) onto every ps task", log), log[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["dynamic_tables"]["embedding"]["rows"] == 123  # every a9a id has its row again, on its owner
    assert metrics["eval"]["auc"] > 0.85


def test_a_promoted_backup_reports_the_tables_admissions_and_evictions(tmp_path: Path) -> None:
    """--ps-replicas 1, shard 0's primary killed mid-run: the promoted backup held the rows but counted from zero,
    so metrics.json said 56 rows admitted and 26 evicted of a table holding 60 (the unreplicated run: 105 and 45).
    Every row was admitted once and is held or was evicted: admitted - evicted == rows, table by table."""
    out = tmp_path / "run"
    r = run_cli("train", "--train", str(A9A), "--model", "fm", "--embedding-table", "dynamic", "--capacity", "60",
                "--ps", "2", "--workers", "2", "--epochs", "2", "--ps-replicas", "1", "--restart-policy", "on-failure",
                "--chaos", "kill:ps:0@step=60", "--output", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["faults"] and metrics["shards"][0]["primary"] == "/job:ps_backup/task:0", metrics["shards"]
    for name, t in metrics["dynamic_tables"].items():
        assert t["rows"] == 60 and t["evicted_capacity"] > 0, (name, t)
        assert t["admitted"] - t["evicted_capacity"] - t["evicted_ttl"] == t["rows"], (name, t)


def test_a_restore_within_the_run_ages_no_row_by_the_steps_it_skipped(tmp_path: Path) -> None:
    """A ps task killed mid-run is restored from the checkpoint of step S, and the run goes on after the last step
    handed out, G (no step value is taken twice): the step values S+1..G belong to no push of the restored history,
    yet they aged every restored row. With --ttl-steps 50 and each id used every 40 steps (1 worker, 2,000 records of
    batch 50), an undisturbed run evicts nothing; with the kill (G - S >= 15 here) the old code evicted every row
    whose uses spanned the restore (rows used every 40 + 15 or more steps), trained again from zero."""
    records = 2000
    data = tmp_path / "unique.libsvm"  # record r: two shared ids and one of its own
    data.write_text("".join(f"{r % 2} 1:1 2:1 {100_000 + r}:1\n" for r in range(records)))
    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    r = run_cli("train", "--train", str(data), "--embedding-table", "dynamic", "--ttl-steps", "50", "--optimizer",
                "adagrad", "--ps", "2", "--workers", "1", "--epochs", "3", "--batch-size", "50", "--checkpoint-dir",
                str(ckpt), "--save-checkpoints-steps", "40", "--full-checkpoint-every", "1", "--restart-policy",
                "on-failure", "--chaos", "kill:ps:1@step=55", "--quiet", "--no-status", "--output", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    log = (out / "logs" / "worker-0.log").read_text()
    found = re.search(r"restored checkpoint \S+ \(step (\d+)\) onto every ps task; generation \d+, global_step (\d+)", log)
    assert found, log[-3000:]
    assert int(found[2]) - int(found[1]) >= 15, found[0]  # the kill fired at step 55 or later, after the save of 40
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["examples"] == 3 * records
    assert metrics["dynamic_tables"]["weights"]["evicted_ttl"] == 0, metrics["dynamic_tables"]
    latest = ckpt / json.loads((ckpt / "checkpoint").read_text())["latest"]
    manifest = read_manifest(str(latest))
    saved = manifest.variables["weights"]["partitions"]
    table = saved_table(ShardFiles(str(latest), manifest), "weights", saved, 1)[0]
    own = table["ids"] >= 100_000
    assert int(own.sum()) == records  # every record's own row is held, and was never evicted and admitted again:
    assert int(table["frequency"][own].min()) >= 3, np.unique(table["frequency"][own], return_counts=True)
