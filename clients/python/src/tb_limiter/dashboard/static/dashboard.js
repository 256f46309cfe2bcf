// The dashboard page: polls /api/snapshot and redraws. Charts are Plotly.js
// (Plotly.react redraws in place); tables are built with DOM calls and
// textContent only, since key names come from the application.
"use strict";

const COLORS = { allowed: "#2a9d5b", denied: "#d1495b", reservations: "#e0a526", blocked: "#5b6cd1" };
const state = { updates: 0, snapshot: null, error: null };
window.tbDashboard = state;

function fmt(x, digits) {
  if (x === null || x === undefined || Number.isNaN(x)) return "—";
  return x.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: 0 });
}

function ms(x) {
  if (x === null || x === undefined) return "—";
  return x >= 1000 ? fmt(x / 1000, 2) + " s" : fmt(x, 1) + " ms";
}

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function last(arr) {
  for (let i = arr.length - 1; i >= 0; i--) if (arr[i] !== null) return arr[i];
  return null;
}

const layoutBase = {
  margin: { l: 48, r: 12, t: 8, b: 32 },
  legend: { orientation: "h", y: 1.12, x: 0 },
  xaxis: { type: "date" },
  paper_bgcolor: "#ffffff",
  plot_bgcolor: "#ffffff",
};
const plotConfig = { displayModeBar: false, responsive: true };

function drawCharts(s) {
  const x = s.series.t.map((t) => new Date(t * 1000));
  const line = (name, key, color, extra) =>
    Object.assign({ x, y: s.series[key], name, type: "scatter", mode: "lines", line: { color, width: 2 } }, extra || {});
  Plotly.react(
    "chart-rates",
    [
      line("allowed", "allowed", COLORS.allowed),
      line("denied", "denied", COLORS.denied),
      line("reserved", "reservations", COLORS.reservations),
    ],
    Object.assign({}, layoutBase, { yaxis: { title: { text: "requests / s" }, rangemode: "tozero" } }),
    plotConfig,
  );
  Plotly.react(
    "chart-waits",
    [
      line("p50", "wait_p50_ms", "#7aa6d8"),
      line("p90", "wait_p90_ms", "#3d6fb5"),
      line("p99", "wait_p99_ms", "#1c3d73"),
    ],
    Object.assign({}, layoutBase, { yaxis: { title: { text: "ms" }, rangemode: "tozero" } }),
    plotConfig,
  );
}

function drawTiles(s) {
  const get = (k) => last(s.series[k]);
  document.getElementById("tile-allowed").textContent = fmt(get("allowed"), 1);
  document.getElementById("tile-denied").textContent = fmt(get("denied"), 1);
  document.getElementById("tile-reservations").textContent = fmt(get("reservations"), 1);
  document.getElementById("tile-blocked").textContent = fmt(get("blocked_now"), 0);
  document.getElementById("tile-p99").textContent = s.waits.reported ? ms(s.waits.all.p99) : "—";
  document.getElementById("tile-p99-label").textContent = "p99 wait, last " + fmt(s.window_s, 0) + " s";
  document.getElementById("wait-window").textContent = "p50 / p90 / p99 over the last " + fmt(s.window_s, 0) + " s";
  const w = s.waits;
  document.getElementById("wait-summary").textContent = !w.reported
    ? "This server does not report a wait histogram in INFO tb."
    : fmt(w.all.count, 0) + " granted in the last " + fmt(s.window_s, 0) + " s; " + fmt(w.reserved.count, 0) +
      " of them waited (p50 " + ms(w.reserved.p50) + ", p90 " + ms(w.reserved.p90) + ", p99 " + ms(w.reserved.p99) + ").";
}

function fillCell(bucket) {
  const td = el("td", { class: "bucket" });
  if (bucket === null || bucket === undefined) {
    td.textContent = "full (no key)";
    td.dataset.fill = "1";
    return td;
  }
  if (bucket.error) {
    td.textContent = "unreadable";
    td.title = bucket.error;
    return td;
  }
  const f = bucket.fill;
  const bar = el("span", { class: "fill" + (f < 0.1 ? " low" : f < 0.5 ? " mid" : "") });
  const inner = el("span");
  inner.style.width = Math.round(100 * f) + "%";
  bar.appendChild(inner);
  td.appendChild(bar);
  td.appendChild(
    document.createTextNode(fmt(bucket.tokens, 2) + " / " + fmt(bucket.capacity, 0) + (bucket.tokens < 0 ? " (in debt)" : "")),
  );
  td.dataset.fill = String(f);
  td.title = "rate " + fmt(bucket.rate, 3) + "/s, full again in " + ms(bucket.reset_after_ms);
  if (bucket.waiting > 0) td.appendChild(flowsList(bucket));
  return td;
}

