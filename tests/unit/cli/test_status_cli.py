"""``psflow status`` prints what a run's status holds, never what a terminal would act on, and refuses a snapshot
of another shape, a URL it cannot ask or a bad --watch in one line (issue 30, item 3). No sockets here: the
oversized reply is tests/integration/test_status_reply_limit.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from psflow.cli.main import main
from psflow.cli.status import StatusError, fetch_status

pytestmark = pytest.mark.timeout(60)

#: A window title, a colour, a screen clear, a carriage return over the line, a bidi override, a line break.
HOSTILE = "r1\x1b]0;owned\x07\x1b[31m\x1b[2J\rfake\u202eline\nbreak\x9b"


def snapshot(run_dir: str) -> dict[str, object]:
    return {"run": {"run_dir": run_dir, "phase": "running", "model": HOSTILE},
            "tasks": [{"task": f"/job:ps/task:0{HOSTILE}", "host": HOSTILE, "state": "up",
                       "history": [{"event": "restarted", "detail": HOSTILE}]}],
            "hangs": [HOSTILE], "checkpoints": {"saved": 1, "failed": 0, "last_saved_step": 5,
                                                "last_saved_path": HOSTILE}}


def test_control_characters_from_a_status_file_are_printed_escaped(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / HOSTILE.replace("/", "_")
    run.mkdir()
    (run / "status.json").write_text(json.dumps(snapshot(str(run))))
    assert main(["status", str(run)]) == 0
    out = capsys.readouterr().out
    assert not any(ch in out for ch in "\x1b\x07\r\u202e\x9b"), ascii(out)
    assert out.count("\\x1b]0;owned\\x07\\x1b[31m\\x1b[2J\\rfake\\u202eline\\nbreak\\x9b") == 7, out
    assert out.startswith(f"run {tmp_path}/r1\\x1b]0;owned")  # one line, not broken by the name's \n
    assert main(["status", str(run), "--json"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and json.loads(out)["run"]["model"] == HOSTILE  # JSON escapes it, and reads back


def test_a_status_error_never_carries_a_control_character() -> None:
    assert str(StatusError(f"http://x/{HOSTILE}: HTTP 500 {HOSTILE}")).isprintable()


@pytest.mark.parametrize("content", ['{"run": 5, "tasks": []}', '{"tasks": [5]}', '{"tasks": [{"task": 1}]}',
                                     '{"tasks": [], "ps": {"a": 1}}', '{"tasks": [], "faults": [{"spec": 1}]}',
                                     '{"tasks": [], "checkpoints": []}', '{"tasks": [], "sync": 3}'])
def test_a_snapshot_of_another_shape_is_one_line(tmp_path: Path, content: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "status.json"
    path.write_text(content)
    assert main(["status", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"psflow status: error: {path}: not a psflow status snapshot of this version (")
    assert err.count("\n") == 1, err


def test_json_nested_deeper_than_a_snapshot_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    path.write_text('{"tasks": [], "x": ' + "[" * 200 + "]" * 200 + "}")  # psflow would recurse printing it
    with pytest.raises(StatusError, match=r"status.json: nested deeper than 32 levels: not a psflow status snapshot"):
        fetch_status(str(path))
    path.write_text('{"tasks": ' + "[" * 50000 + "]" * 50000 + "}")  # past what Python's json decodes
    with pytest.raises(StatusError, match=r"status.json: unreadable \(maximum recursion depth exceeded"):
        fetch_status(str(path))
    path.write_text('{"tasks": [], "x": ' + "[" * 30 + "]" * 30 + "}")
    assert fetch_status(str(path))["tasks"] == []


@pytest.mark.parametrize("url, why", [("http://[::1", "Invalid IPv6 URL"), ("http://", "no host"),
                                      ("http://127.0.0.1:port/", "Port could not be cast to integer value")])
def test_a_url_psflow_cannot_ask_is_one_line(url: str, why: str) -> None:
    with pytest.raises(StatusError, match=rf"^{re.escape(url)}: not a URL psflow can ask \({why}"):
        fetch_status(url)


def test_a_status_file_larger_than_the_limit_is_not_read_whole(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("psflow.cli.status.MAX_REPLY_BYTES", 1024)
    path = tmp_path / "status.json"
    path.write_text(json.dumps({"tasks": [], "pad": "x" * 2000}))
    with pytest.raises(StatusError, match=r"status.json: larger than 1,024 bytes: not a psflow status snapshot"):
        fetch_status(str(path))


def test_a_negative_watch_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "status.json").write_text(json.dumps({"tasks": []}))
    assert main(["status", str(tmp_path), "--watch", "-1"]) == 1
    assert capsys.readouterr().err == "psflow status: error: --watch -1.0: want seconds >= 0\n"
