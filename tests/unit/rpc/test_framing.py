"""Array framing: round trips and refusal of every kind of malformed frame."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psflow.rpc.framing import Frame, FrameError, decode, encode, encode_parts


def test_round_trip_arrays_and_meta() -> None:
    arrays = {
        "ids": np.array([3, 1, 2**62], dtype=np.int64),
        "rows": np.arange(12, dtype=np.float32).reshape(4, 3),
        "empty": np.zeros((0, 7), dtype=np.float32),
        "scalar": np.array(1.5, dtype=np.float64),
    }
    frame = decode(encode({"op": "pull", "n": 3, "names": ["a", "ü"]}, arrays))
    assert frame.meta == {"op": "pull", "n": 3, "names": ["a", "ü"]}
    assert set(frame.arrays) == set(arrays)
    for name, arr in arrays.items():
        np.testing.assert_array_equal(frame.arrays[name], arr)
        assert frame.arrays[name].dtype == arr.dtype
        assert frame.arrays[name].shape == arr.shape
        assert not frame.arrays[name].flags.writeable


def test_a_caller_owning_a_writable_buffer_may_get_writable_views_of_it() -> None:
    """``writable=True`` (a client's reply, whose buffer is the call's alone): the arrays are the buffer's
    bytes, writable, so the caller uses them without a copy; a ``bytes`` frame and the default stay read-only."""
    wire = encode({}, {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([7, 8], np.int64)})
    buf = bytearray(wire)
    frame = decode(memoryview(buf), writable=True)
    assert all(a.flags.writeable for a in frame.arrays.values())
    frame.arrays["b"][0] = 9
    assert decode(bytes(buf)).arrays["b"].tolist() == [9, 8]  # a view of the buffer, not a copy
    assert not any(a.flags.writeable for a in decode(wire, writable=True).arrays.values())
    assert not any(a.flags.writeable for a in decode(memoryview(buf)).arrays.values())


def test_non_contiguous_and_big_endian_inputs_are_normalized() -> None:
    base = np.arange(20, dtype=np.float32).reshape(4, 5)
    frame = decode(encode({}, {"t": base.T, "be": np.arange(3, dtype=">i8")}))
    np.testing.assert_array_equal(frame.arrays["t"], base.T)
    np.testing.assert_array_equal(frame.arrays["be"], [0, 1, 2])
    assert frame.arrays["be"].dtype == np.dtype("<i8")


def test_disallowed_dtype_refused_on_encode() -> None:
    with pytest.raises(FrameError, match="'o'"):
        encode({}, {"o": np.array(["x"], dtype=object)})


def _frame_with_header(header: object, payload: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<4sI", b"PSF1", len(raw)) + raw + payload


@pytest.mark.parametrize(
    "buf, message",
    [
        (b"", "too short"),
        (b"XXXX\x00\x00\x00\x00", "bad magic"),
        (struct.pack("<4sI", b"PSF1", 1000) + b"{}", "exceeds frame"),
        (struct.pack("<4sI", b"PSF1", 3) + b"{x}", "not valid JSON"),
        (_frame_with_header([1, 2]), "'meta'"),
        (_frame_with_header({"meta": {}, "arrays": {}}), "must be a list"),
        (_frame_with_header({"meta": {}, "arrays": [["a", "<f4", [2], 0, 8]]}), "bad offset"),
        (_frame_with_header({"meta": {}, "arrays": [["a", "|O", [1], 64, 8]]}), "not allowed"),
        (_frame_with_header({"meta": {}, "arrays": [["a", ["<f4"], [1], 64, 8]]}), "not allowed"),  # unhashable
        (_frame_with_header({"meta": {}, "arrays": [["a", {"<f4": 1}, [1], 64, 8]]}), "not allowed"),
        (_frame_with_header({"meta": {}, "arrays": [["a", "<f4", [-1], 64, 4]]}), "bad shape"),
        (_frame_with_header({"meta": {}, "arrays": [["a", "<f4", [10**6], 128, 4 * 10**6]]}), "beyond frame"),
    ],
)
def test_malformed_frames_refused(buf: bytes, message: str) -> None:
    with pytest.raises(FrameError, match=message):
        decode(buf)


def test_writable_views_never_share_bytes() -> None:
    """Two arrays over the same bytes (a buggy or hostile peer's frame) are read as read-only views as before,
    and refused as writable ones: writing one of a caller's arrays must not change another."""
    data_start = 8 + 256
    header = json.dumps({"meta": {}, "arrays": [["a", "<f4", [2], data_start, 8], ["b", "<f4", [2], data_start + 4, 8]]})
    buf = bytearray(struct.pack("<4sI", b"PSF1", 256) + header.encode().ljust(256) + bytes(12))
    assert decode(memoryview(buf)).arrays["b"].tolist() == [0.0, 0.0]
    with pytest.raises(FrameError, match=f"array 'b': bytes {data_start + 4}..{data_start + 12} overlap"):
        decode(memoryview(buf), writable=True)


def test_shape_must_match_nbytes() -> None:
    good = encode({}, {"a": np.zeros(4, dtype=np.float32)})
    header_len = struct.unpack_from("<I", good, 4)[0]
    header = json.loads(good[8 : 8 + header_len])
    header["arrays"][0][2] = [5]
    raw = json.dumps(header, separators=(",", ":")).encode().ljust(header_len)
    with pytest.raises(FrameError, match="needs 20 bytes"):
        decode(good[:8] + raw + good[8 + header_len :])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash_the_decoder(buf: bytes) -> None:
    try:
        frame = decode(buf)
    except FrameError:
        return
    assert isinstance(frame, Frame)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.text(max_size=8), st.integers(-5, 5), max_size=4),
    st.lists(st.integers(0, 6), max_size=3),
)
def test_round_trip_property(meta: dict[str, int], shape: list[int]) -> None:
    arr = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    frame = decode(encode(meta, {"x": arr}))
    assert frame.meta == meta
    np.testing.assert_array_equal(frame.arrays["x"], arr)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["<f4", "<i8", "|u1", "<i4"]), st.lists(st.integers(0, 5), max_size=3)),
                max_size=6))
def test_encode_parts_are_the_frame_in_pieces(specs: list[tuple[str, list[int]]]) -> None:
    """What a carrier sends piece by piece (``encode_parts``) is, joined, the frame :func:`encode` gives, and
    its length is the pieces' total; the arrays' bytes are views of the arrays, not copies."""
    rng = np.random.default_rng(len(specs))
    arrays = {f"x/{i}": rng.integers(0, 100, size=shape).astype(dtype) for i, (dtype, shape) in enumerate(specs)}
    parts, size = encode_parts({"k": len(specs)}, arrays)
    assert b"".join(parts) == encode({"k": len(specs)}, arrays)
    assert size == sum(len(p) for p in parts)
    for array in arrays.values():
        if array.nbytes:
            assert any(isinstance(p, memoryview) and p.obj is array for p in parts)
