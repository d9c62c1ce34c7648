// psflow's status page: polls api/status every second and draws it. No libraries, nothing from elsewhere.
"use strict";

const POLL_MS = 1000;
const $ = (id) => document.getElementById(id);

function fmt(x, digits) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  if (typeof x !== "number") return String(x);
  if (digits !== undefined) return x.toFixed(digits);
  return Math.round(x).toLocaleString("en-US");
}

function bytes(x) {
  if (x === null || x === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(x) >= 1024 && i < units.length - 1) { x /= 1024; i++; }
  return (i === 0 ? Math.round(x) : x.toFixed(1)) + " " + units[i];
}

function clock(t) {
  return t ? new Date(t * 1000).toLocaleTimeString("en-GB") : "–";
}

function duration(s) {
  if (s === null || s === undefined) return "–";
  const m = Math.floor(s / 60), sec = Math.floor(s % 60);
  return m ? `${m} min ${sec} s` : `${s.toFixed(1)} s`;
}

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

const SVG = "http://www.w3.org/2000/svg";

function svgEl(name, attrs, text) {
  const el = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

// A line chart of points [[x, y], ...] into <svg id=id> (viewBox 400x160).
function lineChart(id, points) {
  const svg = $(id);
  svg.replaceChildren();
  const W = 400, H = 160, L = 48, B = 18, T = 6, R = 6;
  svg.appendChild(svgEl("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  svg.appendChild(svgEl("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  const pts = points.filter((p) => typeof p[0] === "number" && typeof p[1] === "number");
  if (pts.length === 0) {
    svg.appendChild(svgEl("text", { x: L + 8, y: H / 2 }, "no data yet"));
    return;
  }
  let x0 = Math.min(...pts.map((p) => p[0])), x1 = Math.max(...pts.map((p) => p[0]));
  let y0 = Math.min(...pts.map((p) => p[1])), y1 = Math.max(...pts.map((p) => p[1]));
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y1 += Math.abs(y1) * 0.05 || 1; y0 -= Math.abs(y0) * 0.05 || 0; }
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - B - T);
  svg.appendChild(svgEl("polyline", { class: "line", points: pts.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ") }));
  const label = (v) => (Math.abs(v) >= 1000 ? fmt(v) : Number(v.toPrecision(3)).toString());
  svg.appendChild(svgEl("text", { x: 2, y: T + 8 }, label(y1)));
  svg.appendChild(svgEl("text", { x: 2, y: H - B }, label(y0)));
  svg.appendChild(svgEl("text", { x: L, y: H - 4 }, label(x0)));
  svg.appendChild(svgEl("text", { x: W - R - 40, y: H - 4 }, label(x1)));
}

function barChart(id, pairs) {
  const svg = $(id);
  svg.replaceChildren();
  const W = 400, H = 120, B = 16;
  const max = Math.max(1, ...pairs.map((p) => p[1]));
  const w = Math.max(4, Math.min(40, (W - 10) / Math.max(1, pairs.length) - 4));
  // Narrow bars (a long tail of buckets): a key under every n-th bar only, and a count over the tallest
  // alone, so that labels never overlap; every bar's count is in api/status.
  const every = Math.max(1, Math.ceil(22 / (w + 4)));
  pairs.forEach(([k, v], i) => {
    const h = ((H - B - 12) * v) / max, x = 5 + i * (w + 4);
    svg.appendChild(svgEl("rect", { class: "bar", x, y: H - B - h, width: w, height: h }));
    if (i % every === 0) svg.appendChild(svgEl("text", { x, y: H - 4 }, k));
    if (w >= 26 || v === max) svg.appendChild(svgEl("text", { x, y: H - B - h - 2 }, fmt(v)));
  });
}

// A ps task's generation is 0 until the chief restores the cluster, then the restore's wall-clock time
// in ms: shown as that time (restored_at), never as the raw number.
function restoredText(r) {
  if (r.restored_at) return clock(r.restored_at);
  if (r.generation === null || r.generation === undefined) return "–";
  return r.generation === 0 ? "never" : `generation ${r.generation}`;
}

function historyText(history) {
  return (history || []).map((h) => `${clock(h.time)} ${h.event}${h.detail ? " (" + h.detail + ")" : ""}`).join(" → ");
}

function renderTasks(tasks) {
  const body = $("tasks").querySelector("tbody");
  body.replaceChildren();
  for (const t of tasks) {
    const row = document.createElement("tr");
    row.dataset.task = t.task;
    row.dataset.state = t.state;
    row.dataset.restarts = t.restarts;
    cell(row, t.task);
    cell(row, t.host);
    cell(row, t.pid ?? "–");
    cell(row, t.state + (t.exit && t.state !== "up" ? ` (${t.exit})` : ""), "state");
    cell(row, t.last_heartbeat ? `${clock(t.last_heartbeat)} (${t.heartbeat_age} s ago)` : "never");
    cell(row, t.restarts);
    cell(row, restoredText(t));
    cell(row, historyText(t.history), "history");
    body.appendChild(row);
  }
}

function renderPs(ps) {
  const body = $("ps").querySelector("tbody");
  body.replaceChildren();
  for (const r of ps) {  // r.busiest: the collector's ranking by bytes moved and apply time (psflow.status.collector)
    const row = document.createElement("tr");
    row.dataset.task = r.task;
    if (r.busiest) row.className = "hot";
    const rate = r.rates || {};
    cell(row, r.task + (r.busiest ? "  (busiest)" : ""));
    cell(row, fmt(rate.pushes_per_sec));
    cell(row, fmt(rate.pulls_per_sec));
    cell(row, bytes(rate.bytes_in_per_sec));
    cell(row, bytes(rate.bytes_out_per_sec));
    cell(row, fmt(rate.apply_seconds_per_sec, 3));
    cell(row, fmt(r.pushes));
    cell(row, fmt(r.pulls));
    cell(row, bytes(r.parameter_bytes));
    cell(row, restoredText(r));
    body.appendChild(row);
  }
}

function renderSync(s) {
  const el = $("sync");
  if (s.sync) {
    const w = s.sync.waiting_for || [];
    // A failed step (timed out under --on-timeout fail) waits for nobody: its pushes are refused until a restore.
    const failedOn = Object.entries(s.sync.failed || {});
    const failed = [...new Set(failedOn.map(([, why]) => why))].map((why) =>
      `step failed on ${failedOn.filter(([, said]) => said === why).map(([task]) => task).join(", ")}: ${why}; ` +
      "every push is refused until a restore");
    el.className = "";
    const waiting = w.length
      ? [`step ${fmt((s.global_step ?? 0) + 1)} has gradients from ${s.sync.contributed.join(", ") || "nobody"}; ` +
         `waiting ${fmt(s.sync.waiting_seconds, 1)} s for ${w.join(", ")}`]
      : [];
    el.textContent = failed.length || w.length ? [...failed, ...waiting].join("; ")
      : `no step waiting; ${fmt(s.sync.steps_applied)} steps applied, ${fmt(s.sync.stale_dropped)} stale gradients dropped, ` +
        `${fmt(s.sync.live_replicas)} live replicas`;
  } else if (s.ssp) {
    el.className = "";
    el.textContent = "bounded staleness: clocks " + Object.entries(s.ssp.clocks).map(([k, v]) => `${k}=${v}`).join(", ") +
      `; ${fmt(s.ssp.waits)} waits` + (s.ssp.lost.length ? `; lost: ${s.ssp.lost.join(", ")}` : "");
  }
}

function renderFaults(s) {
  const body = $("faults").querySelector("tbody");
  body.replaceChildren();
  for (const f of s.faults || []) {
    const row = document.createElement("tr");
    cell(row, `${f.spec} (${f.signal})`);
    cell(row, `${f.task} pid ${f.pid}`);
    cell(row, fmt(f.at_step));
    cell(row, f.recovery_seconds === null || f.recovery_seconds === undefined ? "not yet" : fmt(f.recovery_seconds, 2));
    body.appendChild(row);
  }
  for (const r of s.restarts || []) {
    const row = document.createElement("tr");
    cell(row, `died: ${r.exit}`);
    cell(row, `${r.task} pid ${r.pid}`);
    cell(row, "");
    cell(row, r.restarted ? `restarted as pid ${r.new_pid ?? "(pending)"}` : r.decision);
    body.appendChild(row);
  }
  const hangs = $("hangs");
  hangs.replaceChildren();
  for (const h of s.hangs || []) {
    const li = document.createElement("li");
    li.textContent = h;
    hangs.appendChild(li);
  }
}

function renderCheckpoints(c) {
  const el = $("checkpoints");
  if (!c) return;
  el.className = "";
  el.textContent = `${fmt(c.saved)} saved, ${fmt(c.failed)} failed` +
    (c.failed_in_a_row ? ` (${c.failed_in_a_row} in a row)` : "") +
    (c.last_saved_step !== null && c.last_saved_step !== undefined ? `; newest at step ${fmt(c.last_saved_step)}: ${c.last_saved_path}` : "") +
    (c.last_saved_by_this_run === false ? " (restored at the start, saved by an earlier run)" : "");
}

// (--ps-replicas) The run's pushes acknowledged, applied and lost, then one line per shard: its primary, backups
// (how far behind), members joining (rebuilding from the primary: what is queued for them) and losses, then each
// shard not read at the run's end (shards_unread). None for an unreplicated run (its snapshot has none of them).
function replicasText(s) {
  const lines = [];
  if (s.updates_lost !== null && s.updates_lost !== undefined) {
    lines.push(`pushes acknowledged ${fmt(s.pushes_acknowledged)} | applied ${fmt(s.pushes_applied)} | ` +
      `updates lost ${fmt(s.updates_lost)}`);
  }
  for (const sh of s.shards || []) {
    const backups = (sh.backups || []).map((b) =>
      `${b.task} (${fmt(b.lag_entries)} entries, ${fmt(b.lag_seconds, 2)} s behind)`).join(", ");
    const joining = (sh.joining || []).map((j) => `, joining ${j.task} (${fmt(j.lag_entries)} entries queued)`).join("");
    lines.push(`shard ${sh.shard}: primary ${sh.primary || "none"} (epoch ${fmt(sh.epoch)}), ` +
      `${backups ? "backups " + backups : "no backup"}${joining}; ${fmt(sh.updates_lost)} updates lost`);
  }
  for (const u of s.shards_unread || []) {  // no member answered at the run's end: the totals are not known
    lines.push(`shard ${u.shard}: not read at the run's end (${u.error}): pushes acknowledged, applied and ` +
      "updates lost not known");
  }
  return lines;
}

function renderReplicas(s) {
  const lines = replicasText(s);
  $("replicas-box").hidden = lines.length === 0;
  $("replicas").replaceChildren(...lines.map((line) => {
    const div = document.createElement("div");
    div.textContent = line;
    return div;
  }));
}

function render(s) {
  const phase = $("phase");
  phase.textContent = s.run.phase;
  phase.className = "phase " + s.run.phase;
  $("run-dir").textContent = s.run.run_dir || "";
  $("updated").textContent = "updated " + clock(s.time);
  $("global-step").textContent = fmt(s.global_step);
  $("examples").textContent = fmt(s.examples);
  $("rate").textContent = fmt(s.examples_per_sec);
  $("loss").textContent = fmt(s.loss, 4);
  const lr = s.learning_rate;  // a schedule's value: 4 significant digits (a decayed rate can be tiny)
  $("learning-rate").textContent = typeof lr === "number" ? lr.toPrecision(4) : "–";
  const auc = s.eval && s.eval.auc !== undefined ? s.eval.auc : (s.scalars["eval/auc"] || []).slice(-1).map((p) => p[1])[0];
  $("auc").textContent = fmt(auc, 4);
  $("elapsed").textContent = duration(s.run.elapsed);
  renderTasks(s.tasks);
  const t = s.series.time;
  lineChart("chart-step", t.map((x, i) => [x, s.series.global_step[i]]));
  lineChart("chart-rate", t.map((x, i) => [x, s.series.examples_per_sec[i]]));
  const loss = s.scalars["train/loss_ema"] || s.scalars["train/loss"] || t.map((x, i) => [s.series.global_step[i], s.series.loss[i]]);
  lineChart("chart-loss", loss);
  lineChart("chart-auc", s.scalars["eval/auc"] || []);
  renderPs(s.ps);
  const hist = Object.entries(s.staleness_histogram || {}).map(([k, v]) => [k, v]).sort((a, b) => a[0] - b[0]);
  $("staleness-none").hidden = hist.length > 0;
  barChart("chart-staleness", hist);
  renderSync(s);
  renderFaults(s);
  renderCheckpoints(s.checkpoints);
  renderReplicas(s);
}

async function poll() {
  try {
    const reply = await fetch("api/status", { cache: "no-store", credentials: "same-origin" });
    if (!reply.ok) throw new Error(`api/status: HTTP ${reply.status}`);
    render(await reply.json());
    $("error").hidden = true;
  } catch (e) {
    $("error").textContent = `cannot reach the run (${e.message}); the numbers below are the last ones seen`;
    $("error").hidden = false;
  }
  setTimeout(poll, POLL_MS);
}

poll();
