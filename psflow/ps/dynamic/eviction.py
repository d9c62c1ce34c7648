"""Which rows a dynamic table evicts for room: the policy's ordering and the sampled choice of victims.

The capacity evicts the rows lowest by policy (``"lfu"``: fewest lookups, then
oldest last use; ``"lru"``: oldest last use, then fewest lookups) among a
uniform random sample of ``eviction_sample`` candidates per row to evict, so
the work is O(eviction_sample x rows to evict), not a scan of the table. These
functions read and (only for the duration of a call) flip the table's arrays
that they are given; the caller holds the table's lock.
"""

from __future__ import annotations

import math

import numpy as np

from psflow.placement.hashing import IdArray
from psflow.ps.dynamic.spec import BoolArray, DynamicTableSpec

__all__ = ["eviction_keys", "lowest", "pick_victims"]


def eviction_keys(freq: IdArray, last: IdArray, policy: str) -> IdArray:
    """One int64 per row, lowest evicted first: (frequency, last use) for lfu, (last use, frequency) for lru.

    Each part is clipped to 31 bits (the last use counted from the oldest one
    given), which only merges ties beyond 2**31 lookups or steps.
    """
    cap = np.int64((1 << 31) - 1)
    count = np.minimum(freq, cap)
    age = np.minimum(last - last.min(), cap) if last.size else last
    high, low = (count, age) if policy == "lfu" else (age, count)
    keys: IdArray = (high << np.int64(31)) | low
    return keys


def lowest(keys: IdArray, count: int, *, complement: bool = False) -> IdArray:
    """Positions of the ``count`` lowest keys (ties at the boundary in argpartition's order), or of all others."""
    if count >= keys.size:
        return np.zeros(0, np.int64) if complement else np.arange(keys.size)
    if count <= 0:
        return np.arange(keys.size) if complement else np.zeros(0, np.int64)
    order = np.argpartition(keys, count - 1)
    out: IdArray = order[count:] if complement else order[:count]
    return out


def pick_victims(count: int, protect: IdArray, *, live: BoolArray, freq: IdArray, last: IdArray, top: int, rows: int,
                 spec: DynamicTableSpec, rng: np.random.Generator) -> IdArray:
    """Up to ``count`` distinct live rows, not in ``protect``: each round the lowest by policy
    among ~eviction_sample * count rows sampled with replacement (all rows once that is most of them).

    ``live``, ``freq`` and ``last`` are the table's per-slot arrays, ``top`` its
    count of slots ever used, ``rows`` its count of live rows; ``spec`` gives
    the policy and ``eviction_sample``, ``rng`` draws the sample. Rows in
    ``protect`` and rows already chosen are hidden by clearing their live flags
    meanwhile, which costs O(protect + count), not a search; every flag is set
    back before returning, so ``live`` ends as it started.
    """
    chosen: list[IdArray] = []
    live[protect] = False
    try:
        hidden = int(protect.size)
        while count > 0:
            candidates = _sample_live(count, rows - hidden, live=live, top=top, eviction_sample=spec.eviction_sample, rng=rng)
            if not candidates.size:
                break
            keys = eviction_keys(freq[candidates], last[candidates], spec.policy)
            picked = np.sort(candidates[lowest(keys, count)])
            picked = picked[np.append(True, picked[1:] != picked[:-1])]  # the sample may repeat a row
            live[picked] = False
            chosen.append(picked)
            count -= int(picked.size)
            hidden += int(picked.size)
    finally:
        for picked in chosen:
            live[picked] = True
        live[protect] = True
    return np.concatenate(chosen) if chosen else np.zeros(0, np.int64)


def _sample_live(count: int, visible: int, *, live: BoolArray, top: int, eviction_sample: int,
                 rng: np.random.Generator) -> IdArray:
    """Live slots to choose ``count`` victims from: a uniform sample (may repeat), or all when that is cheaper.

    ``visible`` is how many slots below ``top`` are live (flag set).
    """
    sample = math.ceil(eviction_sample * count * top / max(1, visible))
    if 2 * sample < top:
        drawn = rng.integers(0, top, sample)
        drawn = drawn[live[drawn]]
        if drawn.size:
            return drawn
    out: IdArray = np.flatnonzero(live[:top])
    return out
