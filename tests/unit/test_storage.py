"""psflow/storage/ without a store (no sockets): the scheme registry, its errors, and the local semantics every
checkpoint and reader relies on. The same operations against real S3 and GCS emulators:
tests/integration/test_object_store.py.

Before: ``--checkpoint-dir gs://bucket/ckpt`` silently wrote into a local folder ``./gs:/bucket/ckpt``, and
``--checkpoint-dir foo://x`` into ``./foo:/x``. Now a URL is either a store psflow knows or one clear line.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from support import A9A

from psflow import storage
from psflow.cli.main import main
from psflow.data import DataError, expand_paths
from psflow.extras import MissingExtraError
from psflow.train.config import ConfigError, TrainConfig

pytestmark = pytest.mark.timeout(60)

KNOWN = "psflow reads and writes local paths, s3://, gs://, gcs:// and hdfs:// (untested)"


def test_schemes() -> None:
    assert [storage.scheme(p) for p in ("runs/ckpt", "/data/a9a", "file:///data/a9a", "s3://b/k", "GS://b/k",
                                        "hdfs://nn:8020/p", "gs:/b/k")] == [None, None, None, "s3", "gs", "hdfs", None]
    assert storage.is_remote("s3://b/k") and not storage.is_remote("file:///tmp/x")
    assert storage.absolute("s3://b/k") == "s3://b/k" and storage.absolute("x") == os.path.abspath("x")


@pytest.mark.parametrize("flag", ["--checkpoint-dir", "--train", "--eval", "--warm-start"])
def test_an_unknown_scheme_is_one_clear_error_before_anything_starts(flag: str, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    train = [] if flag == "--train" else ["--train", str(A9A)]
    code = main(["train", *train, "--num-features", "124", flag, "foo://bucket/x", "--output", "run"])
    assert code == 1
    assert capsys.readouterr().err == f"psflow train: error: {flag} foo://bucket/x: unknown scheme 'foo': {KNOWN}\n"
    assert sorted(os.listdir(tmp_path)) == []  # neither ./foo:/ nor the run directory


def test_gs_checkpoint_dir_without_gcsfs_names_the_extra_and_writes_no_local_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # as if not installed
    code = main(["train", "--train", str(A9A), "--num-features", "124", "--checkpoint-dir", "gs://bucket/ckpt",
                 "--output", "run"])
    assert code == 1
    assert capsys.readouterr().err == ("psflow train: error: --checkpoint-dir gs://bucket/ckpt: gs:// paths need gcsfs: "
                                       "pip install 'psflow[cloud]'\n")
    assert sorted(os.listdir(tmp_path)) == []  # before: ./gs:/bucket/ckpt
    with pytest.raises(MissingExtraError) as info:
        TrainConfig.flat(checkpoint_dir="gs://bucket/ckpt")
    assert (info.value.name, info.value.extra) == ("gcsfs", "cloud") and isinstance(info.value, ConfigError)


def test_hdfs_without_pyarrow_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(MissingExtraError, match=r"^hdfs://nn:8020/ckpt: hdfs:// paths need pyarrow: pip install pyarrow"):
        storage.check_location("hdfs://nn:8020/ckpt")


def test_readers_and_tools_refuse_an_unknown_scheme(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(DataError, match=r"^foo://b/train-\*: foo://b/train-\*: unknown scheme 'foo'"):
        expand_paths(["foo://b/train-*"])
    assert main(["export", "foo://b/ckpt", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == f"psflow export: error: foo://b/ckpt: unknown scheme 'foo': {KNOWN}\n"
    assert not (tmp_path / "out").exists()


def test_local_write_is_atomic_and_exclusive_create_refuses_an_existing_file(tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    storage.write_atomically(path, b"one")
    storage.write_atomically(path, memoryview(b"two"))
    assert storage.read_bytes(path) == b"two" and os.listdir(tmp_path) == ["f"]  # no temp file left
    assert storage.read_head(path, 2) == b"tw"
    assert not storage.create_exclusive(path, b"three") and storage.read_bytes(path) == b"two"
    assert storage.create_exclusive(str(tmp_path / "g"), b"x") and storage.read_bytes(str(tmp_path / "g")) == b"x"
    storage.remove(str(tmp_path / "g"))
    with pytest.raises(FileNotFoundError):
        storage.remove(str(tmp_path / "g"))
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(str(tmp_path / "missing"))


def test_a_write_that_need_not_survive_a_crash_is_still_whole_or_absent(tmp_path: Path) -> None:
    path = str(tmp_path / "status.json")
    storage.write_atomically(path, b'{"a": 1}', durable=False)
    storage.write_atomically(path, b'{"a": 2}', durable=False)
    assert storage.read_bytes(path) == b'{"a": 2}' and os.listdir(tmp_path) == ["status.json"]
    with pytest.raises(FileNotFoundError):
        storage.write_atomically(str(tmp_path / "missing" / "f"), b"x", durable=False)


def test_every_file_psflow_replaces_whole_is_written_by_write_atomically() -> None:
    # One way to replace a file (temp file, rename): a rename anywhere else is a second way.
    # data/convert.py renames its shards together once every one of them is written (streamed, not one buffer).
    root = Path(storage.__file__).parent.parent  # psflow/
    renames = {str(p.relative_to(root)) for p in root.rglob("*.py")
               if re.search(r"\bos\.(replace|rename)\(|\.rename\(", p.read_text(encoding="utf-8"))}
    assert renames == {"storage/__init__.py", "data/convert.py"}


def test_local_listing_subdirectories_and_glob(tmp_path: Path) -> None:
    for name in ("ckpt-2", "ckpt-1", "other"):
        (tmp_path / name).mkdir()
    (tmp_path / "ckpt-3").write_text("a file, not a checkpoint")
    (tmp_path / "ckpt-4").symlink_to(tmp_path / "other")  # leads outside: never listed
    assert storage.subdirectories(str(tmp_path), "ckpt-") == [str(tmp_path / "ckpt-1"), str(tmp_path / "ckpt-2")]
    assert storage.subdirectories(str(tmp_path / "missing"), "ckpt-") == []
    assert sorted(storage.listdir(str(tmp_path))) == ["ckpt-1", "ckpt-2", "ckpt-3", "ckpt-4", "other"]
    assert storage.glob(str(tmp_path / "ckpt-*")) == [str(tmp_path / "ckpt-3")]  # files only
    assert storage.glob(f"file://{tmp_path}/ckpt-*") == [f"file://{tmp_path / 'ckpt-3'}"]
    assert storage.isfile(f"file://{tmp_path / 'ckpt-3'}") and storage.isdir(str(tmp_path / "ckpt-1"))
    assert storage.islink(str(tmp_path / "ckpt-4")) and not storage.islink("s3://b/ckpt-4")
    storage.remove_tree(str(tmp_path / "ckpt-1"))
    assert not storage.exists(str(tmp_path / "ckpt-1"))
    storage.remove_tree(str(tmp_path / "ckpt-1"), ignore_errors=True)  # gone already: nothing to do


def test_is_under(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "out").symlink_to(tmp_path)
    assert storage.is_under(str(tmp_path / "root"), str(tmp_path / "root" / "ckpt-1" / "shard"))
    assert not storage.is_under(str(tmp_path / "root"), str(tmp_path / "root" / "out" / "shard"))  # a symlink out
    assert not storage.is_under(str(tmp_path / "root"), str(tmp_path / "root" / ".." / "shard"))
    assert storage.is_under("s3://b/ckpt", "s3://b/ckpt/ckpt-1/shard")
    for outside in ("s3://b/ckpt2/x", "s3://b/ckpt/../x", "gs://b/ckpt/x", "s3://other/ckpt/x", str(tmp_path)):
        assert not storage.is_under("s3://b/ckpt", outside), outside
    assert not storage.is_under(str(tmp_path), "s3://b/ckpt/x")


def test_each_client_librarys_error_becomes_one_line_naming_the_url_of_its_kind() -> None:
    """client_errors on the errors the client libraries raise (instances of their own classes): each table row of
    psflow/storage/client.py, also those no test store answers with (tests/integration/test_object_store_errors.py
    meets some from real stores); an error of no client library passes as it is."""
    botocore = pytest.importorskip("botocore.exceptions")
    google = pytest.importorskip("google.auth.exceptions")
    aiohttp = pytest.importorskip("aiohttp")
    requests = pytest.importorskip("requests.exceptions")
    cases: list[tuple[str, BaseException, type[storage.StoreError], str]] = [
        ("s3://b/x", botocore.NoCredentialsError(), storage.StoreDeniedError, "no credentials for s3://"),
        ("s3://b/x", botocore.EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
         storage.StoreUnreachableError, "the store did not answer"),
        ("s3://b/x", botocore.ParamValidationError(report="bad"), storage.StoreError, "ParamValidationError: "),
        ("gs://b/x", google.DefaultCredentialsError("none found"), storage.StoreDeniedError, "no credentials for gs://"),
        ("gs://b/x", aiohttp.ClientPayloadError("cut short"), storage.StoreUnreachableError, "the store did not answer"),
        ("gs://b/x", aiohttp.ClientConnectionError("refused"), storage.StoreUnreachableError,  # an OSError
         "the store did not answer"),
        ("gs://b/x", requests.ProxyError("502"), storage.StoreUnreachableError, "the store is unavailable"),
    ]
    for url, error, kind, says in cases:
        with pytest.raises(storage.StorageError) as raised, storage.client.client_errors(url):
            raise error
        assert type(raised.value) is kind and isinstance(raised.value, OSError), (error, raised.value)
        assert str(raised.value).startswith(f"{url}: {says}") and "\n" not in str(raised.value), raised.value
    with pytest.raises(ValueError, match="^not a store's$"), storage.client.client_errors("s3://b/x"):
        raise ValueError("not a store's")
