"""``--in-process`` reads ``--save-timeout``, ``--rpc-timeout`` and ``--connect-timeout`` as a cluster's worker does.

Its client was made with ConnectConfig's defaults: ``--save-timeout 5`` was ignored (a final save was waited for
600 s, never given up at 5), silently. The client of the run's worker is caught as the run starts and the run stopped
there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import psflow.launch.in_process as in_process
from psflow.train.config import TrainConfig

pytestmark = pytest.mark.timeout(120)

A9A = Path(__file__).resolve().parents[3] / "data" / "a9a" / "a9a"


class _Caught(Exception):
    pass


def test_the_in_process_client_takes_the_run_s_timeouts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def run_worker(config: TrainConfig, cluster: Any, index: int, *, client: Any, **kwargs: Any) -> Any:
        seen["config"] = client.config
        raise _Caught

    monkeypatch.setattr(in_process, "run_worker", run_worker)
    config = TrainConfig.flat(train=(str(A9A),), num_features=124, num_ps=1, num_workers=1, max_steps=2,
                              save_timeout=5.0, rpc_timeout=7.0, connect_timeout=9.0)
    with pytest.raises(_Caught):
        in_process.run_in_process(config, str(tmp_path / "run"))
    got = seen["config"]
    assert (got.save_timeout, got.rpc_timeout, got.connect_timeout) == (5.0, 7.0, 9.0), got
