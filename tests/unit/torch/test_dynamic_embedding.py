"""psflow.torch on dynamic tables: embeddings keyed by any int64 id (issue #14).

A dynamic table's lookup of raw ids must give exactly what a static table gives on the same ids
renumbered ``0..k-1`` (same rows, bit for bit); models declare dynamic tables ``(0, dim)`` with
their options and no partitioner; static and dynamic tables mix in one model.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from psflow.data import Batch, BatchSpec, SparseColumn  # noqa: E402
from psflow.gradients import DenseGradient, SparseGradient  # noqa: E402
from psflow.models import ModelConfig, ModelError, create_model  # noqa: E402
from psflow.models.api import DYNAMIC_TABLE_PARAM  # noqa: E402
from psflow.torch import Embedding, EmbeddingCollection, Inputs, TorchModel  # noqa: E402
from psflow.torch.embedding import LookupPlan  # noqa: E402

I64 = np.iinfo(np.int64)
#: Ids a dynamic table must take: both ends of int64, negative ones, ones past 2^62, a few small ones.
ODD_IDS = np.array([I64.min, I64.min + 1, -(1 << 62) - 3, -123456789, -1, 0, 1, 7, 1 << 40, (1 << 62) + 1,
                    (1 << 62) + 12345, I64.max - 1, I64.max], dtype=np.int64)
FIELDS = ("a", "b", "c")
OPTIONS = {"capacity_rows": 1000, "admit_after": 2}


def paired_batches(rng: np.random.Generator, n: int, *, one_id: bool) -> tuple[Batch, Batch, dict[str, np.ndarray]]:
    """A batch of ids ``0..k-1`` per field, the same batch with each id ``i`` replaced by ``raw[f][i]``
    (a shuffled :data:`ODD_IDS`), and ``raw``."""
    static, dynamic, raw = {}, {}, {}
    k = ODD_IDS.size
    for f in FIELDS:
        raw[f] = rng.permutation(ODD_IDS)
        counts = np.ones(n, dtype=np.int64) if one_id else rng.integers(0, 4, n)
        if not one_id:
            counts[0] = 0  # an example without ids
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        values = rng.uniform(0.5, 2.0, indptr[-1]).astype(np.float32)
        if not one_id:
            values[::5] = 0.0  # pruned from a weighted lookup
        ids = rng.integers(0, k, indptr[-1]).astype(np.int64)
        static[f] = SparseColumn(indptr, ids, values)
        dynamic[f] = SparseColumn(indptr, raw[f][ids], values)
    labels = rng.integers(0, 2, n).astype(np.float32)
    dense = {f"d{i}": rng.normal(size=n).astype(np.float32) for i in range(2)}
    return Batch(labels, static, dense), Batch(labels, dynamic, dense), raw


def table_rows(rng: np.random.Generator, names: list[str], dim: int) -> dict[str, np.ndarray]:
    """A whole table ``[k, dim]`` per name: row ``i`` is the row of static id ``i`` and of raw id ``raw[f][i]``."""
    return {name: rng.normal(size=(ODD_IDS.size, dim)).astype(np.float32) for name in names}


def dynamic_rows(whole: np.ndarray, raw: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The rows of raw ``ids`` (what the ps tasks return for a dynamic table)."""
    position = {int(r): i for i, r in enumerate(raw)}
    return whole[[position[int(i)] for i in ids]]


