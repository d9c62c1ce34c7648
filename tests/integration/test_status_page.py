"""The live status page, /metrics and ``psflow status`` during a real ``psflow train`` (issue 16, items 1-3).

Real launcher and tasks on a9a; the page is read by headless Chromium (Debian's ``chromium``, started
here, skipped where absent), ``/metrics`` by the Prometheus client's own parser. Waits are safety nets:
every condition is polled, nothing depends on the machine's speed. Whatever a test started is ended by
pid (the launcher, then any task process it left).
"""

from __future__ import annotations

import html.parser
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import A9A, A9A_T, REPO, run_bounded, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

LIMIT = 120.0  # safety net, seconds


def get(url: str, headers: dict[str, str] | None = None) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as reply:
        return bytes(reply.read())


class Run:
    """One ``psflow train`` on a9a whose stderr goes to a file; knows its status URL."""

    def __init__(self, out: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.out = out
        self.stderr_path = out.parent / f"{out.name}.stderr"
        cmd = [sys.executable, "-m", "psflow", "train", "--train", str(A9A), "--eval", str(A9A_T),
               "--num-features", "124", "--ps", "2", "--workers", "2", "--output", str(out), *extra]
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                         cwd=str(REPO), start_new_session=True, env=env)
        self.task_pids: set[int] = set()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def url(self) -> str:
        found = wait_until(lambda: re.search(r"psflow: status (http://(?:[0-9.]+|\[[0-9a-f:]+\]):\d+/)", self.stderr())
                           or self.proc.poll() is not None, "the status URL printed")
        assert found is not True, f"psflow train ended before printing its status URL:\n{self.stderr()}"
        return str(found.group(1))

    def status(self, url: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
        snapshot: dict[str, Any] = json.loads(get(url + "api/status", headers))
        self.task_pids.update(t["pid"] for t in snapshot["tasks"] if t.get("pid"))
        return snapshot

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        for pid in self.task_pids:  # tasks follow a dead launcher within seconds; this only tidies up
            try:
                if b"psflow.launch.task" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass


@pytest.fixture
def run_factory(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    runs: list[Run] = []

    def start(name: str, *extra: str, env: dict[str, str] | None = None) -> Run:
        runs.append(Run(tmp_path / name, *extra, env=env))
        return runs[-1]

    yield start
    for r in runs:
        r.close()


# ---- the page in Chromium -----------------------------------------------------------------------
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(*args: str, cwd: Path) -> str:
    """Runs headless Chromium once (its own process group, killed by id past the limit); returns stdout."""
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--disable-extensions", f"--user-data-dir={cwd / 'chromium-profile'}",
           "--virtual-time-budget=4000", *args]
    return run_bounded(cmd, cwd=cwd, timeout=90).stdout


class PageView(html.parser.HTMLParser):
    """What the rendered page shows: the tiles by id, and each row's data attributes and cells (``rows``: the
    cluster table's, ``ps_rows``: the ps tasks table's)."""

    def __init__(self, dom: str) -> None:
        super().__init__()
        self.values: dict[str, str] = {}
        self.rows: dict[str, dict[str, Any]] = {}
        self.ps_rows: dict[str, dict[str, Any]] = {}
        self._id: str | None = None
        self._row: dict[str, Any] | None = None
        self._table: str | None = None
        self.feed(dom)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table":
            self._table = a.get("id")
        if a.get("id") in ("global-step", "examples", "phase"):
            self._id = a["id"]
            self.values[self._id] = ""
        if tag == "tr" and self._table in ("tasks", "ps") and a.get("data-task"):
            self._row = {k: v for k, v in a.items()}
            self._row["cells"] = []
            (self.rows if self._table == "tasks" else self.ps_rows)[str(a["data-task"])] = self._row
        if tag == "td" and self._row is not None:
            self._row["cells"].append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("div", "span"):
            self._id = None
        if tag == "tr":
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._id is not None:
            self.values[self._id] += data
        if self._row is not None and self._row["cells"]:
            self._row["cells"][-1] += data


def step_shown(view: PageView) -> int:
    return int(view.values["global-step"].replace(",", ""))


#: The README's picture of the page (docs/status_page.png) is this test's screenshot: it is copied into
#: ``$PSFLOW_SCREENSHOT_DIR`` when that is set (``PSFLOW_SCREENSHOT_DIR=docs pytest tests/integration/
#: test_status_page.py -k chromium`` writes it anew).
SCREENSHOT_WINDOW = "--window-size=1400,1400"


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium)")
def test_the_live_page_in_chromium_lists_tasks_advances_and_shows_a_death_and_restart(
        run_factory: Callable[..., Run], tmp_path: Path) -> None:
    run = run_factory("run", "--batch-size", "32", "--epochs", "500", "--quiet", "--restart-policy", "on-failure",
                      "--eval-every-steps", "2000")
    url = run.url()
    wait_until(lambda: (run.status(url).get("global_step") or 0) > 0, "training started")

    first = PageView(chromium("--dump-dom", url, cwd=tmp_path))
    tasks = {f"/job:{job}/task:{i}" for job in ("ps", "worker") for i in range(2)}
    assert set(first.rows) == tasks, first.rows.keys()
    assert all(r["data-state"] == "up" for r in first.rows.values()), first.rows
    assert first.values["phase"] == "training"
    shown = step_shown(first)
    assert shown > 0
    # ps task 0 holds the 124 weights, ps task 1 the bias: every step pushes to and pulls from both (the same
    # request counts), ps task 0 moves the bytes. The busiest is ps task 0 (issue 30, item 6), and a ps task
    # never restored says so, not "0".
    assert [name for name, r in first.ps_rows.items() if "(busiest)" in r["cells"][0]] == ["/job:ps/task:0"]
    assert [first.rows[f"/job:ps/task:{i}"]["cells"][6] for i in range(2)] == ["never", "never"]

    victim = next(t for t in run.status(url)["tasks"] if t["task"] == "/job:worker/task:1")
    os.kill(victim["pid"], signal.SIGKILL)  # a task of the launcher this test started
    wait_until(lambda: any(t["task"] == victim["task"] and t["restarts"] == 1 and t["state"] == "up"
                           for t in run.status(url)["tasks"]), "the killed worker restarted and up again")
    before = run.status(url)["global_step"]
    wait_until(lambda: run.status(url)["global_step"] > before, "training goes on after the restart")

    shot = tmp_path / "status_page.png"
    chromium(f"--screenshot={shot}", SCREENSHOT_WINDOW, url, cwd=tmp_path)
    assert shot.exists() and shot.stat().st_size > 10_000
    keep = os.environ.get("PSFLOW_SCREENSHOT_DIR")
    if keep:
        shutil.copy(shot, Path(keep) / shot.name)

    second = PageView(chromium("--dump-dom", url, cwd=tmp_path))
    assert step_shown(second) > shown  # the counter advanced
    row = second.rows[victim["task"]]
    assert row["data-restarts"] == "1" and row["data-state"] == "up", row
    history = row["cells"][-1]
    # The row's history: the death (the old pid, how it ended), then the restart (the new pid).
    assert re.search(rf"dead \(pid {victim['pid']} was killed by signal SIGKILL\).*restarted \(pid \d+\)", history), history
    assert str(victim["pid"]) not in row["cells"][2]  # the pid column shows the new process
    assert set(second.rows) == tasks


