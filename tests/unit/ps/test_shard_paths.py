"""SaveShard refuses a path no file system takes (a NUL byte) as a bad request, INVALID_ARGUMENT, naming it --
never an internal error (issue 30, item 5); nothing is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from psflow.ps.service import ParameterService
from psflow.rpc.api import InvalidRequest
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("confined", [True, False], ids=["served", "in-process"])
@pytest.mark.parametrize("where", ["name", "directory"])
def test_a_shard_path_with_a_nul_byte_is_refused(tmp_path: Path, confined: bool, where: str) -> None:
    service = ParameterService(0, holds_global_step=True, checkpoint_root=str(tmp_path), confine_shards=confined)
    (tmp_path / "ckpt-1").mkdir()
    path = str(tmp_path / "ckpt-1" / "sh\0ard.safetensors") if where == "name" else \
        str(tmp_path / "ck\0pt-1" / "shard.safetensors")
    with pytest.raises(InvalidRequest) as refused:
        service.handlers()["SaveShard"](Frame({"path": path}))
    assert str(refused.value) == f"refused to write checkpoint shard {path!r}: it holds a NUL byte"
    assert list((tmp_path / "ckpt-1").iterdir()) == []