@pytest.mark.parametrize("one_id", [False, True], ids=["ragged-pruned", "one-id-each"])
@pytest.mark.parametrize("pooling", ["concat", "sum"])
def test_a_dynamic_lookup_of_raw_ids_is_the_static_lookup_of_renumbered_ids(pooling: str, one_id: bool) -> None:
    rng = np.random.default_rng(11)
    static_batch, dynamic_batch, raw = paired_batches(rng, 50, one_id=one_id)
    combiners = {"a": "sum", "b": "mean", "c": "sqrtn"}
    weighted = {"a": True, "b": False, "c": True}

    def specs(dynamic: dict[str, int] | None) -> list[tuple[str, Embedding]]:
        return [(f"t/{f}", Embedding(f, 0 if dynamic is not None else ODD_IDS.size, 4, combiner=combiners[f],
                                     weighted=weighted[f], dynamic=dynamic)) for f in FIELDS]

    whole = table_rows(rng, [f"t/{f}" for f in FIELDS], 4)
    d_out = None
    results = []
    for batch, dynamic in ((static_batch, None), (dynamic_batch, OPTIONS)):
        group = specs(dynamic)
        plan = LookupPlan.build(batch, group, concat=pooling == "concat")
        for ids in plan.ids:  # each table's ids sorted and unique
            assert ids.dtype == np.int64 and np.all(np.diff(ids) > 0)
        collection = EmbeddingCollection([e for _, e in group], pooling=pooling)
        rows = {}
        for (name, e), ids in zip(group, plan.ids, strict=True):
            values = whole[name][ids] if dynamic is None else dynamic_rows(whole[name], raw[e.feature], ids)
            rows[name] = torch.from_numpy(values).requires_grad_(True)
        stacked = torch.cat([rows[name] for name in plan.tables])  # as TorchModel stacks a group's pulled rows
        out = Inputs(batch, {id(collection): plan}, {id(collection): stacked}, []).lookup(collection)
        if d_out is None:
            d_out = torch.from_numpy(rng.normal(size=tuple(out.shape)).astype(np.float32))
        (out * d_out).sum().backward()
        results.append((plan, out.detach().numpy(), {name: r.grad.numpy() for name, r in rows.items()}))
    (static_plan, static_out, static_grads), (dynamic_plan, dynamic_out, dynamic_grads) = results
    # The same ids, renamed: raw[f] of the static ids, and each entry's scale and bag unchanged.
    for f, s_ids, d_ids in zip(FIELDS, static_plan.ids, dynamic_plan.ids, strict=True):
        assert sorted(raw[f][s_ids].tolist()) == d_ids.tolist()
    np.testing.assert_array_equal(dynamic_plan.weights, static_plan.weights)
    np.testing.assert_array_equal(dynamic_plan.bags, static_plan.bags)
    np.testing.assert_array_equal(dynamic_out, static_out)  # bit for bit
    for f in FIELDS:
        name = f"t/{f}"
        s_ids, d_ids = static_plan.ids[FIELDS.index(f)], dynamic_plan.ids[FIELDS.index(f)]
        by_raw = dict(zip(raw[f][s_ids].tolist(), static_grads[name], strict=True))
        np.testing.assert_array_equal(dynamic_grads[name], np.array([by_raw[i] for i in d_ids.tolist()]).reshape(-1, 4))


