"""Wide & Deep reproduces TensorFlow: the built-in ``wide_deep`` (PyTorch) and a user's own numpy model
(examples/wide_deep_numpy.py) against tests/data/golden/wide_deep_tf.json.

TensorFlow computed 12 steps of a small wide-and-deep model (per-field
safe_embedding_lookup_sparse with the sum / mean / sqrtn combiners, per-id
weights on C4, examples without C3 ids, two ReLU layers, FTRL on the wide part
and Adagrad on the deep part). Here the same initial values (a warm start)
and the same 12 batches (a TFRecord file with a schema) train the user model
on real ps processes over gRPC, with the tables on one ps task and
partitioned over 2 and 3: every step's loss and logits, and every variable
and optimizer slot after steps 1, 2 and 12, must match TF's (1e-5).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file
from support import REPO, TOKEN, ClusterHandle, run_cli

from psflow.checkpoint.save import CheckpointManager
from psflow.checkpoint.variables import read_variables
from psflow.data import DatasetConfig, Schema, TFRecordWriter, encode_example, open_dataset
from psflow.models import ModelConfig, create_model
from psflow.optim import OptimizerSpec
from psflow.placement import replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.rpc.api import ConnectConfig
from psflow.train.build import declare_variables
from psflow.train.chief import join_cluster
from psflow.train.step import TrainStep
from psflow.train.summary import read_scalars

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

GOLDEN = json.loads((REPO / "tests" / "data" / "golden" / "wide_deep_tf.json").read_text())
#: The built-in PyTorch model (``psflow[torch]``) and a user's own numpy one; the same names and parameters.
MODELS = [pytest.param("wide_deep", id="torch"), pytest.param("examples.wide_deep_numpy:WideDeep", id="numpy")]
RECORDED = (1, 2, 12)
RTOL, ATOL = 1e-5, 1e-6


@dataclass(frozen=True)
class GoldenFiles:
    data: Path
    schema: Path
    init: Path


def model_params() -> dict[str, Any]:
    spec = GOLDEN["model"]
    as_spec = {k: {"name": v["name"], "hyperparameters": {h: x for h, x in v.items() if h != "name"}}
               for k, v in (("wide_optimizer", spec["wide_optimizer"]), ("deep_optimizer", spec["deep_optimizer"]))}
    return {"hidden": spec["hidden"], "combiners": {f["name"]: f["combiner"] for f in spec["fields"]},
            "weighted": [f["name"] for f in spec["fields"] if f["weighted"]], **as_spec}


def write_golden(directory: Path) -> GoldenFiles:
    """The golden batches as a multi-feature TFRecord file, its schema, and the initial values."""
    spec = GOLDEN["model"]
    schema: dict[str, Any] = {"label": "label", "features": {
        "label": {"kind": "fixed", "shape": [], "dtype": "float32"},
        **{f["name"]: {"kind": "sparse", "ids_key": f["name"], "values_key": f"{f['name']}_weight",
                       "vocabulary_size": f["vocab"]} for f in spec["fields"]},
        "dense": {"kind": "fixed", "shape": [spec["dense_features"]], "dtype": "float32"},
    }}
    (directory / "schema.yaml").write_text(yaml.safe_dump(schema, sort_keys=False))
    with TFRecordWriter(str(directory / "golden.tfrecord")) as writer:
        for batch in GOLDEN["batches"]:
            for r in range(spec["batch"]):
                features: dict[str, tuple[str, Any]] = {"label": ("float32", [batch["label"][r]]),
                                                        "dense": ("float32", batch["dense"][r])}
                for f in spec["fields"]:
                    fb = batch["fields"][f["name"]]
                    mine = [j for j, row in enumerate(fb["rows"]) if row == r]
                    features[f["name"]] = ("int64", [fb["ids"][j] for j in mine])
                    features[f"{f['name']}_weight"] = ("float32", [fb["values"][j] for j in mine])
                writer.write(encode_example(features))
    save_file({k: np.asarray(v, np.float32) for k, v in GOLDEN["initial"].items()}, str(directory / "init.safetensors"))
    return GoldenFiles(directory / "golden.tfrecord", directory / "schema.yaml", directory / "init.safetensors")


def check_state(got: dict[str, np.ndarray], step: int) -> None:
    """Every variable and slot after ``step`` equals TF's."""
    want = GOLDEN["steps"][step - 1]
    for name, value in want["variables"].items():
        np.testing.assert_allclose(got[name], np.asarray(value, np.float32).reshape(got[name].shape), rtol=RTOL,
                                   atol=ATOL, err_msg=f"variable {name} after step {step}")
    for name, value in want["slots"].items():
        np.testing.assert_allclose(got[name], np.asarray(value, np.float32).reshape(got[name].shape), rtol=RTOL,
                                   atol=ATOL, err_msg=f"slot {name} after step {step}")


