"""``psflow status RUN_DIR_OR_URL``: the status page's picture of a run, in a terminal.

A URL (``http://127.0.0.1:PORT/``, as ``psflow train`` prints it) is asked for
``api/status`` (with ``PSFLOW_TOKEN`` as a bearer token when it is set); a run
directory is read from its ``status.json``, which the launcher keeps current
while the run lasts and leaves behind when it ends. ``--watch S`` redraws every
S seconds until Ctrl-C. Reads only; never changes the run.

What it reads is data, maybe from anything that answers the URL: at most
:data:`MAX_REPLY_BYTES` of it is read; every string printed from it has its
control and format characters escaped (no escape sequence reaches the
terminal); a snapshot of another shape, a URL that does not parse and a
blank ``PSFLOW_TOKEN`` are each a :class:`StatusError` (one line), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, TextIO

from psflow.errors import PsflowError
from psflow.launch.token import TOKEN_ENV, cluster_token
from psflow.status.collector import STATUS_FILE
from psflow.status.server import StatusConfig

__all__ = ["StatusError", "add_status_parser", "fetch_status", "render_status", "run_status", "status_config"]

#: The largest status reply or status.json read (bytes): a snapshot is a few hundred KiB; anything this large
#: is not one, and reading it whole would take that much memory.
MAX_REPLY_BYTES = 16 << 20
#: The deepest nesting of lists and objects read (a snapshot nests 4 levels): deeper data is not a snapshot, and
#: printing it would recurse past Python's limit.
MAX_DEPTH = 32


class StatusError(PsflowError):
    """The run's status could not be read (names the directory or URL and why; control characters escaped)."""

    def __init__(self, message: str) -> None:
        super().__init__(_printable(message))


def _printable(text: str) -> str:
    """``text`` with every character a terminal would act on (escape sequences, other control and format
    characters, line breaks) written as its Python escape, e.g. ``\\x1b``: data from a status reply or file
    cannot move the cursor, recolour or retitle the terminal, or fake a line."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def _printable_data(value: Any) -> Any:
    """A snapshot with :func:`_printable` applied to every string in it (keys too)."""
    if isinstance(value, str):
        return _printable(value)
    if isinstance(value, dict):
        return {_printable_data(k): _printable_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable_data(v) for v in value]
    return value


def add_status_parser(sub: Any) -> None:
    p = sub.add_parser("status", help="show a run's status (its run directory, or the URL psflow train printed)")
    p.add_argument("target", metavar="RUN_DIR_OR_URL")
    p.add_argument("--watch", type=float, metavar="S", help="redraw every S seconds until Ctrl-C")
    p.add_argument("--json", action="store_true", help="print the snapshot as JSON instead")


def status_config(args: argparse.Namespace) -> StatusConfig:
    """The status page settings of ``psflow train`` / ``psflow server`` flags.

    Raises:
        ConfigError: ``PSFLOW_TOKEN`` holds only whitespace (:func:`psflow.launch.token.cluster_token`).
    """
    return StatusConfig(enabled=not args.no_status, host=args.status_host, port=args.status_port,
                        token=cluster_token(os.environ))


def fetch_status(target: str, *, timeout: float = 5.0) -> dict[str, Any]:
    """The snapshot of a run directory or a status URL.

    Raises:
        StatusError: nothing readable there (names it and why).
    """
    if target.startswith(("http://", "https://")):
        url = target.rstrip("/") + "/api/status"
        try:
            if not urllib.parse.urlsplit(url).hostname:
                raise ValueError("no host")
            urllib.parse.urlsplit(url).port  # noqa: B018 - raises for a port that is not a number
            request = urllib.request.Request(url)
        except ValueError as e:
            raise StatusError(f"{target}: not a URL psflow can ask ({e}); want e.g. "
                              "http://127.0.0.1:PORT/ as psflow train printed it") from None
        token = cluster_token(os.environ)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:  # noqa: S310 - the user's own URL
                body = reply.read(MAX_REPLY_BYTES + 1)
                if len(body) > MAX_REPLY_BYTES:
                    raise StatusError(f"{url}: the reply is larger than {MAX_REPLY_BYTES:,} bytes: not a psflow "
                                      "status reply (a status snapshot is a few hundred KiB)")
                data = json.loads(body)
        except urllib.error.HTTPError as e:
            hint = f" (set {TOKEN_ENV})" if e.code == 401 else ""
            raise StatusError(f"{url}: HTTP {e.code} {e.reason}{hint}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise StatusError(f"{url}: cannot reach the status page ({reason}); has the run ended? "
                              "Its run directory keeps status.json") from None
        except (ValueError, RecursionError) as e:  # not JSON, or nested past what Python decodes
            raise StatusError(f"{url}: not a psflow status reply ({e})") from None
    else:
        path = os.path.join(target, STATUS_FILE) if os.path.isdir(target) else target
        if not os.path.exists(path):
            raise StatusError(f"{target}: no {STATUS_FILE} (not a psflow run directory, or a run started "
                              "with --no-status or --in-process)")
        try:
            with open(path, "rb") as f:
                text = f.read(MAX_REPLY_BYTES + 1)
            if len(text) > MAX_REPLY_BYTES:
                raise StatusError(f"{path}: larger than {MAX_REPLY_BYTES:,} bytes: not a psflow status snapshot")
            data = json.loads(text)
        except (OSError, ValueError, RecursionError) as e:
            raise StatusError(f"{path}: unreadable ({e})") from None
    if not isinstance(data, dict) or "tasks" not in data:
        raise StatusError(f"{target}: not a psflow status snapshot")
    if _nested_deeper_than(data, MAX_DEPTH):
        raise StatusError(f"{target}: nested deeper than {MAX_DEPTH} levels: not a psflow status snapshot")
    return data


def _nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether lists and objects in ``value`` nest deeper than ``limit`` (walked without recursion)."""
    level: list[Any] = [value]
    for _ in range(limit + 1):
        level = [child for item in level if isinstance(item, (dict, list))
                 for child in (item.values() if isinstance(item, dict) else item)]
        if not level:
            return False
    return True


