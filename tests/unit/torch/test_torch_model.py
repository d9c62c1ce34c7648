"""psflow.torch: embedding lookups match TF's semantics, a module's variables and gradients, and what is refused."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support import REPO  # noqa: E402

import psflow.torch.embedding as embedding_module  # noqa: E402
from psflow.data import Batch, BatchSpec, SparseColumn  # noqa: E402
from psflow.gradients import DenseGradient, SparseGradient  # noqa: E402
from psflow.models import EmbeddingLookup, ModelConfig, ModelError, create_model  # noqa: E402
from psflow.optim import OptimizerSpec  # noqa: E402
from psflow.torch import Embedding, EmbeddingCollection, Inputs, ParamGroup, TorchModel  # noqa: E402
from psflow.torch.embedding import LookupPlan  # noqa: E402

VOCAB = {"a": 9, "b": 5, "c": 13}


def random_batch(rng: np.random.Generator, n: int, dense: int = 3, *, one_id: bool = False) -> Batch:
    """Up to 3 ids per field and example (``one_id``: exactly one, as Criteo's fields have)."""
    sparse = {}
    for name, vocab in VOCAB.items():
        counts = np.ones(n, dtype=np.int64) if one_id else rng.integers(0, 4, n)
        if not one_id:
            counts[0] = 0  # an example without ids in every field
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        values = rng.uniform(0.5, 2.0, indptr[-1]).astype(np.float32)
        if not one_id:
            values[::7] = 0.0  # TF prunes ids of weight <= 0 in a weighted lookup
        sparse[name] = SparseColumn(indptr, rng.integers(0, vocab, indptr[-1]).astype(np.int64), values)
    dense_features = {f"d{i}": rng.normal(size=n).astype(np.float32) for i in range(dense)}
    return Batch(rng.integers(0, 2, n).astype(np.float32), sparse, dense_features)


@pytest.mark.parametrize("one_id", [False, True], ids=["ragged", "one-id-each"])
@pytest.mark.parametrize("pooling", ["concat", "sum"])
def test_collection_is_tfs_lookup_per_table_forward_and_backward(pooling: str, one_id: bool) -> None:
    rng = np.random.default_rng(3)
    batch = random_batch(rng, 40, one_id=one_id)
    specs = [("t/a", Embedding("a", 9, 4, combiner="sum", weighted=True)), ("t/b", Embedding("b", 5, 4, combiner="mean")),
             ("t/c", Embedding("c", 13, 4, combiner="sqrtn", weighted=True))]
    collection = EmbeddingCollection([e for _, e in specs], pooling=pooling)
    plan = LookupPlan.build(batch, specs, concat=pooling == "concat")
    # Bags of equal size are summed by a reshape: one id per field gives 1 (concat) or 3 (sum) entries per bag.
    assert plan.entries_per_bag == ((1 if pooling == "concat" else 3) if one_id else 0)
    assert dataclasses.replace(plan, per_bag=-1).entries_per_bag == plan.entries_per_bag  # found by build = computed
    assert LookupPlan.from_extras(plan.to_extras("g"), "g", plan.tables).per_bag == plan.per_bag  # travels with the batch
    tables = {name: rng.normal(size=(e.num_embeddings, 4)) for name, e in specs}
    rows = {name: torch.tensor(tables[name][ids], dtype=torch.float64, requires_grad=True)
            for name, ids in zip(plan.tables, plan.ids, strict=True)}
    plan64 = LookupPlan(plan.tables, plan.ids, plan.index, plan.weights.astype(np.float64), plan.bags,  # type: ignore[arg-type]
                        plan.num_examples, plan.concat)
    stacked = torch.cat([rows[name] for name in plan.tables])  # as TorchModel stacks a group's pulled rows
    out = Inputs(batch, {id(collection): plan64}, {id(collection): stacked}, []).lookup(collection)
    d_out = rng.normal(size=tuple(out.shape))
    (out * torch.from_numpy(d_out)).sum().backward()

    parts, grads = [], {}
    for k, (name, e) in enumerate(specs):
        column = batch.column(e.feature)
        ref = EmbeddingLookup.build(column.indptr, column.ids, column.values if e.weighted else None, table=name,
                                    vocabulary=e.num_embeddings, combiner=e.combiner)
        np.testing.assert_array_equal(ref.ids, plan.ids[k])
        parts.append(ref.forward(tables[name][ref.ids]))
        d_part = d_out[:, 4 * k:4 * (k + 1)] if pooling == "concat" else d_out
        grads[name] = ref.backward(d_part)
    want = np.concatenate(parts, axis=1) if pooling == "concat" else sum(parts)
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-6, atol=1e-7)  # scales are float32
    for name in plan.tables:
        np.testing.assert_allclose(rows[name].grad.numpy(), grads[name], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("one_id", [False, True], ids=["ragged-pruned", "one-id-each"])
def test_groups_over_the_same_features_share_unique_ids_and_get_the_same_plans(one_id: bool) -> None:
    # Wide & Deep: a weighted sum-pooled group and a mean concat group over the same fields.
    batch = random_batch(np.random.default_rng(5), 30, one_id=one_id)
    wide = [(f"w/{f}", Embedding(f, v, 1, combiner="sum", weighted=True)) for f, v in VOCAB.items()]
    deep = [(f"d/{f}", Embedding(f, v, 4, combiner="mean")) for f, v in VOCAB.items()]
    cache: dict[object, object] = {}
    shared = [LookupPlan.build(batch, wide, concat=False, cache=cache), LookupPlan.build(batch, deep, concat=True, cache=cache)]
    alone = [LookupPlan.build(batch, wide, concat=False), LookupPlan.build(batch, deep, concat=True)]
    # One id each: found once, shared. Ragged: the weighted group pruned ids, so the groups differ and share nothing.
    assert all((x is y) == one_id for x, y in zip(shared[0].ids, shared[1].ids, strict=True))
    for a, b in zip(shared, alone, strict=True):
        for x, y in zip(a.ids, b.ids, strict=True):
            np.testing.assert_array_equal(x, y)
        for field in ("index", "weights", "bags"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


def test_an_id_outside_the_table_names_feature_table_and_id() -> None:
    batch = Batch(np.zeros(2, np.float32), {"a": SparseColumn(np.array([0, 1, 2]), np.array([3, 9]), np.ones(2, np.float32))}, {})
    with pytest.raises(ModelError, match=r"feature 'a': id 9 \(example 1 of the batch\) is outside the vocabulary of table 't/a'"):
        LookupPlan.build(batch, [("t/a", Embedding("a", 9, 2))], concat=True)


def numpy_values(model: TorchModel, batch: Batch, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random values for every variable the model looks up for ``batch`` (rows for tables, whole for the rest)."""
    shapes = {s.name: s.shape for s in model.variables()}
    values = {}
    for name, ids in model.lookups(batch).items():
        whole = rng.normal(scale=0.3, size=shapes[name]).astype(np.float32)
        values[name] = whole if ids is None else whole[ids]
    return values


def test_wide_deep_on_torch_computes_what_the_numpy_model_computes() -> None:
    """The built-in PyTorch wide_deep and the numpy example model (TF-golden-checked) give the same loss and gradients."""
    rng = np.random.default_rng(5)
    spec = BatchSpec(VOCAB, {"d0": 1, "d1": 1, "d2": 1})
    params = {"hidden": [6, 5], "combiners": {"a": "sum", "b": "mean", "c": "sqrtn"}, "weighted": ["c"]}
    config = ModelConfig(spec, embedding_dim=4, params=params)
    mine = create_model("wide_deep", config)
    ref = create_model("examples.wide_deep_numpy:WideDeep", config, search_path=str(REPO))
    assert sorted((s.name, s.shape) for s in mine.variables()) == sorted((s.name, s.shape) for s in ref.variables())
    batch = random_batch(rng, 32)
    mine_batch, ref_batch = mine.prepare(batch), ref.prepare(batch)
    values = numpy_values(mine, mine_batch, rng)
    assert {k: None if v is None else list(v) for k, v in mine.lookups(mine_batch).items()} == \
        {k: None if v is None else list(v) for k, v in ref.lookups(ref_batch).items()}
    got, want = mine.compute(mine_batch, values), ref.compute(ref_batch, values)
    assert got.loss == pytest.approx(want.loss, rel=1e-6)
    np.testing.assert_allclose(got.outputs["logits"], want.outputs["logits"], rtol=1e-5, atol=1e-6)
    assert set(got.gradients) == set(want.gradients)
    for name, g in got.gradients.items():
        w = want.gradients[name]
        assert type(g) is type(w), name
        if isinstance(g, SparseGradient):
            assert isinstance(w, SparseGradient)
            np.testing.assert_array_equal(g.rows, w.rows)
        np.testing.assert_allclose(g.values, w.values, rtol=1e-4, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(mine.predict(mine_batch, values)["predictions"], want.outputs["predictions"], rtol=1e-5)


class _Net(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.emb = Embedding("a", 9, 3, name="emb_a")
        self.mlp = torch.nn.Sequential(torch.nn.Linear(3 + width, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))

    def forward(self, inputs: Inputs) -> torch.Tensor:
        out: torch.Tensor = self.mlp(torch.cat([self.emb(inputs), inputs.dense()], dim=1)).squeeze(1)
        return out


class UserModel(TorchModel):
    def build(self) -> torch.nn.Module:
        return _Net(self.config.features.dense_width)

    def param_groups(self) -> list[ParamGroup]:
        net = self.module
        return [ParamGroup(net.mlp[0], {"name": "adagrad", "hyperparameters": {"learning_rate": 0.1}}),
                ParamGroup([net.emb, net.mlp[2].bias], OptimizerSpec("sgd", {"learning_rate": 0.5}))]


def test_a_users_module_its_variables_initial_values_and_optimizers() -> None:
    config = ModelConfig(BatchSpec(VOCAB, {"d0": 1, "d1": 1}), seed=4)
    model = UserModel(config)
    specs = {s.name: s for s in model.variables()}
    assert list(specs) == ["emb_a", "mlp/0/weight", "mlp/0/bias", "mlp/2/weight", "mlp/2/bias"]
    assert specs["emb_a"].shape == (9, 3) and specs["mlp/0/weight"].shape == (4, 5)
    assert {n: s.optimizer.name if s.optimizer else None for n, s in specs.items()} == {
        "emb_a": "sgd", "mlp/0/weight": "adagrad", "mlp/0/bias": "adagrad", "mlp/2/weight": None, "mlp/2/bias": "sgd"}
    # The module as built (seeded) is what the chief loads; every process builds the same one.
    values = model.initial_values()
    assert sorted(values) == ["mlp/0/bias", "mlp/0/weight", "mlp/2/bias", "mlp/2/weight"]
    again = UserModel(config).initial_values()
    for name, value in values.items():
        np.testing.assert_array_equal(value, again[name])
    assert not np.array_equal(values["mlp/0/weight"], UserModel(ModelConfig(config.features, seed=5)).initial_values()["mlp/0/weight"])
    batch = model.prepare(random_batch(np.random.default_rng(0), 16, dense=2))
    out = model.compute(batch, numpy_values(model, batch, np.random.default_rng(1)))
    assert isinstance(out.gradients["emb_a"], SparseGradient) and isinstance(out.gradients["mlp/0/weight"], DenseGradient)
    assert out.gradients["mlp/0/weight"].values.shape == (4, 5)


def test_what_a_torch_model_refuses() -> None:
    class WithBuffers(TorchModel):
        def build(self) -> torch.nn.Module:
            return torch.nn.BatchNorm1d(3)

    with pytest.raises(ModelError, match=r"module buffers \(running_mean, running_var, num_batches_tracked\)"):
        WithBuffers(ModelConfig())

    class TwoCollections(TorchModel):
        def build(self) -> torch.nn.Module:
            e = Embedding("a", 9, 2)
            m = torch.nn.Module()
            m.one, m.two = EmbeddingCollection([e]), EmbeddingCollection([e])
            return m

    with pytest.raises(ModelError, match="is in two embedding collections"):
        TwoCollections(ModelConfig())
    with pytest.raises(ModelError, match="combiner must be one of sum, mean, sqrtn"):
        Embedding("a", 9, 2, combiner="max")
    model = create_model("dnn", ModelConfig(BatchSpec(VOCAB, {}), embedding_dim=2, params={"hidden": [3]}))
    with pytest.raises(ModelError, match="the batch was not prepared"):
        model.lookups(random_batch(np.random.default_rng(0), 4))
    with pytest.raises(ModelError, match="name features"):
        create_model("wide_deep", ModelConfig(BatchSpec(VOCAB, {}), params={"weighted": ["zz"]}))
    with pytest.raises(ModelError, match="--deep-optimizer"):
        create_model("dnn", ModelConfig(BatchSpec(VOCAB, {}), params={"deep_optimizer": {"name": "adagrad",
                                                                                           "hyperparameters": {"rho": 1}}}))


def test_builtin_models_default_optimizers_are_tfs_dnn_linear_combined_but_the_wide_rate() -> None:
    """TF's DNNLinearCombinedClassifier optimizers, but the wide part's FTRL rate 0.3, between TF's min(0.2,
    1/sqrt(39)) = 0.16 (0.03 AUC under logistic on the Criteo sample at batch 512: issue 25, item 11) and
    --model logistic's 0.5 (~0.009 under TF's on the 200,000-row W&D workload)."""
    config = ModelConfig(BatchSpec({f"C{i}": 100 for i in range(26)}, {f"I{i}": 1 for i in range(13)}))
    for name, linear in (("wide_deep", "wide"), ("deepfm", "linear")):
        specs = {s.name: s for s in create_model(name, config).variables()}
        ftrl = specs[f"{linear}/C1"].optimizer
        assert ftrl is not None and ftrl.name == "ftrl"
        assert ftrl.hyperparameters["learning_rate"] == 0.3
        assert ftrl.hyperparameters["initial_accumulator_value"] == 0.1
        assert ftrl.hyperparameters["learning_rate_power"] == -0.5
        assert [specs[f"{linear}/{v}"].optimizer for v in ("C25", "dense", "bias")] == [ftrl] * 3
        adagrad = specs["deep/layer0/kernel"].optimizer
        assert adagrad is not None and adagrad.to_json() == {"name": "adagrad", "hyperparameters": {
            "learning_rate": 0.05, "initial_accumulator_value": 0.1}}
        assert specs["deep/layer0/kernel"].shape == (26 * 8 + 13, 256)
        assert specs["deep/layer2/kernel"].shape == (128, 1)
    given = ModelConfig(config.features, params={"wide_optimizer": {"name": "ftrl", "hyperparameters": {"learning_rate": 0.1}}})
    ftrl = {s.name: s for s in create_model("wide_deep", given).variables()}["wide/C1"].optimizer
    assert ftrl is not None and ftrl.hyperparameters["learning_rate"] == 0.1
    assert ftrl.hyperparameters["initial_accumulator_value"] == 0.1  # the default's, kept


def test_partition_min_rows_keeps_small_tables_whole() -> None:
    features = BatchSpec({"small": 50, "large": 20_000}, {"I1": 1})
    def parts(params: dict[str, object]) -> dict[str, object]:
        specs = create_model("wide_deep", ModelConfig(features, partitions=3, params=params)).variables()
        return {s.name: s.partitioner for s in specs if s.name.endswith(("small", "large"))}
    split = parts({})
    assert all(p is not None for p in split.values())  # default: every table split by --partitions
    kept = parts({"partition_min_rows": 10_000})
    assert kept["wide/small"] is None and kept["deep/emb_small"] is None
    assert kept["wide/large"] is not None and kept["deep/emb_large"] is not None
    with pytest.raises(ModelError, match="partition_min_rows must be >= 0"):
        parts({"partition_min_rows": -1})


def test_without_pytorch_a_torch_model_says_which_extra_to_install() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "from psflow.models import create_model, ModelConfig\n"
            "try:\n    create_model('wide_deep', ModelConfig())\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout == "ModelError model 'wide_deep' needs torch: pip install 'psflow[torch]'\n", r


def test_the_launchers_thread_variable_is_psflow_torchs() -> None:
    from psflow.torch import THREADS_ENV
    from psflow.train.config import TORCH_THREADS_ENV

    assert THREADS_ENV == TORCH_THREADS_ENV


def test_one_id_per_example_is_found_whether_or_not_the_columns_share_their_indptr() -> None:
    """Parsed batches share one indptr; a sliced one has one per column (Batch.slice): both are one id per example,
    and a single column with an example of 0 or 2 ids among them is not."""
    rng = np.random.default_rng(8)
    whole = random_batch(rng, 60, one_id=True)
    shared = np.arange(61, dtype=np.int64)
    parsed = Batch(whole.labels, {k: SparseColumn(shared, c.ids, c.values) for k, c in whole.sparse.items()}, whole.dense)
    specs = [(f"t/{f}", Embedding(f, v, 2)) for f, v in VOCAB.items()]
    for batch in (parsed, parsed.slice(7, 47), whole.slice(0, 60)):
        assert LookupPlan.build(batch, specs, concat=True).per_bag == 1
        assert LookupPlan.build(batch, specs, concat=False).per_bag == 3
    for ids_of_example_5 in (0, 2):
        columns = dict(parsed.sparse)
        c = columns["b"]
        counts = np.ones(60, dtype=np.int64)
        counts[5] = ids_of_example_5
        ids = np.repeat(c.ids, counts)
        columns["b"] = SparseColumn(np.concatenate([[0], np.cumsum(counts)]), ids, np.ones(ids.size, np.float32))
        batch = Batch(parsed.labels, columns, parsed.dense)
        assert LookupPlan.build(batch, specs, concat=True).per_bag == 0
        assert LookupPlan.build(batch, specs, concat=False).per_bag == 0


@pytest.mark.parametrize("combiners", [("sum", "mean", "sqrtn"), ("mean", "mean", "mean"), ("sqrtn", "sum", "sqrtn")])
@pytest.mark.parametrize("concat", [True, False], ids=["concat", "sum-pooled"])
def test_a_one_id_batchs_plan_is_the_general_paths_bit_for_bit(combiners: tuple[str, ...], concat: bool,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """With one id per example (Criteo's fields) the plan takes a short path (a transpose for the order by bag,
    bags written out, only the combiners' sums it needs): the same arrays as the general path's sort."""
    rng = np.random.default_rng(12)
    batch = random_batch(rng, 50, one_id=True)
    columns = {k: SparseColumn(c.indptr, c.ids, rng.uniform(0.5, 2.0, c.ids.size).astype(np.float32))
               for k, c in batch.sparse.items()}  # positive weights: nothing pruned
    batch = Batch(batch.labels, columns, batch.dense)
    specs = [(f"t/{f}", Embedding(f, v, 2, combiner=c, weighted=i != 1))
             for i, ((f, v), c) in enumerate(zip(VOCAB.items(), combiners, strict=True))]
    fast = LookupPlan.build(batch, specs, concat=concat)
    monkeypatch.setattr(embedding_module, "_one_per_example", lambda indptrs, n: False)
    general = LookupPlan.build(batch, specs, concat=concat)
    assert fast.per_bag == general.per_bag == (1 if concat else 3)
    for name in ("index", "weights", "bags"):
        a, b = getattr(fast, name), getattr(general, name)
        assert a.dtype == b.dtype and a.flags.c_contiguous, name
        np.testing.assert_array_equal(a, b, err_msg=name)
    # The scales against the formulas with every sum computed: sum -> w, mean -> w / sum(w), sqrtn -> w / |w|.
    w = np.stack([batch.sparse[f].values.astype(np.float64) if i != 1 else np.ones(50) for i, f in enumerate(VOCAB)])
    want = np.stack([w[i] if c == "sum" else w[i] / (w[i] if c == "mean" else np.sqrt(w[i] * w[i]))
                     for i, c in enumerate(combiners)]).astype(np.float32)
    np.testing.assert_array_equal(fast.weights, want.T.reshape(-1))


@pytest.mark.parametrize("combiners", [("sum", "mean", "sqrtn"), ("mean", "mean", "mean"), ("sqrtn", "sqrtn", "sqrtn")])
@pytest.mark.parametrize("concat", [True, False], ids=["concat", "sum-pooled"])
def test_an_unweighted_one_id_batch_scales_every_entry_by_one_as_the_general_path(
        combiners: tuple[str, ...], concat: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unweighted, one id per example (W&D's deep tables): each (table, example) holds one entry of weight 1, so
    every combiner scales it by 1 and the plan skips the sums; the general path's sums give the same bits."""
    batch = random_batch(np.random.default_rng(13), 40, one_id=True)
    specs = [(f"t/{f}", Embedding(f, v, 2, combiner=c)) for (f, v), c in zip(VOCAB.items(), combiners, strict=True)]
    fast = LookupPlan.build(batch, specs, concat=concat)
    monkeypatch.setattr(embedding_module, "_one_per_example", lambda indptrs, n: False)
    general = LookupPlan.build(batch, specs, concat=concat)
    for name in ("index", "weights", "bags"):
        a, b = getattr(fast, name), getattr(general, name)
        assert a.dtype == b.dtype, name
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert fast.weights.dtype == np.float32 and (fast.weights == 1.0).all()