@pytest.fixture(scope="module")
def golden_files(tmp_path_factory: pytest.TempPathFactory) -> GoldenFiles:
    return write_golden(tmp_path_factory.mktemp("golden"))


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("num_ps", [1, 2, 3])
def test_python_api_reproduces_tensorflow(model_name: str, num_ps: int, golden_files: GoldenFiles, tmp_path: Path,
                                          local_cluster: Callable[..., ClusterHandle]) -> None:
    handle = local_cluster(num_ps)
    schema = Schema.from_file(golden_files.schema)
    config = ModelConfig(schema.batch_spec(1 << 20), partitions=num_ps, embedding_dim=GOLDEN["model"]["embedding_dim"],
                         params=model_params())
    if model_name == "wide_deep":
        pytest.importorskip("torch")
    model = create_model(model_name, config, search_path=str(REPO))
    variables = declare_variables(model, replica_device_setter(cluster=handle.cluster))
    if num_ps > 1:
        assert len(variables["deep/emb_C2"].partitions) == num_ps  # the tables really are split
    client = ParameterClient(handle.cluster, variables.placements(), client_name="/job:worker/task:0",
                             config=ConnectConfig(token=TOKEN, connect_timeout=60))
    client.connect()
    try:
        join_cluster(client, OptimizerSpec("sgd", {"learning_rate": 0.1}), chief=True,
                     warm_start_from=str(golden_files.init))
        with open_dataset(DatasetConfig((str(golden_files.data),), "tfrecord", batch_size=8, schema=schema,
                                        prefetch=0), start=True) as dataset:
            batches = list(dataset)
        assert len(batches) == len(GOLDEN["steps"])
        train_step = TrainStep(model, client)
        saver = CheckpointManager(str(tmp_path / "ckpt"), max_to_keep=10)
        for i, batch in enumerate(batches):
            result = train_step(batch, next_batch=batches[i + 1] if i + 1 < len(batches) else None)
            want = GOLDEN["steps"][i]
            assert result.step == want["step"]
            assert result.loss == pytest.approx(want["loss"], rel=RTOL)
            np.testing.assert_allclose(result.outputs["logits"], want["logits"], rtol=RTOL, atol=1e-7)
            if result.step in RECORDED:
                check_state(read_variables(saver.save(client).path, slots=True), result.step)
    finally:
        client.close()


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("num_ps", [1, 3])
def test_psflow_train_reproduces_tensorflow(model_name: str, num_ps: int, golden_files: GoldenFiles, tmp_path: Path) -> None:
    if model_name == "wide_deep":
        pytest.importorskip("torch")
    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    params = [arg for key, value in model_params().items() for arg in ("--model-param", f"{key}={json.dumps(value)}")]
    r = run_cli("train", "--model", model_name, *params, "--format", "tfrecord", "--schema", str(golden_files.schema),
                "--train", str(golden_files.data), "--embedding-dim", str(GOLDEN["model"]["embedding_dim"]),
                "--batch-size", "8", "--ps", str(num_ps), "--partitions", str(num_ps), "--workers", "1",
                "--warm-start", str(golden_files.init), "--checkpoint-dir", str(ckpt), "--save-checkpoints-steps", "1",
                "--max-to-keep", "20", "--save-summaries-steps", "1", "--log-every", "1", "--output", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["global_step"] == 12
    for step in RECORDED:
        check_state(read_variables(str(ckpt / f"ckpt-{step:09d}"), slots=True), step)
    losses = dict(read_scalars(str(out))["train/loss"])
    for want in GOLDEN["steps"]:
        assert losses[want["step"]] == pytest.approx(want["loss"], rel=RTOL)
    log = (out / "logs" / "worker-0.log").read_text()
    assert "warm-started" in log and "deep/emb_C1" in log