def _rate(x: Any) -> str:
    """A learning rate: 4 significant digits (a decayed one can be tiny)."""
    return f"{x:.4g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "-"


def _num(x: Any, digits: int | None = None) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and digits is not None:
        return f"{x:.{digits}f}"
    if isinstance(x, (int, float)):
        return f"{x:,.0f}"
    return str(x)


def _bytes(x: Any) -> str:
    if not isinstance(x, (int, float)):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(x) < 1024 or unit == "GiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return str(x)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _mode(run: dict[str, Any]) -> str:
    """The run's mode as status.json has it: with its staleness, and the mode it ran as where that differs (an
    ``--in-process --mode ssp`` run's one worker runs as async: :func:`psflow.launch.in_process.mode_fields`)."""
    words = str(run.get("mode", "?")) + (f" --staleness {run['staleness']}" if run.get("staleness") is not None else "")
    return words + (f", ran as {run['ran_as']}" if run.get("ran_as") else "")


def render_status(s: dict[str, Any]) -> str:
    """The snapshot as text: headline, tasks, ps tasks, sync/staleness, faults, checkpoints."""
    run = s.get("run", {})
    auc = (s.get("eval") or {}).get("auc")
    if auc is None and s.get("scalars", {}).get("eval/auc"):
        auc = s["scalars"]["eval/auc"][-1][1]
    name = run.get("run_dir") or f"served by {run.get('served_by', '?')}"  # psflow server's chief: no run directory
    lines = [
        f"run {name}: {run.get('phase', '?')} after {_num(run.get('elapsed'), 1)} s "
        f"({_mode(run)}, {run.get('replication', '?')}, model {run.get('model', '?')})",
        f"global_step {_num(s.get('global_step'))} | examples {_num(s.get('examples'))} | "
        f"{_num(s.get('examples_per_sec'))} examples/s | loss {_num(s.get('loss'), 4)} | eval AUC {_num(auc, 4)} | "
        f"learning rate {_rate(s.get('learning_rate'))}",
        "",
    ]
    now = s.get("time") or time.time()
    rows = [["task", "host", "pid", "state", "heartbeat", "restarts", "generation", "deaths and restarts"]]
    for t in s.get("tasks", []):
        state = t["state"] + (f" ({t['exit']})" if t.get("exit") and t["state"] != "up" else "")
        beat = "never" if t.get("last_heartbeat") is None else f"{now - t['last_heartbeat']:.1f} s ago"
        history = " -> ".join(f"{h['event']} ({h.get('detail', '')})" for h in t.get("history", []))
        rows.append([t["task"], t.get("host", ""), _num(t.get("pid")), state, beat, _num(t.get("restarts")),
                     _num(t.get("generation")), history])
    lines += _table(rows)
    if s.get("ps"):
        lines.append("")
        rows = [["ps task", "pushes/s", "pulls/s", "bytes in/s", "bytes out/s", "apply s/s", "pushes", "variables"]]
        for p in s["ps"]:
            r = p.get("rates", {})
            rows.append([p["task"], _num(r.get("pushes_per_sec")), _num(r.get("pulls_per_sec")),
                         _bytes(r.get("bytes_in_per_sec")), _bytes(r.get("bytes_out_per_sec")),
                         _num(r.get("apply_seconds_per_sec"), 3), _num(p.get("pushes")), _bytes(p.get("parameter_bytes"))])
        lines += _table(rows)
    lines.append("")
    sync = s.get("sync")
    if sync is not None:
        failed = sync.get("failed") or {}  # a failed step waits for nobody: its pushes are refused until a restore
        for why in dict.fromkeys(failed.values()):  # each ps task's part of the step fails alike: one line each why
            on = ", ".join(task for task, said in failed.items() if said == why)
            lines.append(f"sync: step failed on {on}: {why}; every push is refused until a restore")
        if sync.get("waiting_for"):
            lines.append(f"sync: step has gradients from {', '.join(sync['contributed']) or 'nobody'}; waiting "
                         f"{_num(sync.get('waiting_seconds'), 1)} s for {', '.join(sync['waiting_for'])}")
        elif not failed:
            lines.append(f"sync: no step waiting; {_num(sync.get('steps_applied'))} steps applied, "
                         f"{_num(sync.get('stale_dropped'))} stale gradients dropped")
    histogram = s.get("staleness_histogram") or {}
    if histogram:
        lines.append("staleness (steps: pushes): " + ", ".join(f"{k}: {v}" for k, v in
                                                               sorted(histogram.items(), key=lambda kv: int(kv[0]))))
    for f in s.get("faults", []):
        recovery = f"recovered in {f['recovery_seconds']:.2f} s" if f.get("recovery_seconds") is not None else (
            f"not recovered: {f['why']}" if f.get("why") else "not recovered")
        lines.append(f"fault: {f['spec']}: {f['signal']} to {f['task']} (pid {f['pid']}) at step {f['at_step']}; "
                     f"{recovery}")
    for r in s.get("restarts", []):
        lines.append(f"death: {r['task']} (pid {r['pid']}) {r['exit']}: {r['decision']}")
    for h in s.get("hangs", []):
        lines.append(f"hang: {h}")
    c = s.get("checkpoints")
    if c is not None:
        newest = f"; newest at step {c['last_saved_step']}: {c['last_saved_path']}" \
            if c.get("last_saved_step") is not None else ""
        if c.get("last_saved_by_this_run") is False:
            newest += " (restored at the start, saved by an earlier run)"
        lines.append(f"checkpoints: {_num(c.get('saved'))} saved, {_num(c.get('failed'))} failed{newest}")
    lines += _replicas(s)
    return "\n".join(lines).rstrip() + "\n"


