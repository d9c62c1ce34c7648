"""Dynamic embedding tables: rows keyed by raw 64-bit ids, admitted and evicted as ids come and go.

A :class:`DynamicTable` is one ps task's share of a dynamic table variable
(issue #14): the rows of the ids that :func:`owner_of` gives this task. Rows
are ``dim`` float32 values keyed by any int64 id (the whole range, negative
values included: what string hashing produces), created on first admitted
use with the variable's initializer, with their optimizer slots beside them.

Guarantees:
    * **Same update as a static row.** :meth:`DynamicTable.apply_gradients`
      hands the gathered rows to the very :meth:`Optimizer.apply_sparse` a
      static partition uses (same numpy/C code, same float32 operations), so a
      row with the same initial value and the same gradient history ends bit
      for bit equal. Duplicate ids in a call are summed first, as there, but in
      the order they appear in the call (a static partition's order is
      unspecified, so with duplicates the two can differ in the last bit); the
      result never depends on slot layout, so a table re-split onto another
      number of ps tasks trains on bit for bit as before. Adam stays TF1's
      non-lazy Adam: every allocated row moves on every apply, O(rows).
    * **Initial values** come from the same initializer specs: element ``j`` of
      id ``x`` is the value a static table's initializer gives flat index
      ``x * dim + j`` (mod 2**64), so for ``0 <= x < rows`` it equals row ``x``
      of a static ``[rows, dim]`` variable. ``glorot_uniform`` needs a row count
      and is refused.
    * **Admission.** ``admit_after=N``: an id gets a row in the lookup where it
      is seen for the N-th time (one count per lookup call, in a
      :class:`CountMinSketch`, which never under-counts, so no id waits longer
      than N sightings; collisions can admit earlier). ``admit_probability=p``:
      each sighting of an id without a row admits it with probability p (a
      seeded generator: the same calls give the same rows). Neither: every id
      is admitted. Until admitted, a lookup returns zeros and a gradient is
      dropped; both are counted (:meth:`DynamicTable.stats`). An id evicted
      after admission keeps its sketch count and is admitted again at once.
    * **Eviction never stalls a call for long.** ``capacity_rows`` and/or
      ``capacity_bytes`` give a row limit that holds after every call. A lookup
      that must create rows beyond it first evicts as many rows as it needs:
      the lowest by policy (``"lfu"``: fewest lookups, then oldest; ``"lru"``:
      oldest last use, then fewest lookups) among a uniform random sample of
      ``eviction_sample`` (default 8) candidates per row to evict, never a row
      the same lookup reads. The work is O(eviction_sample x rows created in
      that call), not a scan of the table (the slots are scanned instead only
      when the sample would be half of them or finds no row to evict, e.g. when
      one lookup reads most of the table). Removing a row from the index moves
      the few entries after it (no tombstones, no clean-up pass). If even that
      leaves too little room, the ids that do not fit are not admitted this
      time (counted as rejected).
      ``ttl_steps=T``: :meth:`DynamicTable.evict` drops rows whose last use
      (a creating lookup or an update) is older than step - T, scanning at most
      ``ttl_scan_rows`` slots per call (a round-robin cursor).
    * **Memory.** Rows live in preallocated numpy arrays grown geometrically
      (never past the row limit); freed slots are reused. The id -> slot index
      is an open-addressing hash table of two int64 arrays, at most half full
      (<= 64 bytes per row). :meth:`DynamicTable.memory_bytes` is the exact
      sum of the table's array bytes; with ``capacity_bytes`` set it stays
      within ``capacity_bytes + DynamicTable.overhead_bytes()`` (the sketch,
      Adam's 0-d state, the index's minimum size). Python objects add
      :data:`FIXED_OVERHEAD_BYTES`; a call's temporaries are proportional to
      its batch, and a growth step briefly holds old and new arrays.
    * **Checkpoints**: :meth:`DynamicTable.snapshot` gives every row sorted by
      id (a checkpoint's with the counters, ``counts``); :func:`resplit_snapshots` re-splits M tasks'
      snapshots onto N tasks by :func:`owner_of` (the counters: each task's own onto as many tasks, else
      their sums split evenly); :meth:`DynamicTable.load` takes one back and goes on from its counters.
    * **Errors** (:class:`DynamicTableError`, a :class:`StoreError`) name the
      table; every check happens before any state changes, so a refused call
      changes nothing.
    * **Thread safety**: one lock per table around every public method; the
      ps service may call one table from several threads. Calls on one table
      are serialized; different tables run in parallel (the C kernels release
      the GIL).

Non-guarantees: the sketch and the random generators are not checkpointed (after
a restore, partly counted ids start from zero); count-min counters are uint32
and are never aged, so over a very long run collisions admit ids earlier
(:meth:`CountMinSketch.error_bound` states by how much).

Measured on this project's 2-core machine (1M resident ids, dim 8, Adagrad,
calls of 20,000 ids, the C index loops): lookup 1.3 ms (a static partition's
read: 1.3 ms), apply_gradients 1.7 ms (static: 0.7 ms); a stream where every
new id evicts a row costs 6-25x a static table. End to end on the tf_peer
sparse-LR workload a dynamic table trains at 0.9x a static one (``benchmarks/
RESULTS.md``). ``benchmarks/bench_dynamic_table.py`` measures the table against a static
partition side by side, and the worst call while eviction runs.

Modules (everything public is re-exported here):

    ========================  ===============================================================
    ``spec.py``               :class:`DynamicTableSpec` (options, checked on construction),
                              :func:`share_spec` (one ps task's share of a table variable),
                              :class:`DynamicTableStats`, :class:`DynamicTableError`
                              (defined in :mod:`psflow.errors`), :data:`EVICTION_POLICIES`,
                              the row and mask array types
    ``table.py``              :class:`DynamicTable` (lookup, apply_gradients, evict, snapshot,
                              load/restore, memory accounting)
    ``sizes.py``              a row's bytes against ``capacity_bytes`` (``row_bytes``),
                              :data:`FIXED_OVERHEAD_BYTES`
    ``sketch.py``             :class:`CountMinSketch` (the ``admit_after`` counts)
    ``id_index.py``           ``IdIndex``: the id -> slot open-addressing hash table
    ``rows.py``               initial rows of new ids, a call's distinct ids, gradients summed per id
    ``eviction.py``           the lfu/lru ordering and the sampled choice of rows to evict
    ``snapshots.py``          the snapshot check, :func:`resplit_snapshots`
    ========================  ===============================================================

:func:`owner_of` (id -> owning ps task), the splitmix64 mix and the id check live in
:mod:`psflow.placement.hashing`, below the ps, as placement routes ids by them too; re-exported here.
"""

from psflow.placement.hashing import owner_of
from psflow.ps.dynamic.sizes import FIXED_OVERHEAD_BYTES
from psflow.ps.dynamic.sketch import CountMinSketch
from psflow.ps.dynamic.snapshots import resplit_snapshots, skip_steps
from psflow.ps.dynamic.spec import (
    EVICTION_POLICIES,
    OPTIONS,
    DynamicTableError,
    DynamicTableSpec,
    DynamicTableStats,
    share_spec,
    table_totals,
)
from psflow.ps.dynamic.table import DynamicTable

__all__ = [
    "EVICTION_POLICIES",
    "FIXED_OVERHEAD_BYTES",
    "OPTIONS",
    "CountMinSketch",
    "DynamicTable",
    "DynamicTableError",
    "DynamicTableSpec",
    "DynamicTableStats",
    "owner_of",
    "resplit_snapshots",
    "share_spec",
    "skip_steps",
    "table_totals",
]
