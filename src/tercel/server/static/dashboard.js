// tercel's dashboard: polls the admin port's dashboard.json and history.json every second and
// draws them with uPlot. Same-origin requests only; no build step, no external resources.
"use strict";

const REFRESH_MS = 1000;
const LIMIT = 500; // rows asked for; the search box narrows them on the server
const $ = (id) => document.getElementById(id);

const state = {
  selected: null,
  picked: false, // true once the operator clicked a row: the charts then stay on that queue
  search: "",
  busy: false,
  rows: new Map(),
  charts: {},
  token: sessionStorage.getItem("tercel-admin-token") || "",
};

// ---- formatting ------------------------------------------------------------------------

function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n, i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return i === 0 ? `${n} B` : `${v.toPrecision(3)} ${units[i]}`;
}

function fmtMs(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms < 1000) return `${ms}ms`;
  const s = ms / 1000;
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60]]) {
    if (s >= size) return `${(s / size).toFixed(1)}${unit}`;
  }
  return `${s.toFixed(1)}s`;
}

function fmtUs(us) {
  if (us === null || us === undefined) return "–";
  return us < 1000 ? `${us}µs` : `${(us / 1000).toFixed(1)}ms`;
}

const fmtNum = (n) => (n === null || n === undefined ? "–" : n.toLocaleString("en-US"));
const fmtRate = (r) => (r === null || r === undefined ? "–" : r >= 100 ? r.toFixed(0) : r.toFixed(1));

// ---- charts ----------------------------------------------------------------------------

function makeChart(el, series) {
  const opts = {
    width: Math.max(300, el.clientWidth),
    height: 190,
    scales: { x: { time: true } },
    legend: { live: true },
    series: [{}, ...series.map(([label, stroke]) => ({ label, stroke, width: 1.5, spanGaps: false }))],
    axes: [{}, { size: 60 }],
  };
  const empty = [[], ...series.map(() => [])];
  return new uPlot(opts, empty, el);
}

function chartData(h, keys) {
  return [h.t, ...keys.map((k) => h[k])];
}

function setupCharts() {
  state.charts.serverDepth = makeChart($("chart-server-depth"), [["items", "#2563eb"]]);
  state.charts.serverRate = makeChart($("chart-server-rate"), [["in/s", "#16a34a"], ["out/s", "#dc2626"]]);
  state.charts.queueDepth = makeChart($("chart-queue-depth"), [["items", "#2563eb"]]);
  state.charts.queueRate = makeChart($("chart-queue-rate"), [["in/s", "#16a34a"], ["out/s", "#dc2626"]]);
  window.addEventListener("resize", () => {
    for (const [key, chart] of Object.entries(state.charts)) {
      const el = $(`chart-${key.replace(/[A-Z]/g, (c) => "-" + c.toLowerCase())}`);
      chart.setSize({ width: Math.max(300, el.clientWidth), height: 190 });
    }
  });
}

// ---- requests --------------------------------------------------------------------------

function headers() {
  return state.token ? { Authorization: `Bearer ${state.token}` } : {};
}

async function getJSON(url) {
  const res = await fetch(url, { headers: headers(), cache: "no-store" });
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(body.error || `${res.status} ${res.statusText}`);
  return body;
}

async function post(url) {
  const res = await fetch(url, { method: "POST", headers: headers() });
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(body.error || `${res.status} ${res.statusText}`);
  return body;
}

// Two sources of errors: the poll ("poll") and the operator's actions ("action"). A poll that
// succeeds clears only a poll error: a refused flush stays on screen until the next action.
function showError(err, source = "poll") {
  const el = $("error");
  if (err) {
    el.textContent = String(err.message || err);
    el.dataset.source = source;
    el.hidden = false;
  } else if (el.dataset.source === source) {
    el.hidden = true;
  }
}

// ---- rendering -------------------------------------------------------------------------

function renderServer(s) {
  $("version").textContent = `v${s.version}`;
  const badge = $("status");
  badge.textContent = s.status;
  badge.className = `badge ${s.status}`;
  $("s-uptime").textContent = fmtMs(s.uptime_ms);
  $("s-connections").textContent = fmtNum(s.connections);
  const auth = s.auth || {};
  $("c-auth").hidden = !auth.users;
  if (auth.users) {
    $("s-auth").textContent = `${fmtNum(auth.login_failures)} / ${fmtNum(auth.permission_denied)}`;
  }
  $("s-queues").textContent = fmtNum(s.queues);
  $("s-items").textContent = fmtNum(s.items);
  $("s-bytes").textContent = fmtBytes(s.bytes);
  $("s-journal").textContent = fmtBytes(s.journal_bytes);
  $("s-fsync").textContent = s.fsyncs ? `${fmtUs(s.fsync_p50_us)} / ${fmtUs(s.fsync_p99_us)}` : "none yet";
  $("s-in").textContent = fmtRate(s.in_per_s);
  $("s-out").textContent = fmtRate(s.out_per_s);
  $("live").textContent = `updated ${new Date().toLocaleTimeString()}`;
}

const COLUMNS = [
  ["items", fmtNum], ["bytes", fmtBytes], ["mem_bytes", fmtBytes], ["head_age_ms", fmtMs],
  ["open_reads", fmtNum], ["open_leases", fmtNum],
  ["keyed_leases", fmtNum], ["keyed_items", fmtNum],
  ["keyed_oldest_age_ms", (ms) => (ms ? fmtMs(ms) : "–")],
  ["waiters", fmtNum],
  ["in_per_s", fmtRate], ["out_per_s", fmtRate],
];