def _replicas(s: dict[str, Any]) -> list[str]:
    """(--ps-replicas) The run's pushes acknowledged, applied and lost, and per shard its primary, backups
    (how far behind), members joining (what is queued for them) and losses, and each shard not read at the end
    (``shards_unread``); nothing for an unreplicated run (its snapshot has none of them)."""
    lines = []
    if s.get("updates_lost") is not None:
        lines.append(f"replicated shards: pushes acknowledged {_num(s.get('pushes_acknowledged'))} | "
                     f"applied {_num(s.get('pushes_applied'))} | updates lost {_num(s.get('updates_lost'))}")
    for shard in s.get("shards") or []:
        backups = ", ".join(f"{b['task']} ({_num(b.get('lag_entries'))} entries, {_num(b.get('lag_seconds'), 2)} s behind)"
                            for b in shard.get("backups") or [])
        joining = "".join(f", joining {j['task']} ({_num(j.get('lag_entries'))} entries queued)"
                          for j in shard.get("joining") or [])
        lines.append(f"shard {shard['shard']}: primary {shard.get('primary') or 'none'} (epoch {_num(shard.get('epoch'))}), "
                     f"{'backups ' + backups if backups else 'no backup'}{joining}; "
                     f"{_num(shard.get('updates_lost'))} updates lost")
    for unread in s.get("shards_unread") or []:  # no member answered at the run's end: the totals are not known
        lines.append(f"shard {unread.get('shard')}: not read at the run's end ({unread.get('error')}): pushes "
                     "acknowledged, applied and updates lost not known")
    return lines


def _render(snapshot: dict[str, Any], target: str) -> str:
    """:func:`render_status` of ``snapshot`` with its strings made printable; a snapshot of another shape
    (a field of the wrong type) is a StatusError naming ``target``, not a traceback."""
    try:
        return render_status(_printable_data(snapshot))
    except (AttributeError, KeyError, TypeError, ValueError, IndexError) as e:
        raise StatusError(f"{target}: not a psflow status snapshot of this version ({type(e).__name__}: {e}); "
                          "psflow status --json prints it as it is") from None


def run_status(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """``psflow status``; returns the exit status.

    Raises:
        StatusError: the target holds no readable status.
    """
    out = out or sys.stdout
    if args.watch is not None and not args.watch >= 0:
        raise StatusError(f"--watch {args.watch}: want seconds >= 0")
    while True:
        snapshot = fetch_status(args.target)
        text = json.dumps(snapshot, indent=1) + "\n" if args.json else _render(snapshot, args.target)
        if args.watch and out.isatty():
            out.write("\x1b[H\x1b[2J")
        out.write(text)
        out.flush()
        if not args.watch:
            return 0
        time.sleep(args.watch)