def test_groups_over_the_same_dynamic_tables_share_unique_ids() -> None:
    _, batch, _ = paired_batches(np.random.default_rng(2), 30, one_id=True)
    wide = [(f"w/{f}", Embedding(f, 0, 1, combiner="sum", weighted=True, dynamic=OPTIONS)) for f in FIELDS]
    deep = [(f"d/{f}", Embedding(f, 0, 4, dynamic={})) for f in FIELDS]
    static = [(f"s/{f}", Embedding(f, 1 << 20, 4)) for f in FIELDS]
    cache: dict[object, object] = {}
    shared = [LookupPlan.build(batch, group, concat=True, cache=cache) for group in (wide, deep)]
    assert all(x is y for x, y in zip(shared[0].ids, shared[1].ids, strict=True))  # found once
    alone = LookupPlan.build(batch, deep, concat=True)
    for x, y in zip(shared[1].ids, alone.ids, strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(shared[1].index, alone.index)
    # A static group over the same features shares nothing with them (its ids are checked against its vocabulary).
    with pytest.raises(ModelError, match=r"is outside the vocabulary of table 's/a'"):
        LookupPlan.build(batch, static, concat=True, cache=cache)


def test_a_group_mixing_static_and_dynamic_tables() -> None:
    rng = np.random.default_rng(4)
    static_batch, dynamic_batch, raw = paired_batches(rng, 20, one_id=False)
    # "a" keyed by raw ids (dynamic), "b" and "c" by 0..k-1 (static): one batch with both.
    batch = Batch(static_batch.labels, {"a": dynamic_batch.column("a"), "b": static_batch.column("b"),
                                        "c": static_batch.column("c")}, {})
    mixed = [("t/a", Embedding("a", 0, 3, dynamic=OPTIONS)), ("t/b", Embedding("b", ODD_IDS.size, 3)),
             ("t/c", Embedding("c", ODD_IDS.size, 3, combiner="sum", weighted=True))]
    everything_static = [("t/a", Embedding("a", ODD_IDS.size, 3)), *mixed[1:]]
    got, want = LookupPlan.build(batch, mixed, concat=True), LookupPlan.build(static_batch, everything_static, concat=True)
    assert sorted(raw["a"][want.ids[0]].tolist()) == got.ids[0].tolist()
    for t in (1, 2):
        np.testing.assert_array_equal(got.ids[t], want.ids[t])
    for part in ("weights", "bags"):
        np.testing.assert_array_equal(getattr(got, part), getattr(want, part))
    # A static table still refuses an id outside its vocabulary (naming it); the dynamic one takes any.
    b = batch.column("b")
    bad_ids = b.ids.copy()
    bad_ids[0] = -1
    bad = Batch(batch.labels, {**batch.sparse, "b": SparseColumn(b.indptr, bad_ids, b.values)}, {})
    with pytest.raises(ModelError, match=r"feature 'b': id -1 \(example \d+ of the batch\) is outside the vocabulary "
                                         r"of table 't/b' \(13 rows\)"):
        LookupPlan.build(bad, mixed, concat=True)


class _MixedNet(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fixed = Embedding("b", ODD_IDS.size, 3, name="fixed_b")                # static
        self.own = Embedding("a", 0, 3, name="own_a", dynamic={"capacity_rows": 50})  # its own options
        self.pair = EmbeddingCollection([Embedding("a", 0, 2, name="pair_a", dynamic=OPTIONS),
                                         Embedding("c", ODD_IDS.size, 2, name="pair_c")])
        self.head = torch.nn.Linear(3 + 3 + 4 + width, 1)

    def forward(self, inputs: Inputs) -> torch.Tensor:
        x = torch.cat([self.fixed(inputs), self.own(inputs), self.pair(inputs), inputs.dense()], dim=1)
        out: torch.Tensor = self.head(x).squeeze(1)
        return out


class MixedModel(TorchModel):
    def build(self) -> torch.nn.Module:
        return _MixedNet(self.config.features.dense_width)


def test_a_users_model_declares_dynamic_tables_and_mixes_them_with_static_ones() -> None:
    features = BatchSpec(dict.fromkeys(FIELDS, ODD_IDS.size), {"d0": 1, "d1": 1})
    model = MixedModel(ModelConfig(features, partitions=3, seed=2))
    specs = {s.name: s for s in model.variables()}
    assert specs["own_a"].shape == (0, 3) and specs["own_a"].dynamic == {"capacity_rows": 50}
    assert specs["pair_a"].shape == (0, 2) and specs["pair_a"].dynamic == OPTIONS
    for name in ("own_a", "pair_a"):
        assert specs[name].partitioner is None  # spread over the ps tasks by id
        assert specs[name].initializer["name"] == "truncated_normal"
    for name in ("fixed_b", "pair_c"):
        assert specs[name].dynamic is None and specs[name].partitioner is not None  # --partitions 3
    assert specs["fixed_b"].shape == (ODD_IDS.size, 3)
    # One batch: "a" raw ids, "b" and "c" 0..k-1.
    static_batch, dynamic_batch, raw = paired_batches(np.random.default_rng(8), 24, one_id=False)
    batch = model.prepare(Batch(static_batch.labels, {"a": dynamic_batch.column("a"), "b": static_batch.column("b"),
                                                      "c": static_batch.column("c")}, static_batch.dense))
    lookups = model.lookups(batch)
    assert set(lookups["own_a"].tolist()) <= set(ODD_IDS.tolist())
    np.testing.assert_array_equal(lookups["own_a"], lookups["pair_a"])
    rng = np.random.default_rng(1)
    values = {name: (rng.normal(size=(ids.size, specs[name].shape[1])) if ids is not None
                     else rng.normal(size=specs[name].shape)).astype(np.float32) for name, ids in lookups.items()}
    out = model.compute(batch, values)
    for name in ("own_a", "pair_a", "fixed_b", "pair_c"):
        g = out.gradients[name]
        assert isinstance(g, SparseGradient)
        np.testing.assert_array_equal(g.rows, lookups[name])
    assert isinstance(out.gradients["head/weight"], DenseGradient)
    assert np.isfinite(out.loss)


def test_run_wide_dynamic_tables_leave_a_modules_own_options() -> None:
    features = BatchSpec(dict.fromkeys(FIELDS, ODD_IDS.size), {"d0": 1})
    run = {"capacity_rows": 7, "ttl_steps": 3}
    specs = {s.name: s for s in MixedModel(ModelConfig(features, params={DYNAMIC_TABLE_PARAM: run})).variables()}
    assert specs["own_a"].dynamic == {"capacity_rows": 50} and specs["pair_a"].dynamic == OPTIONS  # their own
    assert specs["fixed_b"].dynamic == run and specs["fixed_b"].shape == (0, 3)  # the run's
    assert specs["pair_c"].dynamic == run and specs["pair_c"].shape == (0, 2)


def field_of(table: str) -> str:
    """The feature of a built-in model's table: ``wide/a`` -> ``a``, ``deep/emb_a`` -> ``a``."""
    return table.rsplit("/", 1)[-1].removeprefix("emb_")


@pytest.mark.parametrize("name", ["wide_deep", "deepfm", "dnn"])
def test_builtin_models_on_dynamic_tables_compute_what_they_compute_on_renumbered_ids(name: str) -> None:
    features = BatchSpec(dict.fromkeys(FIELDS, ODD_IDS.size), {"d0": 1, "d1": 1})
    params = {"hidden": [5, 4], "combiners": {"a": "sum", "b": "mean", "c": "sqrtn"}, "weighted": ["c"],
              "partition_min_rows": 5}
    static = create_model(name, ModelConfig(features, embedding_dim=3, partitions=2, params=params))
    dynamic = create_model(name, ModelConfig(features, embedding_dim=3, partitions=2,
                                             params={**params, DYNAMIC_TABLE_PARAM: OPTIONS}))
    static_specs = {s.name: s for s in static.variables()}
    dynamic_specs = {s.name: s for s in dynamic.variables()}
    assert list(static_specs) == list(dynamic_specs)
    tables = [n for n in static_specs if n.startswith(("wide/", "linear/", "deep/emb_")) and field_of(n) in FIELDS]
    assert len(tables) == (3 if name == "dnn" else 6)
    for n, spec in dynamic_specs.items():
        if n in tables:
            assert spec.shape == (0, static_specs[n].shape[1]) and spec.dynamic == OPTIONS and spec.partitioner is None
            assert spec.initializer == static_specs[n].initializer and spec.optimizer == static_specs[n].optimizer
        else:
            assert spec == static_specs[n]
    rng = np.random.default_rng(6)
    static_batch, dynamic_batch, raw = paired_batches(rng, 32, one_id=False)
    static_batch, dynamic_batch = static.prepare(static_batch), dynamic.prepare(dynamic_batch)
    whole = {n: rng.normal(scale=0.3, size=(ODD_IDS.size, static_specs[n].shape[1])).astype(np.float32) for n in tables}
    dense = {n: rng.normal(scale=0.3, size=s.shape).astype(np.float32) for n, s in static_specs.items() if n not in tables}
    static_values = {n: whole[n][ids] if ids is not None else dense[n] for n, ids in static.lookups(static_batch).items()}
    dynamic_lookups = dynamic.lookups(dynamic_batch)
    dynamic_values = {n: dynamic_rows(whole[n], raw[field_of(n)], ids) if ids is not None else dense[n]
                      for n, ids in dynamic_lookups.items()}
    want, got = static.compute(static_batch, static_values), dynamic.compute(dynamic_batch, dynamic_values)
    assert got.loss == want.loss
    np.testing.assert_array_equal(got.outputs["logits"], want.outputs["logits"])
    assert set(got.gradients) == set(want.gradients)
    for n, g in got.gradients.items():
        w = want.gradients[n]
        if isinstance(g, SparseGradient):
            assert isinstance(w, SparseGradient)
            f = field_of(n)
            np.testing.assert_array_equal(g.rows, dynamic_lookups[n])
            by_raw = dict(zip(raw[f][w.rows].tolist(), w.values, strict=True))
            np.testing.assert_array_equal(g.values, np.array([by_raw[i] for i in g.rows.tolist()]).reshape(g.values.shape))
        else:
            np.testing.assert_array_equal(g.values, w.values, err_msg=n)
    np.testing.assert_array_equal(dynamic.predict(dynamic_batch, dynamic_values)["predictions"],
                                  static.predict(static_batch, static_values)["predictions"])


def test_a_dynamic_embeddings_row_count_is_no_limit_and_what_it_refuses() -> None:
    for rows in (0, 5, 1 << 40):
        e = Embedding("a", rows, 4, dynamic={})
        assert e.is_dynamic and e.dynamic == {} and "dynamic={}" in repr(e)
    assert not Embedding("a", 5, 4).is_dynamic
    with pytest.raises(ModelError, match=r"needs >= 1 rows and width, got \[0, 4\]"):
        Embedding("a", 0, 4)  # a static table needs rows
    with pytest.raises(ModelError, match=r"needs >= 1 rows and width, got \[0, 0\]"):
        Embedding("a", 0, 0, dynamic={})
    with pytest.raises(ModelError, match="dynamic must be a mapping of dynamic table options"):
        Embedding("a", 0, 4, dynamic=[("capacity_rows", 3)])  # type: ignore[arg-type]
    options = {"capacity_rows": 3}
    e = Embedding("a", 0, 4, dynamic=options)
    options["capacity_rows"] = 4
    assert e.dynamic == {"capacity_rows": 3}  # a copy