function newRow(name) {
  const tr = document.createElement("tr");
  tr.dataset.queue = name;
  const td = document.createElement("td");
  td.className = "name";
  td.textContent = name;
  tr.appendChild(td);
  for (const [key] of COLUMNS) {
    const cell = document.createElement("td");
    cell.dataset.key = key;
    tr.appendChild(cell);
  }
  const actions = document.createElement("td");
  actions.className = "actions";
  for (const [verb, label, cls] of [["flush", "Flush", ""], ["delete", "Delete", "danger"]]) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = label;
    b.className = cls;
    b.dataset.action = verb;
    actions.appendChild(b);
  }
  tr.appendChild(actions);
  return tr;
}

function renderQueues(doc) {
  const body = $("rows");
  const keep = new Set();
  doc.queues.forEach((q, i) => {
    keep.add(q.name);
    let tr = state.rows.get(q.name);
    if (!tr) {
      tr = newRow(q.name);
      state.rows.set(q.name, tr);
    }
    for (const cell of tr.querySelectorAll("td[data-key]")) {
      const fmt = COLUMNS.find(([k]) => k === cell.dataset.key)[1];
      cell.textContent = fmt(q[cell.dataset.key]);
    }
    tr.classList.toggle("selected", q.name === state.selected);
    if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null);
  });
  for (const [name, tr] of state.rows) {
    if (!keep.has(name)) {
      tr.remove();
      state.rows.delete(name);
    }
  }
  const more = doc.matched > doc.queues.length ? ` (first ${doc.queues.length})` : "";
  $("shown").textContent = `${doc.matched} of ${doc.server.queues} queues${more}`;
  if (!state.picked) {
    const top = largest(doc.queues);
    if (top !== state.selected) select(top, false);
  }
}

// The queue the charts show until the operator clicks one: the one with the most items, then
// the busiest (items in + out per second), then the first by name; null without queues.
function largest(queues) {
  let best = null;
  const busy = (q) => (q.in_per_s || 0) + (q.out_per_s || 0);
  for (const q of queues) {
    if (best === null || q.items > best.items || (q.items === best.items && busy(q) > busy(best))) best = q;
  }
  return best === null ? null : best.name;
}

function select(name, picked = true) {
  state.selected = name;
  state.picked = picked && name !== null;
  for (const [n, tr] of state.rows) tr.classList.toggle("selected", n === name);
  $("queue-charts").hidden = name === null;
  const why = state.picked ? "" : " (the largest queue; click a row to choose)";
  $("queue-depth-title").textContent = `${name}: items waiting (15 min)${why}`;
  $("queue-rate-title").textContent = `${name}: items in and out per second`;
}

async function refresh() {
  if (state.busy) return;
  state.busy = true;
  try {
    const q = new URLSearchParams({ search: state.search, limit: String(LIMIT) });
    const doc = await getJSON(`dashboard.json?${q}`);
    renderServer(doc.server);
    renderQueues(doc);
    const server = await getJSON("history.json");
    state.charts.serverDepth.setData(chartData(server, ["items"]));
    state.charts.serverRate.setData(chartData(server, ["in", "out"]));
    if (state.selected !== null) {
      // a queue created since the last sample, deleted, or beyond the queues kept: no samples
      const h = await getJSON(`history.json?${new URLSearchParams({ queue: state.selected })}`);
      state.charts.queueDepth.setData(chartData(h, ["items"]));
      state.charts.queueRate.setData(chartData(h, ["in", "out"]));
    }
    showError(null);
  } catch (err) {
    showError(err);
  } finally {
    state.busy = false;
  }
}

// ---- actions ---------------------------------------------------------------------------

const CONFIRM = {
  flush: (q) => `Flush queue "${q}"?\n\nEvery item that is not reserved is dropped. This cannot be undone.`,
  delete: (q) => `Delete queue "${q}"?\n\nIts items, open reads and journal files are erased. This cannot be undone.`,
};

async function act(verb, queue) {
  if (!window.confirm(CONFIRM[verb](queue))) return;
  try {
    await post(`queues/${encodeURIComponent(queue)}/${verb}`);
    showError(null, "action");
    if (verb === "delete" && state.selected === queue) select(null);
    await refresh();
  } catch (err) {
    showError(err, "action");
  }
}

function wire() {
  $("rows").addEventListener("click", (ev) => {
    const tr = ev.target.closest("tr");
    if (!tr) return;
    const button = ev.target.closest("button[data-action]");
    if (button) act(button.dataset.action, tr.dataset.queue);
    else select(tr.dataset.queue);
  });
  let timer = null;
  $("search").addEventListener("input", (ev) => {
    clearTimeout(timer);
    timer = setTimeout(() => { state.search = ev.target.value.trim(); refresh(); }, 200);
  });
  $("status-set").addEventListener("click", async () => {
    const s = $("status-select").value;
    if (!window.confirm(`Set the server status to ${s}?`)) return;
    try {
      await post(`status/${s}`);
      showError(null, "action");
      await refresh();
    } catch (err) {
      showError(err, "action");
    }
  });
  const token = $("token");
  token.value = state.token;
  token.addEventListener("change", () => {
    state.token = token.value;
    sessionStorage.setItem("tercel-admin-token", state.token);
    refresh();
  });
}

setupCharts();
wire();
refresh();
setInterval(refresh, REFRESH_MS);
window.tercelDashboard = state; // for the browser test and the curious