// The calls waiting in the bucket's queue, per flow (name, weight, calls),
// in the order the flows are served next.
function flowsList(bucket) {
  const div = el("div", { class: "flows", "data-waiting": String(bucket.waiting) });
  div.appendChild(document.createTextNode(fmt(bucket.waiting, 0) + " waiting: "));
  (bucket.flows || []).forEach((fl, i) => {
    if (i > 0) div.appendChild(document.createTextNode(", "));
    const name = fl.name === "" ? "(no flow)" : fl.name;
    div.appendChild(
      el("span", { class: "flow", "data-name": fl.name, "data-weight": String(fl.weight), "data-waiting": String(fl.waiting) },
        name + " (weight " + fmt(fl.weight, 0) + "): " + fmt(fl.waiting, 0)),
    );
  });
  return div;
}

function drawTop(id, top, format) {
  const tbody = document.querySelector("#" + id + " tbody");
  const note = document.getElementById(id + "-note");
  tbody.replaceChildren();
  if (!top) {
    note.textContent = "TB.TOP could not be read.";
    return;
  }
  if (top.keys.length === 0) {
    const tr = el("tr");
    tr.appendChild(el("td", { colspan: "6", class: "empty" }, "nothing recently"));
    tbody.appendChild(tr);
  }
  top.keys.forEach((k, i) => {
    // A key whose guaranteed part is within the bound may be noise: any key
    // not listed could have as much.
    const tr = el("tr", k.at_least <= top.error_bound ? { class: "uncertain" } : {});
    tr.appendChild(el("td", {}, String(i + 1)));
    tr.appendChild(el("td", { class: "key", title: k.key }, k.key));
    tr.appendChild(el("td", { class: "num count" }, format(k.count)));
    tr.appendChild(el("td", { class: "num at-least" }, format(k.at_least)));
    tr.appendChild(fillCell(k.bucket));
    tr.appendChild(el("td", { class: "node" }, k.node));
    tbody.appendChild(tr);
  });
  note.textContent =
    (top.enabled ? "" : "tb.top-keys is off: not updated. ") +
    "Each count is at most " + format(top.error_bound) + " too high (unlisted keys have at most that); " +
    "\"at least\" is guaranteed; grey rows may be noise. Sketches: " + fmt(top.memory_bytes, 0) + " bytes.";
}

function drawNodes(s) {
  const tbody = document.querySelector("#nodes tbody");
  tbody.replaceChildren();
  for (const n of s.nodes) {
    const tr = el("tr", { "data-node": n.address });
    const set = n.settings || {};
    const yesNo = (v) => (v === undefined ? "—" : v === "1" || v === "yes" ? "yes" : v === "0" || v === "no" ? "no" : v);
    tr.appendChild(el("td", {}, n.address));
    tr.appendChild(el("td", {}, n.role));
    tr.appendChild(el("td", { class: "expire_idle" }, yesNo(set.expire_idle)));
    tr.appendChild(el("td", { class: "num max_wait_ms" }, set.max_wait_ms === undefined ? "—" : set.max_wait_ms));
    tr.appendChild(el("td", { class: "num max_blocked" }, set.max_blocked === undefined ? "—" : set.max_blocked));
    tr.appendChild(el("td", { class: "top_keys" }, yesNo(set.top_keys)));
    tr.appendChild(el("td", { class: "num" }, fmt((n.gauges || {}).blocked_now, 0)));
    const q = n.gauges || {};
    tr.appendChild(
      el("td", { class: "num waiting" }, q.waiting_calls === undefined ? "—" : fmt(q.waiting_calls, 0) + " / " + fmt(q.waiting_flows, 0)),
    );
    const ev = (n.gauges || {}).eviction_policy_can_evict_buckets;
    tr.appendChild(el("td", ev === 1 ? { class: "bad" } : {}, ev === undefined ? "—" : ev === 1 ? "YES" : "no"));
    tr.appendChild(el("td", n.error ? { class: "bad" } : {}, n.error ? n.error : "ok"));
    tbody.appendChild(tr);
  }
}

function drawStatus(s) {
  const st = document.getElementById("status");
  const when = new Date(s.time * 1000).toLocaleTimeString();
  const errs = s.errors.length ? " · " + s.errors.join("; ") : "";
  st.textContent = s.source + " · " + s.nodes.length + " node" + (s.nodes.length === 1 ? "" : "s") + " · read at " + when + errs;
  st.className = "status" + (s.errors.length ? " error" : "");
}

async function update() {
  try {
    const r = await fetch("/api/snapshot", { cache: "no-store" });
    const s = await r.json();
    if (s.ready) {
      drawCharts(s);
      drawTiles(s);
      drawTop("top-denied", s.top_denied, (x) => fmt(x, 1));
      drawTop("top-waits", s.top_waits, ms);
      drawNodes(s);
      drawStatus(s);
      state.snapshot = s;
      state.updates += 1;
      document.body.dataset.updates = String(state.updates);
    }
    if (s.fatal) {
      const st = document.getElementById("status");
      st.textContent = "reading failed: " + s.fatal;
      st.className = "status error";
    }
    state.error = null;
    setTimeout(update, 1000 * ((s && s.interval_s) || 1));
  } catch (e) {
    state.error = String(e);
    const st = document.getElementById("status");
    st.textContent = "dashboard unreachable: " + e;
    st.className = "status error";
    setTimeout(update, 2000);
  }
}

update();
