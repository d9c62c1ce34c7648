"""Embedding modules whose tables live on the ps tasks.

A :class:`Embedding` is one table (``[num_embeddings, embedding_dim]``, or a
*dynamic table* keyed by any int64 id: see its ``dynamic`` argument) looked
up by one sparse feature of the batch, with TensorFlow's
``safe_embedding_lookup_sparse`` semantics (see
:mod:`psflow.models.embedding`): combiners ``sum``, ``mean`` and ``sqrtn``,
optional per-id weights (the feature's values), and a zero vector for an
example without ids. An :class:`EmbeddingCollection` looks up several such
tables at once and concatenates (``pooling="concat"``) or sums
(``pooling="sum"``) their results: one gather and one segment sum for every
table, forward and backward. The gathers of every group of a step are one
autograd node (:mod:`psflow.torch.lookup_rows`), whose backward is one
scatter-add per group.

The modules hold no rows. Per batch, :class:`~psflow.torch.TorchModel`
prepares each lookup in numpy (unique ids, per-entry scale, bags; in the
input pipeline where it can; groups over the same features, as Wide & Deep's
wide and deep tables, find their unique ids once), pulls only the rows of those ids from the
partitions holding them, runs the module on them, and pushes the gradient of
exactly those rows (a sparse gradient, each row once).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from psflow.data import Batch
from psflow.models.api import ModelError
from psflow.models.embedding import COMBINERS
from psflow.native.ids import unique_inverse
from psflow.optim import OptimizerSpec

if TYPE_CHECKING:
    from psflow.torch.inputs import Inputs

__all__ = ["Embedding", "EmbeddingCollection", "LookupPlan", "POOLINGS"]

#: How an :class:`EmbeddingCollection` combines its tables' results.
POOLINGS = ("concat", "sum")


class Embedding(nn.Module):
    """One table on the ps tasks, looked up by one sparse feature: ``forward(inputs) -> [n, embedding_dim]``.

    Args:
        feature: the batch's sparse feature that indexes the table.
        num_embeddings: rows of the table (ids must lie in ``[0, num_embeddings)``); of a dynamic
            table, no limit: ignored (0 is fine), as its ids are any int64 values.
        embedding_dim: width of a row.
        combiner: ``sum``, ``mean`` or ``sqrtn`` (TensorFlow's; default ``mean``).
        weighted: the feature's values weight its ids (else each id counts 1).
        initializer: initializer spec of the rows (:mod:`psflow.ps.initializers`);
            default TensorFlow's embedding columns': ``truncated_normal`` with
            stddev ``1/sqrt(embedding_dim)``, seeded by the model's seed.
        name: the variable's name on the ps tasks; default the module's path
            in the model with ``/`` for ``.`` (``deep/emb_C1``).
        optimizer: the optimizer applied to the table on the ps tasks; default
            the model's parameter groups', else the run's.
        partitions: partitions of the table along its rows; default the
            run's ``--partitions`` (tables smaller than that are not split).
            Ignored for a dynamic table (spread over every ps task by id).
        dynamic: the options of a *dynamic table* (:data:`psflow.ps.dynamic.OPTIONS`, e.g.
            ``{"capacity_rows": 1_000_000, "admit_after": 2}``; ``{}``: no limits): the table is
            declared ``(0, embedding_dim)``, its rows keyed by any int64 id (negative ones included),
            created on an id's first training lookup and spread over the ps tasks by id
            (:mod:`psflow.ps.dynamic`). None (default): a static table, unless the run has dynamic
            tables (``--embedding-table dynamic``): :class:`~psflow.torch.TorchModel` then gives
            every Embedding without options of its own the run's.
    """

    def __init__(self, feature: str, num_embeddings: int, embedding_dim: int, *, combiner: str = "mean",
                 weighted: bool = False, initializer: Mapping[str, Any] | None = None, name: str | None = None,
                 optimizer: OptimizerSpec | None = None, partitions: int | None = None,
                 dynamic: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        if combiner not in COMBINERS:
            raise ModelError(f"embedding of {feature!r}: combiner must be one of {', '.join(COMBINERS)}, got {combiner!r}")
        if dynamic is not None and not isinstance(dynamic, Mapping):
            raise ModelError(f"embedding of {feature!r}: dynamic must be a mapping of dynamic table options, got {dynamic!r}")
        if embedding_dim < 1 or (dynamic is None and num_embeddings < 1):
            raise ModelError(f"embedding of {feature!r}: needs >= 1 rows and width, got [{num_embeddings}, {embedding_dim}]")
        self.feature = feature
        self.num_embeddings = int(num_embeddings)
        self.embedding_dim = int(embedding_dim)
        self.combiner = combiner
        self.weighted = weighted
        self.initializer = dict(initializer) if initializer is not None else None
        self.table_name = name
        self.optimizer = optimizer
        self.partitions = partitions
        #: The dynamic table's options, or None for a static table.
        self.dynamic: dict[str, Any] | None = dict(dynamic) if dynamic is not None else None

    @property
    def is_dynamic(self) -> bool:
        """True for a dynamic table (rows keyed by any int64 id; see the ``dynamic`` argument)."""
        return self.dynamic is not None

    def default_initializer(self, seed: int) -> dict[str, Any]:
        """The initializer spec of the rows (:attr:`initializer`, or TF's default seeded by ``seed``)."""
        if self.initializer is not None:
            return dict(self.initializer)
        return {"name": "truncated_normal", "stddev": 1.0 / math.sqrt(self.embedding_dim), "seed": seed}

    def forward(self, inputs: Inputs) -> torch.Tensor:
        return inputs.lookup(self)

    def extra_repr(self) -> str:
        return (f"{self.feature!r}, {self.num_embeddings}, {self.embedding_dim}, combiner={self.combiner!r}"
                + (", weighted" if self.weighted else "") + (f", name={self.table_name!r}" if self.table_name else "")
                + (f", dynamic={self.dynamic!r}" if self.dynamic is not None else ""))


class EmbeddingCollection(nn.Module):
    """Several tables looked up at once: ``forward(inputs)`` -> ``[n, sum of widths]`` (concat) or ``[n, width]`` (sum).

    ``pooling="concat"`` puts the tables' results side by side in the order
    given (TF's ``input_layer`` over embedding columns); ``pooling="sum"``
    adds them (needs one width; TF's linear model over categorical columns,
    with ``embedding_dim`` 1). Either way the lookup is one gather of the rows
    of every table and one segment sum.
    """

    def __init__(self, embeddings: Sequence[Embedding], *, pooling: str = "concat") -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ModelError(f"embedding collection: pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        if not embeddings:
            raise ModelError("embedding collection: no embeddings")
        widths = {e.embedding_dim for e in embeddings}
        if len(widths) > 1:
            raise ModelError(f"embedding collection: every table needs one width to be looked up together, got {sorted(widths)}")
        self.embeddings = nn.ModuleList(embeddings)
        self.pooling = pooling

    @property
    def output_dim(self) -> int:
        """Width of :meth:`forward`'s result."""
        first = self.embeddings[0]
        assert isinstance(first, Embedding)
        return first.embedding_dim * len(self.embeddings) if self.pooling == "concat" else first.embedding_dim

    def forward(self, inputs: Inputs) -> torch.Tensor:
        return inputs.lookup(self)


@dataclass(frozen=True)
class LookupPlan:
    """One lookup group (an :class:`Embedding` or an :class:`EmbeddingCollection`) prepared for one batch.

    Attributes:
        tables: the tables' variable names, in the group's order.
        ids: per table, the sorted unique ids whose rows are pulled (and pushed).
        index: per entry (sorted by bag), its row in the tables' rows stacked in order.
        weights: per entry, its combiner scale (float32).
        bags: per entry, its bag: ``example * len(tables) + table`` (concat) or ``example`` (sum).
        num_examples: examples of the batch.
        concat: bags are (example, table), giving ``[n, tables * dim]``; else one bag per example.
        per_bag: :attr:`entries_per_bag` when known (:meth:`build` finds it where the batch is prepared,
            often the reader process); -1: computed when asked.
    """

    tables: tuple[str, ...]
    ids: tuple[npt.NDArray[np.int64], ...]
    index: npt.NDArray[np.int64]
    weights: npt.NDArray[np.float32]
    bags: npt.NDArray[np.int64]
    num_examples: int
    concat: bool
    per_bag: int = -1

    @property
    def num_bags(self) -> int:
        return self.num_examples * len(self.tables) if self.concat else self.num_examples

    @property
    def entries_per_bag(self) -> int:
        """``m`` when every bag holds exactly ``m`` entries (the lookup is then a reshape and a sum), else 0."""
        return self.per_bag if self.per_bag >= 0 else _entries_per_bag(self.bags, self.num_bags)

    @classmethod
    def build(cls, batch: Batch, embeddings: Sequence[tuple[str, Embedding]], *, concat: bool,
              cache: dict[Any, Any] | None = None) -> LookupPlan:
        """Prepares the lookup of ``embeddings`` (variable name, module) for ``batch``.

        ``cache``: a dict shared by the plans of one batch; groups over the same
        features and vocabularies (Wide & Deep's wide and deep tables) then find
        their unique ids, and whether each example has one id per feature, once.

        A dynamic table (:attr:`Embedding.dynamic`) takes any int64 id: its ids are
        not checked, and a group with one finds its unique (table, id) pairs by
        sorting them (a static table's ids are offset into one id space instead;
        either way each table's ids come out sorted and unique).

        Raises:
            ModelError: a feature the batch does not have, or an id outside a
                static table (names the feature, the table and the id).
        """
        n = batch.num_examples
        k = len(embeddings)
        columns = []
        for name, emb in embeddings:
            try:
                columns.append(batch.column(emb.feature))
            except (KeyError, ValueError) as e:
                raise ModelError(f"table {name!r}: the batch has no sparse feature {emb.feature!r}") from e
        # Every table's entries at once: (table, example, id, weight), tables one after another.
        counts = np.array([c.ids.size for c in columns], dtype=np.int64)
        table = np.repeat(np.arange(k, dtype=np.int64), counts)
        ids = np.concatenate([c.ids for c in columns]).astype(np.int64, copy=False)
        shape_key = ("one id per example", tuple(e.feature for _, e in embeddings))
        one_each = cache.get(shape_key) if cache is not None else None
        if one_each is None:
            one_each = _one_per_example([c.indptr for c in columns], n)
            if cache is not None:
                cache[shape_key] = one_each
        example = (np.tile(np.arange(n, dtype=np.int64), k) if one_each
                   else np.concatenate([np.repeat(np.arange(n, dtype=np.int64), np.diff(c.indptr)) for c in columns]))
        dynamic = np.array([e.dynamic is not None for _, e in embeddings])
        any_dynamic = bool(dynamic.any())
        # A dynamic table has no vocabulary: -1 in the cache key, and its ids are not checked.
        vocab = np.array([-1 if e.dynamic is not None else e.num_embeddings for _, e in embeddings], dtype=np.int64)
        bad = (ids < 0) | (ids >= vocab[table])
        if any_dynamic:
            bad &= ~dynamic[table]
        if bad.any():
            at = int(np.flatnonzero(bad)[0])
            name, bad_emb = embeddings[int(table[at])]
            raise ModelError(f"feature {bad_emb.feature!r}: id {int(ids[at])} (example {int(example[at])} of the batch) is "
                             f"outside the vocabulary of table {name!r} ({bad_emb.num_embeddings} rows)")
        weighted = np.array([e.weighted for _, e in embeddings])
        w = np.ones(ids.size, dtype=np.float64)
        pruned = False
        if weighted.any():
            values = np.concatenate([c.values for c in columns]).astype(np.float64, copy=False)
            w = np.where(weighted[table], values, 1.0)
            keep = w > 0  # TF prunes ids of weight <= 0 from a weighted lookup
            if not keep.all():
                table, ids, example, w = table[keep], ids[keep], example[keep], w[keep]
                pruned = True
        # Combiner scales: sum -> w, mean -> w / sum(w), sqrtn -> w / sqrt(sum(w^2)), sums per (table, example).
        # One entry of weight 1 per (table, example) (unweighted, one id per example: Criteo's): every combiner
        # scales it by 1 (1/1, 1/sqrt(1)), the values the sums below give, without them.
        scale = w
        if not (one_each and not weighted.any()):
            combiner = np.array([COMBINERS.index(e.combiner) for _, e in embeddings], dtype=np.int64)[table]
            has_mean, has_sqrtn = bool((combiner == 1).any()), bool((combiner == 2).any())
            if has_mean or has_sqrtn:  # sums only where a table's combiner needs them
                cell = table * n + example
                sums = np.bincount(cell, weights=w, minlength=k * n)[cell] if has_mean else w
                if has_sqrtn:
                    norms = np.sqrt(np.bincount(cell, weights=w * w, minlength=k * n))[cell]
                    divisor = np.where(combiner == 1, sums, norms) if has_mean else norms
                else:
                    divisor = sums
                scale = np.where(combiner == 0, w, w / divisor)
        # Unique (table, id) pairs, sorted by table then id: the stacked rows, and each entry's row among them.
        if pruned or cache is None:
            cache = {}  # nothing to share: the ids of this group are its own
        key = (tuple(e.feature for _, e in embeddings), tuple(vocab.tolist()))
        found = cache.get(key)
        if found is None:
            if any_dynamic:
                found = cache[key] = _unique_pairs(table, ids, k)
            else:
                offsets = np.concatenate([[0], np.cumsum(vocab)]).astype(np.int64)
                uniq, index = unique_inverse(offsets[table] + ids)
                bounds = np.searchsorted(uniq, offsets)
                # Each table's ids: one subtraction of every unique id's table offset, then a view per table
                # (26 subtractions and copies of a few hundred ids each cost ~3x as much).
                local = uniq - np.repeat(offsets[:-1], np.diff(bounds))
                at = bounds.tolist()
                per_table = tuple(local[at[t]:at[t + 1]] for t in range(k))
                found = cache[key] = (per_table, index.reshape(-1).astype(np.int64, copy=False))
        per_table, index = found
        if one_each and not pruned:
            # Entries are table-major [k, n] and every bag is (example[, table]): the order by bag is a transpose,
            # and the bags are 0 .. n*k - 1 (concat) or each example k times (sum).
            by_bag_index = index.reshape(k, n).T.reshape(-1)
            by_bag_scale = np.asarray(scale, dtype=np.float32).reshape(k, n).T.reshape(-1)
            bags = (np.arange(n * k, dtype=np.int64) if concat
                    else np.repeat(np.arange(n, dtype=np.int64), k))
            per_bag = (1 if concat else k) if n * k else 0  # one entry per (example, table) bag, k per example's bag
        else:
            bag = example * k + table if concat else example
            order = np.argsort(bag, kind="stable")
            bags = bag[order]
            by_bag_index, by_bag_scale = index[order], scale[order].astype(np.float32)
            per_bag = _entries_per_bag(bags, n * k if concat else n)
        return cls(tuple(t for t, _ in embeddings), per_table, by_bag_index, by_bag_scale, bags, n, concat, per_bag)

    def slice_examples(self, start: int, stop: int) -> LookupPlan:
        """The plan of examples ``[start, stop)`` alone, over the same pulled rows (a tower's share of a batch).

        :attr:`ids` stay the whole batch's (each tower gets every pulled row and reads those of its own
        examples; a row no example of the slice uses gets a zero gradient); the entries are those of the
        slice's bags, renumbered from its first example.
        """
        per_example = len(self.tables) if self.concat else 1
        lo, hi = np.searchsorted(self.bags, [start * per_example, stop * per_example])
        return LookupPlan(self.tables, self.ids, self.index[lo:hi], self.weights[lo:hi],
                          self.bags[lo:hi] - start * per_example, stop - start, self.concat, self.per_bag)

    def to_extras(self, key: str) -> dict[str, npt.NDArray[np.generic]]:
        """The plan as arrays named ``<key>.<part>`` (for :attr:`Batch.extras`: it may be built in another process)."""
        out: dict[str, npt.NDArray[np.generic]] = {f"{key}.index": self.index, f"{key}.weights": self.weights,
                                                   f"{key}.bags": self.bags,
                                                   f"{key}.shape": np.array([self.num_examples, int(self.concat),
                                                                             self.per_bag], np.int64)}
        out.update({f"{key}.ids{t}": ids for t, ids in enumerate(self.ids)})
        return out

    @classmethod
    def from_extras(cls, extras: Mapping[str, npt.NDArray[np.generic]], key: str, tables: tuple[str, ...]) -> LookupPlan:
        """The plan :meth:`to_extras` stored under ``key``. Raises KeyError when the batch was not prepared."""
        shape = extras[f"{key}.shape"]
        return cls(tables, tuple(extras[f"{key}.ids{t}"].astype(np.int64, copy=False) for t in range(len(tables))),
                   extras[f"{key}.index"].astype(np.int64, copy=False), extras[f"{key}.weights"].astype(np.float32, copy=False),
                   extras[f"{key}.bags"].astype(np.int64, copy=False), int(shape[0]), bool(shape[1]), int(shape[2]))


def _entries_per_bag(bags: npt.NDArray[np.int64], num_bags: int) -> int:
    """``m`` when the entries' bags (sorted) are ``0`` m times, ``1`` m times, ... ``num_bags - 1``; else 0."""
    if num_bags == 0 or bags.size % num_bags:
        return 0
    m = bags.size // num_bags
    return m if bool(np.all(bags.reshape(num_bags, m) == np.arange(num_bags)[:, None])) else 0


def _unique_pairs(table: npt.NDArray[np.int64], ids: npt.NDArray[np.int64],
                  k: int) -> tuple[tuple[npt.NDArray[np.int64], ...], npt.NDArray[np.int64]]:
    """The unique (table, id) pairs of entries ``table``, ``ids`` (any int64 ids): per table its sorted unique ids,
    and per entry its pair's position among them all (tables in order): what ``np.unique`` of offset ids gives
    static tables, without offsets that any int64 id would overflow."""
    order = np.lexsort((ids, table))  # by table, then id
    t, v = table[order], ids[order]
    starts = np.ones(order.size, dtype=bool)
    starts[1:] = (t[1:] != t[:-1]) | (v[1:] != v[:-1])  # first entry of each run of one (table, id)
    index = np.empty(order.size, dtype=np.int64)
    index[order] = np.cumsum(starts) - 1
    uniq_table, uniq = t[starts], v[starts]
    bounds = np.searchsorted(uniq_table, np.arange(k + 1, dtype=np.int64))
    per_table = tuple(uniq[bounds[i]:bounds[i + 1]].astype(np.int64, copy=False) for i in range(k))
    return per_table, index


def _one_per_example(indptrs: Sequence[npt.NDArray[np.int64]], n: int) -> bool:
    """True when every CSR column holds exactly one entry per example (Criteo's fields). Columns sharing one
    ``indptr`` array (as parsed batches do) are checked once; the others (a sliced batch has one per column)
    in one comparison of them all, stacked, against ``0 .. n``."""
    distinct = list({id(p): p for p in indptrs}.values())
    if any(p.shape != (n + 1,) for p in distinct):
        return False
    stacked = distinct[0][None, :] if len(distinct) == 1 else np.stack(distinct)
    return bool((stacked == np.arange(n + 1, dtype=np.int64)).all())