# ---- /metrics and psflow status -----------------------------------------------------------------
def parse_metrics(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_metrics_parse_during_the_run_and_agree_with_metrics_json_at_the_end(
        run_factory: Callable[..., Run]) -> None:
    pytest.importorskip("prometheus_client")
    # Batches of 32: ~3,000 steps, a window of seconds for the scrape during training on a busy machine (at 64 a
    # starved test process once scraped as the run ended: the status server reset the connection).
    run = run_factory("run", "--batch-size", "32", "--epochs", "3", "--quiet")
    url = run.url()
    first, second = wait_until(lambda: len(lines := run.stderr().splitlines()) >= 2 and lines[:2], "two lines printed")
    assert first == f"psflow: status {url}", run.stderr()  # the run's first line, as docs/status.md says
    assert second == f"psflow: 2 ps + 2 workers, run directory {run.out}", run.stderr()

    def training_scrape() -> dict[str, dict[tuple[tuple[str, str], ...], float]] | None:
        assert run.proc.poll() is None, f"the run ended before a scrape saw it train: {run.stderr()[-2000:]}"
        try:
            m = parse_metrics(get(url + "metrics").decode())
        except OSError:  # a request cut off by the server (URLError is one): asked again
            return None
        return m if m.get("psflow_global_step") and m["psflow_global_step"][()] > 0 else None

    scraped = wait_until(training_scrape, "a scrape during training")
    labels = {dict(k)["job"] + dict(k)["task"] for k in scraped["psflow_task_up"]}
    assert labels == {"ps0", "ps1", "worker0", "worker1"}
    assert set(scraped["psflow_ps_pushes_total"]) == {(("job", "ps"), ("task", "0")), (("job", "ps"), ("task", "1"))}
    assert run.proc.wait(timeout=LIMIT) == 0, run.stderr()
    metrics = json.loads((run.out / "metrics.json").read_text())
    final = parse_metrics((run.out / "metrics.prom").read_text())  # the last /metrics of the run
    # The run is over: no task shows up (the ps tasks still ran when its end was written; issue 30, item 6).
    ended = json.loads((run.out / "status.json").read_text())
    assert {t["task"]: t["state"] for t in ended["tasks"]} == {
        f"/job:{job}/task:{i}": "finished" for job in ("ps", "worker") for i in range(2)}
    assert all(v == 0.0 for v in final["psflow_task_up"].values()), final["psflow_task_up"]
    # Over the whole run, ps task 0 (the 124 weights) moved the bytes; ps task 1 holds the bias.
    assert [p["task"] for p in ended["ps"] if p["busiest"]] == ["/job:ps/task:0"]
    assert final["psflow_global_step"][()] == metrics["global_step"]
    assert final["psflow_examples_total"][()] == metrics["examples"] == 3 * 32_561
    assert final["psflow_eval_auc"][()] == pytest.approx(metrics["eval"]["auc"])
    for ps in metrics["ps"]:
        key = (("job", "ps"), ("task", ps["task"].rsplit(":", 1)[1]))
        assert final["psflow_ps_pushes_total"][key] == ps["pushes"]
        assert final["psflow_ps_pulls_total"][key] == ps["pulls"]
        assert final["psflow_ps_received_bytes_total"][key] == ps["bytes_in"]
        assert final["psflow_ps_sent_bytes_total"][key] == ps["bytes_out"]
    staleness = final["psflow_gradient_staleness_count"][()]
    assert staleness == sum(metrics["ps"][0]["staleness_histogram"].values())

    # psflow status on the finished run's directory: the same picture, from status.json.
    shown = subprocess.run([sys.executable, "-m", "psflow", "status", str(run.out)], capture_output=True, text=True,
                           timeout=60, cwd=str(REPO))
    assert shown.returncode == 0, shown.stderr
    assert f"global_step {metrics['global_step']:,}" in shown.stdout and "finished" in shown.stdout
    for task in ("/job:ps/task:0", "/job:ps/task:1", "/job:worker/task:0", "/job:worker/task:1"):
        assert task in shown.stdout


def test_the_chief_under_psflow_server_serves_the_page(tmp_path: Path) -> None:
    from psflow.launch.ports import free_ports

    ports = free_ports(3)
    cluster = {"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[2]}"]}
    base = dict(os.environ, PSFLOW_TOKEN="status-server-token")
    train = ["--train", str(A9A), "--num-features", "124", "--batch-size", "32", "--epochs", "500"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for job, index, extra in [("ps", 0, []), ("worker", 0, train), ("worker", 1, train)]:
            env = dict(base, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": job, "index": index}}))
            with open(tmp_path / f"{job}{index}.log", "wb") as log:
                procs.append(subprocess.Popen([sys.executable, "-m", "psflow", "server", *extra], stdout=log,
                                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                              cwd=str(REPO)))
        chief_log = tmp_path / "worker0.log"
        found = wait_until(lambda: re.search(r"psflow: status (http://127\.0\.0\.1:\d+/)", chief_log.read_text()),
                           "the chief printed its status URL")
        url = found.group(1)
        assert "psflow: status" not in (tmp_path / "worker1.log").read_text()  # only the chief serves it

        def training() -> dict[str, Any] | None:
            s: dict[str, Any] = json.loads(get(url + "api/status"))
            up = all(t["state"] == "up" for t in s["tasks"])
            return s if up and (s.get("global_step") or 0) > 0 else None

        snapshot = wait_until(training, "every task up and training on the chief's page")
        assert [t["task"] for t in snapshot["tasks"]] == ["/job:ps/task:0", "/job:worker/task:0", "/job:worker/task:1"]
        assert snapshot["run"]["served_by"] == "/job:worker/task:0"
        assert {t["pid"] for t in snapshot["tasks"]} == {p.pid for p in procs}
        scraped = parse_metrics(get(url + "metrics").decode())
        assert scraped["psflow_ps_pushes_total"][(("job", "ps"), ("task", "0"))] > 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)


def test_a_sync_step_names_the_worker_it_waits_for(run_factory: Callable[..., Run]) -> None:
    run = run_factory("run", "--mode", "sync", "--batch-size", "32", "--epochs", "500", "--quiet",
                      "--sync-timeout", "300", "--liveness-timeout", "300")
    url = run.url()
    wait_until(lambda: (run.status(url).get("global_step") or 0) > 0, "sync training started")
    slow = next(t for t in run.status(url)["tasks"] if t["task"] == "/job:worker/task:1")
    os.kill(slow["pid"], signal.SIGSTOP)  # a task of the launcher this test started; resumed below
    try:
        def waiting() -> dict[str, Any] | None:
            sync = run.status(url)["sync"]
            return sync if sync["waiting_for"] == ["/job:worker/task:1"] and sync["waiting_seconds"] > 1 else None

        sync = wait_until(waiting, "the sync step waiting for the stopped worker")
        assert sync["contributed"] == ["/job:worker/task:0"]
        text = subprocess.run([sys.executable, "-m", "psflow", "status", url], capture_output=True, text=True,
                              timeout=60, cwd=str(REPO)).stdout
        assert "for /job:worker/task:1" in text and "gradients from /job:worker/task:0" in text, text
        metrics = parse_metrics(get(url + "metrics").decode())
        assert metrics["psflow_sync_waiting_workers"][()] == 1
    finally:
        os.kill(slow["pid"], signal.SIGCONT)
    step = run.status(url)["global_step"]
    wait_until(lambda: run.status(url)["global_step"] > step, "sync steps go on once the worker resumes")


def test_a_sync_step_that_timed_out_shows_as_failed_not_waiting(run_factory: Callable[..., Run]) -> None:
    """--on-timeout fail: worker 1 stops, the step times out and every push is refused; the run fails. psflow status
    RUN_DIR of the failed run said "waiting 3.4 s for /job:worker/task:1"; it says the step failed, in the words of
    the refusal worker 0 met (which step, after how long, 1 of 2 gradients, missing whom)."""
    run = run_factory("run", "--mode", "sync", "--batch-size", "32", "--epochs", "500", "--quiet",
                      "--sync-timeout", "3", "--on-timeout", "fail", "--liveness-timeout", "300")
    url = run.url()
    wait_until(lambda: (run.status(url).get("global_step") or 0) > 0, "sync training started")
    slow = next(t for t in run.status(url)["tasks"] if t["task"] == "/job:worker/task:1")
    os.kill(slow["pid"], signal.SIGSTOP)  # a task of the launcher this test started; the run's failure ends it
    try:
        assert run.proc.wait(timeout=LIMIT) == 1, run.stderr()
    finally:
        try:
            if b"psflow.launch.task" in Path(f"/proc/{slow['pid']}/cmdline").read_bytes():
                os.kill(slow["pid"], signal.SIGCONT)
        except (OSError, ProcessLookupError):
            pass
    # (worker 1, normally; any worker a loaded machine kept from one step for 3 s fails it the same way)
    refusal = re.search(r"(sync step \d+ timed out after 3\.0 s with 1 of 2 gradients; missing: /job:worker/task:\d)",
                        run.stderr())
    assert refusal, run.stderr()
    sync = json.loads((run.out / "status.json").read_text())["sync"]
    assert sync["waiting_for"] == [] and sync["waiting_seconds"] is None, sync
    assert refusal.group(1) in sync["failed"].values(), sync
    text = subprocess.run([sys.executable, "-m", "psflow", "status", str(run.out)], capture_output=True, text=True,
                          timeout=60, cwd=str(REPO)).stdout
    assert f": {refusal.group(1)}; every push is refused until a restore" in text and "waiting" not in text, text


def test_off_loopback_the_page_requires_psflow_token(run_factory: Callable[..., Run], tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PSFLOW_TOKEN"}
    refused = run_factory("refused", "--status-host", "0.0.0.0", "--quiet", env=env)
    assert refused.proc.wait(timeout=LIMIT) == 1
    assert "requires the cluster token (PSFLOW_TOKEN)" in refused.stderr() and "Traceback" not in refused.stderr()

    run = run_factory("run", "--status-host", "0.0.0.0", "--batch-size", "32", "--epochs", "500", "--quiet",
                      env=dict(env, PSFLOW_TOKEN="page-token-42"))
    url = run.url().replace("0.0.0.0", "127.0.0.1")  # bound to every address; asked on loopback
    with pytest.raises(urllib.error.HTTPError) as refused_call:
        get(url + "api/status")
    assert refused_call.value.code == 401
    snapshot = wait_until(lambda: run.status(url, {"Authorization": "Bearer page-token-42"}), "the page with the token")
    assert len(snapshot["tasks"]) == 4


# ---- where the page is served (issue 30, item 2) -------------------------------------------------------
def ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_the_page_on_ipv6_loopback_answers_loopback_names_only(run_factory: Callable[..., Run]) -> None:
    """``--status-host ::1`` used to fail naming --status-port; the page now serves there, and a request whose Host
    is not a loopback name (a web page's DNS rebinding) gets 421, never the run's numbers."""
    run = run_factory("run", "--status-host", "::1", "--batch-size", "32", "--epochs", "500", "--quiet")
    url = run.url()
    assert url.startswith("http://[::1]:"), url
    assert len(wait_until(lambda: run.status(url)["tasks"], "the page on [::1]")) == 4
    with pytest.raises(urllib.error.HTTPError) as refused:
        get(url + "api/status", {"Host": "attacker.example"})
    assert refused.value.code == 421 and b"tasks" not in refused.value.read()


def test_a_status_flag_at_fault_is_named_in_one_line(tmp_path: Path) -> None:
    """The README's rows: a --status-port in use and a --status-host that is no address of this machine, each
    refused before any task starts, in one line naming its own flag."""
    import socket

    env = dict(os.environ, PSFLOW_TOKEN="page-token-42")  # off loopback the page requires one
    train = [sys.executable, "-m", "psflow", "train", "--train", str(A9A), "--num-features", "124", "--quiet"]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        in_use = run_bounded([*train, "--status-port", str(port), "--output", str(tmp_path / "a")], timeout=120)
    elsewhere = run_bounded([*train, "--status-host", "192.0.2.1", "--output", str(tmp_path / "b")], timeout=120,
                            env=env)  # 192.0.2.1: TEST-NET-1, an address no machine has
    for r, out, line in (
            (in_use, "a", f"psflow train: error: --status-port {port}: cannot serve the status page on 127.0.0.1:{port}: "
                          f"port {port} is already in use (another process listens on it)"),
            (elsewhere, "b", "psflow train: error: --status-host 192.0.2.1: cannot serve the status page on "
                             "192.0.2.1:0: Cannot assign requested address (not an address of this machine)")):
        assert r.returncode == 1 and r.stderr.strip() == line, r.stderr[-3000:]
        assert not list((tmp_path / out / "logs").glob("*.log")), "a task was started"
