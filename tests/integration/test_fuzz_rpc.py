"""Fuzzing a real ps over gRPC: every malformed request is refused with a clean
status, the server stays up, and no variable, counter or fence changes."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import ClusterHandle

from psflow.cluster import ClusterSpec
from psflow.coord.lease_table import COORDINATION_SERVICE
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, fixed_size_partitioner, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.rpc.api import PARAMETER_SERVICE, TOKEN_METADATA_KEY, WORKER_SERVICE, ConnectConfig
from psflow.rpc.framing import ALLOWED_DTYPES, MAGIC, encode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CLEAN = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ABORTED,
         grpc.StatusCode.UNAUTHENTICATED}
KEYS = ["emb/part_0", "emb/part_1", "emb/part_2", "bias"]       # emb: (100, 4) in 3 partitions; bias: (1,)
ROWS = {"emb/part_0": 34, "emb/part_1": 33, "emb/part_2": 33, "bias": 1}
FUZZ = settings(max_examples=500, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class RawPs:
    """Unwrapped gRPC calls to one ps task, so anything at all can be sent."""

    def __init__(self, address: str, token: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.metadata = ((TOKEN_METADATA_KEY, token),)
        self.calls = 0

    def status(self, method: str, payload: bytes, *, service: str = PARAMETER_SERVICE, token: bool = True
               ) -> grpc.StatusCode:
        self.calls += 1
        stub = self.channel.unary_unary(f"/{service}/{method}")
        try:
            stub(payload, timeout=10, metadata=self.metadata if token else None)
        except grpc.RpcError as e:
            return e.code()  # type: ignore[no-any-return]
        return grpc.StatusCode.OK

    def refused(self, method: str, payload: bytes, **kwargs: Any) -> None:
        code = self.status(method, payload, **kwargs)
        assert code in CLEAN, f"{method}: {code} for {payload[:200]!r}"


def _model(cluster: ClusterSpec) -> VariableSet:
    # Every partition on the one ps task: every key above lives there.
    variables = VariableSet(replica_device_setter(cluster=cluster))
    variables.get_variable("emb", (100, 4), partitioner=fixed_size_partitioner(3))
    variables.get_variable("bias", (1,))
    return variables


# ---- strategies: each draws a request with at least one defect ------------------
dtypes = st.sampled_from(sorted(ALLOWED_DTYPES))
small_shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)
names = st.one_of(st.sampled_from(KEYS), st.text(max_size=12))


@st.composite
def arrays(draw: st.DrawFn, dtype: Any = dtypes, shape: Any = small_shapes) -> np.ndarray:
    return np.zeros(draw(shape), dtype=np.dtype(draw(dtype)))


@st.composite
def bad_push(draw: st.DrawFn) -> bytes:
    key = draw(st.sampled_from(KEYS))
    defect = draw(st.sampled_from(["unknown", "dtype", "shape", "rows", "kind", "missing", "examples", "entry"]))
    arrs: dict[str, np.ndarray] = {}
    kind = "sparse" if key != "bias" else "dense"
    meta: dict[str, Any] = {"grads": [[key, kind]], "step": draw(st.booleans()), "examples": 1}
    width = 4 if key != "bias" else 1
    good_rows = np.array([0], dtype=np.int64)
    good_grad = np.zeros((1, width) if kind == "sparse" else (1,), dtype=np.float32)
    arrs[f"g/{key}"], arrs[f"i/{key}"] = good_grad, good_rows
    if defect == "unknown":
        meta["grads"][0][0] = draw(st.text(max_size=12).filter(lambda s: s not in KEYS))
    elif defect == "dtype":
        arrs[f"g/{key}"] = draw(arrays(dtype=dtypes.filter(lambda d: d != "<f4"), shape=st.just(good_grad.shape)))
    elif defect == "shape":
        arrs[f"g/{key}"] = draw(arrays(dtype=st.just("<f4"), shape=small_shapes.filter(lambda s: s != good_grad.shape)))
    elif defect == "rows":
        if kind == "dense":
            meta["grads"][0][1] = "sparse"  # a dense variable pushed as sparse with bad rows
        bad = draw(st.one_of(st.integers(min_value=-(2**63), max_value=-1), st.integers(min_value=ROWS[key], max_value=2**62)))
        arrs[f"i/{key}"] = np.array([bad], dtype=np.int64)
        arrs[f"g/{key}"] = np.zeros((1, width), np.float32) if key != "bias" else np.zeros((1,), np.float32)
    elif defect == "kind":
        meta["grads"][0][1] = draw(st.text(max_size=8).filter(lambda s: s not in ("dense", "sparse")))
    elif defect == "missing":
        del arrs[draw(st.sampled_from([f"g/{key}", f"i/{key}"]) if kind == "sparse" else st.just(f"g/{key}"))]
    elif defect == "examples":
        meta["examples"] = draw(st.one_of(st.integers(max_value=-1), st.text(max_size=4), st.floats(), st.booleans()))
    else:
        meta["grads"] = draw(st.one_of(st.text(max_size=8), st.integers(), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
                                       st.lists(st.one_of(st.integers(), st.text(max_size=4)), min_size=1, max_size=3)))
    return encode(meta, arrs)


@st.composite
def bad_pull(draw: st.DrawFn) -> bytes:
    key = draw(st.sampled_from(KEYS))
    defect = draw(st.sampled_from(["unknown", "rows_dtype", "rows_range", "rows_missing", "entry", "vars"]))
    arrs: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {"vars": [[key, "r"]]}
    arrs["r"] = np.array([0], dtype=np.int64)
    if defect == "unknown":
        meta["vars"][0][0] = draw(st.text(max_size=12).filter(lambda s: s not in KEYS))
    elif defect == "rows_dtype":
        arrs["r"] = draw(arrays(dtype=st.sampled_from(["<f4", "<f8", "|b1"]), shape=st.just((1,))))
    elif defect == "rows_range":
        arrs["r"] = np.array([draw(st.one_of(st.integers(-2**62, -1), st.integers(ROWS[key], 2**62)))], np.int64)
    elif defect == "rows_missing":
        meta["vars"][0][1] = draw(st.one_of(st.text(max_size=6).filter(lambda s: s != "r"), st.integers(),
                                            st.lists(st.integers(), max_size=2)))
    elif defect == "entry":
        meta["vars"] = [draw(st.one_of(st.text(max_size=6), st.integers(), st.lists(st.text(max_size=3), min_size=3, max_size=4)))]
    else:
        meta["vars"] = draw(st.one_of(st.none(), st.text(max_size=6), st.integers(),
                                      st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)))
    return encode(meta, arrs)


@st.composite
def huge_frame(draw: st.DrawFn) -> bytes:
    """A frame whose header declares far more data than it carries."""
    dtype = draw(dtypes)
    dims = draw(st.lists(st.integers(1, 2**40), min_size=1, max_size=4))
    count = 1
    for d in dims:
        count *= d
    nbytes = draw(st.sampled_from([count * np.dtype(dtype).itemsize, 2**62, 2**40]))
    offset = draw(st.sampled_from([64, 2**40, -8]))
    header = json.dumps({"meta": {"grads": [["bias", "dense"]], "vars": [["bias", None]]},
                         "arrays": [["g/bias", dtype, dims, offset, nbytes]]}).encode()
    declared = draw(st.sampled_from([len(header), 2**31, 2**32 - 1]))
    return struct.pack("<4sI", MAGIC, declared) + header + b"\0" * draw(st.integers(0, 64))


wrong_payload = st.one_of(
    st.dictionaries(st.sampled_from(["layout", "optimizer", "vars", "grads", "token", "chief", "sync", "step"]),
                    st.one_of(st.none(), st.integers(), st.text(max_size=6), st.lists(st.integers(), min_size=1, max_size=3),
                              st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2)),
                    min_size=1, max_size=4),
)


def test_fuzzed_requests_are_refused_cleanly_and_change_nothing(local_cluster: Callable[..., ClusterHandle]) -> None:
    handle = local_cluster(1)
    client = ParameterClient(handle.cluster, _model(handle.cluster).placements(), client_name="/job:worker/task:0",
                             config=ConnectConfig(connect_timeout=30, rpc_timeout=10, token=handle.token))
    client.connect()
    client.register(OptimizerSpec("sgd", {"learning_rate": 1.0}), chief=True)
    raw = RawPs(handle.cluster.task_address("ps", 0), handle.token)
    assert raw.status("Fence", encode({"token": 7})) == grpc.StatusCode.OK
    before = client.pull({"emb": None, "bias": None})
    stats_before = client.stats(0)

    @FUZZ
    @given(method=st.sampled_from(["Register", "Pull", "Push", "Stats", "Shutdown", "Fence", "Leave", "SaveShard",
                                   "LoadShard", "SetReady", "Done"]),
           payload=st.binary(max_size=256))
    def random_bytes(method: str, payload: bytes) -> None:
        if payload.startswith(MAGIC):
            payload = b"X" + payload
        raw.refused(method, payload)

    @FUZZ
    @given(payload=bad_push())
    def pushes(payload: bytes) -> None:
        raw.refused("Push", payload)

    @FUZZ
    @given(payload=bad_pull())
    def pulls(payload: bytes) -> None:
        raw.refused("Pull", payload)

    @settings(FUZZ, max_examples=200)
    @given(payload=huge_frame(), method=st.sampled_from(["Push", "Pull"]))
    def huge(payload: bytes, method: str) -> None:
        raw.refused(method, payload)

    @settings(FUZZ, max_examples=300)
    @given(meta=wrong_payload, method=st.sampled_from(["Register", "Push", "Pull", "Fence", "Done"]))
    def confused(meta: dict[str, Any], method: str) -> None:
        if method == "Fence":
            meta.pop("token", None)  # a valid token would be a legitimate write
        raw.refused(method, encode(meta))

    @settings(FUZZ, max_examples=100)
    @given(meta=wrong_payload, method=st.sampled_from(["Campaign", "Renew", "Resign", "Leader"]))
    def coordination(meta: dict[str, Any], method: str) -> None:
        raw.refused(method, encode(meta), service=COORDINATION_SERVICE)

    @settings(FUZZ, max_examples=100)
    @given(payload=bad_push(), method=st.sampled_from(["Push", "Pull", "Shutdown", "Fence"]))
    def no_token(payload: bytes, method: str) -> None:
        assert raw.status(method, payload, token=False) == grpc.StatusCode.UNAUTHENTICATED

    for run in (random_bytes, pushes, pulls, huge, confused, coordination, no_token):
        run()
    assert raw.calls >= 2000, raw.calls
    # Unknown methods get UNIMPLEMENTED from gRPC itself.
    assert raw.status("NoSuchMethod", b"") == grpc.StatusCode.UNIMPLEMENTED
    # Still serving, nothing changed.
    assert raw.status("Ping", b"", service=WORKER_SERVICE) != grpc.StatusCode.UNAVAILABLE
    assert handle.procs[("ps", 0)].poll() is None
    after = client.pull({"emb": None, "bias": None})
    for key in before:
        np.testing.assert_array_equal(after[key], before[key])
    stats_after = client.stats(0)
    for counter in ("pushes", "global_step", "init_count", "examples"):
        assert stats_after[counter] == stats_before[counter], counter
    assert raw.status("Fence", encode({"token": 6})) == grpc.StatusCode.ABORTED  # fence intact at 7
    assert "Traceback" not in handle.log("ps", 0), handle.log("ps", 0)[-3000:]
