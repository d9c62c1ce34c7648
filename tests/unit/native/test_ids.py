"""psflow.native.ids: unique_inverse is exactly np.unique(ids, return_inverse=True) and scan_ids numpy's range and
order check, on the C loops (psflow.native._ids) and without them."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psflow.native import ids as ids_module
from psflow.native.ids import unique_inverse
from psflow.native.loader import ENV, load_extension

INT64 = st.integers(-(2**63), 2**63 - 1)


def require_native() -> None:
    """Skips the test when psflow.native._ids was not built, or fails it under ``PSFLOW_REQUIRE_NATIVE=1``."""
    if ids_module.IDS is None:
        if os.environ.get("PSFLOW_REQUIRE_NATIVE") == "1":
            pytest.fail("PSFLOW_REQUIRE_NATIVE=1 but psflow.native._ids is not importable (not built?)")
        pytest.skip(f"psflow.native._ids not built or disabled by {ENV}=0")


@pytest.fixture(params=["c", "numpy"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "c":
        require_native()
    else:
        monkeypatch.setattr(ids_module, "IDS", None)
    return str(request.param)


def _check(ids: np.ndarray) -> None:
    uniq, inverse = unique_inverse(ids)
    want_uniq, want_inverse = np.unique(np.asarray(ids, np.int64).reshape(-1), return_inverse=True)
    assert uniq.dtype == np.int64 and inverse.dtype == np.intp
    np.testing.assert_array_equal(uniq, want_uniq)
    np.testing.assert_array_equal(inverse, want_inverse.reshape(-1))


@given(values=st.lists(st.one_of(INT64, st.integers(-3, 3), st.sampled_from([-(2**63), 2**63 - 1, -1, 0])),
                       max_size=300))
@settings(max_examples=150, deadline=None)
def test_matches_np_unique_on_any_int64(values: list[int]) -> None:
    for switch in ("c", "numpy"):
        saved = ids_module.IDS
        if switch == "numpy":
            ids_module.IDS = None
        elif saved is None:
            continue
        try:
            _check(np.array(values, dtype=np.int64))
        finally:
            ids_module.IDS = saved


@pytest.mark.parametrize("size", [0, 1, 2, 15, 16, 17, 1000, 20_000])
def test_sizes_duplicates_and_byte_patterns(path: str, size: int) -> None:
    rng = np.random.default_rng(size)
    _check(rng.integers(0, 1 << 20, size))  # small ids: most radix passes skipped
    _check(rng.integers(-(2**63), 2**63 - 1, size, dtype=np.int64))  # every byte differs
    _check(rng.integers(-5, 5, size) << 40)  # only high bytes differ, both signs
    _check(np.full(size, 7))
    _check(np.arange(size)[::-1].copy())
    _check(rng.integers(0, 100, size).astype(np.int32))  # other integer dtypes are taken as int64


def test_a_2d_or_strided_array_is_flattened(path: str) -> None:
    ids = np.arange(40).reshape(4, 10) % 7
    _check(ids)
    _check(np.arange(100)[::3] % 11)


def test_threads_do_not_share_scratch(path: str) -> None:
    """Each thread has its own scratch: concurrent calls of different sizes all give np.unique's answer."""
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(60):
                _check(rng.integers(0, int(rng.integers(1, 5000)), int(rng.integers(0, 30_000))))
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[0]


def test_kernel_checks_its_buffers() -> None:
    require_native()
    assert ids_module.IDS is not None
    kernels = ids_module.IDS
    ids = np.arange(10, dtype=np.int64)
    out, inverse = np.empty(10, np.int64), np.empty(10, np.int64)
    scratch = np.empty(kernels.unique_scratch_size(10), np.int64)
    with pytest.raises(ValueError, match="scratch is smaller"):
        kernels.unique_sorted(ids, out, inverse, scratch[:-1])
    with pytest.raises(ValueError, match="one item per id"):
        kernels.unique_sorted(ids, out[:9], inverse, scratch)
    with pytest.raises(TypeError, match="int64"):
        kernels.unique_sorted(ids.astype(np.int32), out, inverse, scratch)
    readonly = out.copy()
    readonly.setflags(write=False)
    with pytest.raises(ValueError, match="read-only|writable"):
        kernels.unique_sorted(ids, readonly, inverse, scratch)
    with pytest.raises(ValueError, match=">= 0"):
        kernels.unique_scratch_size(-1)
    assert kernels.unique_sorted(ids, out, inverse, scratch) == 10


def test_the_module_reads_the_switch_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """PSFLOW_NATIVE=0 or an unbuilt extension (ids.IDS None): np.unique, same answer."""
    monkeypatch.setattr(ids_module, "IDS", None)
    _check(np.array([5, -1, 5, 3], np.int64))


def test_psflow_native_0_loads_no_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "0")
    assert load_extension("psflow.native._ids") is None
    monkeypatch.delenv(ENV)
    assert load_extension("psflow.native.no_such_extension") is None
    if ids_module.IDS is not None:
        assert load_extension("psflow.native._ids") is ids_module.IDS


def _want_scan(ids: np.ndarray, num_rows: int) -> tuple[int, bool]:
    bad = np.flatnonzero((ids < 0) | (ids >= num_rows))
    first = int(bad[0]) if bad.size else -1
    head = ids if first < 0 else ids[:first]
    return first, bool(np.all(np.diff(head) > 0))


@given(values=st.lists(st.one_of(INT64, st.integers(-3, 40)), max_size=60), num_rows=st.integers(-2, 50),
       sort=st.booleans())
@settings(max_examples=200, deadline=None)
def test_scan_ids_finds_the_first_id_outside_and_the_order(values: list[int], num_rows: int, sort: bool) -> None:
    ids = np.array(sorted(values) if sort else values, dtype=np.int64)
    want = _want_scan(ids, num_rows)
    assert ids_module.scan_ids(ids, num_rows) == want  # the C loop where built
    with pytest.MonkeyPatch.context() as m:
        m.setattr(ids_module, "IDS", None)
        assert ids_module.scan_ids(ids, num_rows) == want


def test_scan_ids_on_strided_ids_and_edges(path: str) -> None:
    ids = np.arange(20, dtype=np.int64)
    assert ids_module.scan_ids(ids[::2], 19) == (-1, True)  # a view: numpy's path on either side
    assert ids_module.scan_ids(ids[::-2], 19) == (0, True)
    assert ids_module.scan_ids(np.zeros(0, np.int64), 0) == (-1, True)
    assert ids_module.scan_ids(np.array([3, 3], np.int64), 5) == (-1, False)
    assert ids_module.scan_ids(np.array([1, 2, -(2**63)], np.int64), 5) == (2, True)
