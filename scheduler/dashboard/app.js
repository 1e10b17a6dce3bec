// wansync dashboard: one WebSocket (/ws) gives a snapshot, then updates every 0.5 s. Plain SVG, no library.
"use strict";

const NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#e15759", "#f28e2b", "#59a14f", "#b07aa1", "#edc948", "#76b7b2", "#ff9da7", "#9c755f",
  "#4e79a7", "#bab0ac"];
const SERIES_KEEP = 1800;
const TOP_LINKS = 8;
const TASKS_KEEP = 2000;  // task records the page keeps (the timeline draws the most recent that fit)
const TASK_CARDS = 24;  // tasks in flight drawn with their trees; more are listed by id
const OUTCOME_COLOR = { exact: "#59a14f", failed: "#e15759", aborted: "#bab0ac", running: "#edc948" };

const S = {
  cluster: null, links: [], plan: null, series: {}, rounds: [], timeline: [], t0: null, seq: 0,
  dirty: false, updates: 0, tasks: [], inflight: { job: null, running: [], waiting: [] },
};

function el(tag, attrs, parent, text) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}

function fmt(x, digits) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  return Number(x).toFixed(digits === undefined ? 1 : digits);
}

// --- colour ramp for throughput: idle grey, then light to dark blue ---------------------------------
const RAMP = [[198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
function rampColor(f) {
  f = Math.max(0, Math.min(1, f)) * (RAMP.length - 1);
  const i = Math.min(RAMP.length - 2, Math.floor(f)), u = f - i;
  const c = RAMP[i].map((a, k) => Math.round(a + (RAMP[i + 1][k] - a) * u));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

// --- the overlay graph ----------------------------------------------------------------------------
function nodeIds() {
  const ids = new Set();
  if (S.cluster) for (let n = 0; n < S.cluster.expected_nodes; n++) ids.add(n);
  for (const l of S.links) { ids.add(l.src); ids.add(l.dst); }
  return [...ids].sort((a, b) => a - b);
}

function layout(ids) {
  const pos = {}, cx = 320, cy = 280, r = ids.length > 12 ? 250 : 220;
  ids.forEach((n, i) => {
    const a = -Math.PI / 2 + (2 * Math.PI * i) / ids.length;
    pos[n] = [cx + r * Math.cos(a), cy + r * Math.sin(a)];
  });
  return pos;
}

function shorten(p, q, by) {
  const dx = q[0] - p[0], dy = q[1] - p[1], d = Math.hypot(dx, dy) || 1;
  return [[p[0] + dx * by / d, p[1] + dy * by / d], [q[0] - dx * by / d, q[1] - dy * by / d], dx / d, dy / d];
}

function drawGraph() {
  const svg = document.getElementById("graph");
  svg.replaceChildren();
  const defs = el("defs", {}, svg);
  PALETTE.forEach((c, i) => {
    const m = el("marker", { id: `arrow${i}`, viewBox: "0 0 10 10", refX: "9", refY: "5", markerWidth: "7",
      markerHeight: "7", orient: "auto-start-reverse" }, defs);
    el("path", { d: "M0,0 L10,5 L0,10 z", fill: c }, m);
  });
  const ids = nodeIds(), pos = layout(ids), R = 18;
  const maxMbps = Math.max(1, ...S.links.map((l) => l.throughput_mbps));  // the busiest link now is darkest
  const gLinks = el("g", { id: "links" }, svg), gLabels = el("g", { id: "labels" }, svg);
  const showLabels = document.getElementById("show-labels").checked;
  for (const l of S.links) {
    if (!(l.src in pos) || !(l.dst in pos)) continue;
    const [a, b, ux, uy] = shorten(pos[l.src], pos[l.dst], R + 2);
    const ox = -uy * 4, oy = ux * 4;  // each direction on its own side
    const mbps = l.throughput_mbps, busy = mbps > 0.01;
    const line = el("line", { class: "link", "data-src": l.src, "data-dst": l.dst, "data-mbps": fmt(mbps, 3),
      x1: a[0] + ox, y1: a[1] + oy, x2: b[0] + ox, y2: b[1] + oy,
      stroke: busy ? rampColor(mbps / maxMbps) : "#d4d7dd", "stroke-width": busy ? 2 + 5 * Math.min(1, mbps / maxMbps) : 1.5,
      "stroke-linecap": "round" }, gLinks);
    el("title", {}, line, `${l.src} → ${l.dst}: ${fmt(mbps, 2)} Mbit/s now; view ${fmt(l.rate_mbps)} Mbit/s ` +
      `(${l.measured ? l.samples + " samples" : "not measured yet"}); ${fmt(l.bytes_total / 1e6, 2)} MB sent`);
    if (showLabels && busy) {
      const t = 0.32;  // near the sender, so the two directions' labels do not collide
      el("text", { class: "link-label", "data-src": l.src, "data-dst": l.dst,
        x: a[0] + (b[0] - a[0]) * t + ox * 3, y: a[1] + (b[1] - a[1]) * t + oy * 3 }, gLabels, fmt(mbps));
    }
  }
  if (document.getElementById("show-plan").checked && S.plan) drawPlan(svg, pos, R);
  const up = new Set((S.cluster ? S.cluster.nodes : []).filter((n) => n.up).map((n) => n.node));
  const gNodes = el("g", { id: "nodes" }, svg);
  for (const n of ids) {
    const g = el("g", { class: "node" + (S.cluster && !up.has(n) ? " down" : ""), "data-node": n }, gNodes);
    el("circle", { cx: pos[n][0], cy: pos[n][1], r: R }, g);
    el("text", { x: pos[n][0], y: pos[n][1] }, g, String(n));
  }
  const lg = document.getElementById("legend");
  lg.innerHTML = `<span>idle <span class="sw" style="background:#d4d7dd"></span></span>` +
    `<span>0<span class="ramp"></span>${fmt(maxMbps, 0)} Mbit/s</span>`;
  if (S.plan) lg.innerHTML += `<span><span class="sw" style="border-top:2px dashed ${PALETTE[0]};height:0"></span>` +
    `aggregation tree (child → parent)</span><span><span class="sw" style="border-top:2px dotted ${PALETTE[0]};` +
    `height:0"></span>auxiliary route</span>`;
}

function selectedGroups() {
  const v = document.getElementById("group-select").value;
  const gs = S.plan.groups.map((g, i) => [g, i]);
  return v === "all" ? gs.slice(0, PALETTE.length) : gs.filter(([, i]) => String(i) === v);
}

function drawPlan(svg, pos, R) {
  const gPlan = el("g", { id: "plan" }, svg);
  for (const [g, i] of selectedGroups()) {
    const ci = i % PALETTE.length, color = PALETTE[ci], bend = 18 + 6 * (i % 4);
    for (const [child, parent] of Object.entries(g.parent)) {
      if (parent === null || parent === undefined || !(child in pos) || !(parent in pos)) continue;
      const [a, b, ux, uy] = shorten(pos[child], pos[parent], R + 3);
      const mx = (a[0] + b[0]) / 2 - uy * bend, my = (a[1] + b[1]) / 2 + ux * bend;
      el("path", { class: "tree-edge", "data-group": i, d: `M${a[0]},${a[1]} Q${mx},${my} ${b[0]},${b[1]}`,
        stroke: color, "marker-end": `url(#arrow${ci})` }, gPlan);
    }
    if (g.root in pos) el("circle", { cx: pos[g.root][0], cy: pos[g.root][1], r: R + 5 + 3 * (i % 3), fill: "none",
      stroke: color, "stroke-width": 2 }, gPlan);
    for (const aux of g.aux) for (const route of aux.routes) {
      const pts = route.filter((n) => n in pos).map((n) => pos[n].join(",")).join(" ");
      el("polyline", { class: "aux-route", points: pts, stroke: color }, gPlan);
    }
  }
  if (S.plan.multicast) for (const [src, rcv] of Object.entries(S.plan.multicast)) for (const d of rcv) {
    if (!(src in pos) || !(d in pos)) continue;
    const [a, b] = shorten(pos[src], pos[d], R + 3);
    el("line", { class: "tree-edge", x1: a[0], y1: a[1], x2: b[0], y2: b[1], stroke: PALETTE[src % PALETTE.length],
      "marker-end": `url(#arrow${src % PALETTE.length})` }, gPlan);
  }
}

// --- charts ---------------------------------------------------------------------------------------
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v))), m = v / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

function lineChart(svg, series, opts) {
  svg.replaceChildren();
  const W = 640, H = Number(svg.getAttribute("viewBox").split(" ")[3]), L = 48, Rm = 10, T = 10, B = 24;
  let xmax = 1, ymax = 0;
  for (const s of series) for (const [x, y] of s.points) { xmax = Math.max(xmax, x); ymax = Math.max(ymax, y); }
  const xmin = opts.xmin !== undefined ? opts.xmin : 0;
  ymax = niceMax(ymax);
  const X = (x) => L + (W - L - Rm) * (x - xmin) / Math.max(1e-9, xmax - xmin);
  const Y = (y) => H - B - (H - B - T) * y / ymax;
  const grid = el("g", { class: "grid" }, svg), axis = el("g", { class: "axis" }, svg);
  for (let k = 0; k <= 5; k++) {
    const y = ymax * k / 5;
    el("line", { x1: L, x2: W - Rm, y1: Y(y), y2: Y(y) }, grid);
    el("text", { x: L - 4, y: Y(y) + 3, "text-anchor": "end" }, axis, y >= 10 ? fmt(y, 0) : fmt(y, 2));
  }
  for (let k = 0; k <= 5; k++) {
    const x = xmin + (xmax - xmin) * k / 5;
    el("text", { x: X(x), y: H - 8, "text-anchor": "middle" }, axis, fmt(x, xmax - xmin < 10 ? 1 : 0) + " s");
  }
  el("line", { x1: L, x2: L, y1: T, y2: H - B }, axis);
  el("line", { x1: L, x2: W - Rm, y1: H - B, y2: H - B }, axis);
  for (const s of series) {
    if (s.points.length > 1 && !opts.dotsOnly) {
      el("polyline", { points: s.points.map(([x, y]) => `${X(x)},${Y(y)}`).join(" "), fill: "none",
        stroke: s.color, "stroke-width": 1.6, class: "series", "data-name": s.name }, svg);
    }
    if (opts.dots) for (const [x, y, hollow] of s.points) {
      el("circle", { cx: X(x), cy: Y(y), r: 3.2, fill: hollow ? "#fff" : s.color, stroke: s.color }, svg);
    }
  }
}

function legend(id, series) {
  document.getElementById(id).innerHTML = series.map((s) =>
    `<span><span class="sw" style="background:${s.color}"></span>${s.name}</span>`).join("");
}

function t0() {
  if (S.t0 === null) {
    const ts = [];
    for (const pts of Object.values(S.series)) if (pts.length) ts.push(pts[0][0]);
    for (const e of S.timeline) ts.push(e.t);
    for (const r of S.rounds) ts.push(r.t_start);
    if (ts.length) S.t0 = Math.min(...ts);
  }
  return S.t0 === null ? Date.now() / 1000 : S.t0;
}

function drawThroughput() {
  const base = t0();
  const recent = Object.entries(S.series).map(([k, pts]) =>
    [k, pts, Math.max(0, ...pts.slice(-60).map((p) => p[1]))]).filter(([, , m]) => m > 0);
  recent.sort((a, b) => b[2] - a[2]);
  const series = recent.slice(0, TOP_LINKS).map(([k, pts], i) => ({
    name: k.replace("-", "→"), color: PALETTE[i % PALETTE.length], points: pts.map(([t, m]) => [t - base, m]) }));
  lineChart(document.getElementById("tp-chart"), series, {});
  legend("tp-legend", series);
}

function drawRounds() {
  const base = t0(), by = {};
  for (const r of S.rounds) (by[r.scheme] = by[r.scheme] || []).push([r.t_end - base, r.round_s, r.warmup]);
  const series = Object.entries(by).map(([name, pts], i) => ({ name, color: PALETTE[i % PALETTE.length], points: pts }));
  lineChart(document.getElementById("round-chart"), series, { dots: true });
  legend("round-legend", series);
}

function drawTimeline() {
  const svg = document.getElementById("timeline");
  svg.replaceChildren();
  const base = t0(), W = 640, L = 48, Rm = 10, now = Date.now() / 1000;
  const xmax = Math.max(1, now - base, ...S.timeline.map((e) => e.t - base));
  const X = (x) => L + (W - L - Rm) * x / xmax;
  const axis = el("g", { class: "axis" }, svg);
  el("line", { x1: L, x2: W - Rm, y1: 96, y2: 96 }, axis);
  for (let k = 0; k <= 5; k++) el("text", { x: X(xmax * k / 5), y: 112, "text-anchor": "middle" }, axis,
    fmt(xmax * k / 5, xmax < 10 ? 1 : 0) + " s");
  const rows = { plan: 20, job: 44, guard: 68 };
  for (const [name, y] of Object.entries({ "plan": 20, "job": 44, "other": 68 })) {
    el("text", { x: L - 4, y: y + 3, "text-anchor": "end" }, axis, name);
  }
  for (const e of S.timeline) {
    const x = X(e.t - base), y = rows[e.kind] || 68;
    let color = "#4e79a7", label = e.kind;
    if (e.kind === "plan") label = "v" + e.version;
    else if (e.kind === "job") { color = "#59a14f"; label = e.scheme; }
    else if (e.kind === "guard") {
      const v = e.verdict || (e.valid === true ? "valid" : e.valid === false ? "invalid" : "unjudged");
      color = { valid: "#1a7f4b", invalid: "#b2182b" }[v] || "#b8860b";
      label = { valid: "ok", invalid: "INVALID" }[v] || "UNJUDGED";
    }
    else color = "#e15759";
    const g = el("g", { class: "event", "data-kind": e.kind }, svg);
    el("line", { x1: x, x2: x, y1: y - 8, y2: 96, stroke: color, "stroke-width": 1, opacity: 0.5 }, g);
    el("circle", { cx: x, cy: y, r: 4, fill: color }, g);
    el("text", { x: x + 6, y: y + 3, "font-size": 10, fill: color }, g, label);
    el("title", {}, g, `${new Date(e.t * 1000).toLocaleTimeString()} ${e.kind} ` +
      JSON.stringify(Object.fromEntries(Object.entries(e).filter(([k]) => k !== "t" && k !== "kind"))));
  }
}

// --- tasks: the ones in flight with their trees, and a timeline of recorded ones -------------------
function outcome(t) {
  if (t.aborted) return "aborted";
  return t.ok && t.digests_agree ? "exact" : "failed";
}

function miniTree(t) {
  // the task's plan over every node of the cluster: who contributes, aggregates, receives, relays
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", "0 0 640 560");
  svg.setAttribute("class", "mini");
  const ids = nodeIds(), pos = layout(ids), R = 30;
  const role = {};
  for (const n of t.relays) role[n] = "relay";
  for (const n of t.receivers) role[n] = "receiver";
  for (const n of t.aggregators) role[n] = "aggregator";
  for (const n of t.members) role[n] = "member";
  const defs = el("defs", {}, svg);
  const m = el("marker", { id: `arrow-t${t.task}`, viewBox: "0 0 10 10", refX: "9", refY: "5", markerWidth: "5",
    markerHeight: "5", orient: "auto-start-reverse" }, defs);
  el("path", { d: "M0,0 L10,5 L0,10 z", fill: "#1d2430" }, m);
  for (const [gi, g] of t.plan.groups.entries()) {
    if (gi >= 4) break;  // a few trees are readable at this size
    for (const [child, parent] of Object.entries(g.parent)) {
      if (parent === null || parent === undefined || !(child in pos) || !(parent in pos)) continue;
      const [a, b] = shorten(pos[child], pos[parent], R + 4);
      el("line", { class: "tree-edge", x1: a[0], y1: a[1], x2: b[0], y2: b[1], stroke: PALETTE[gi % PALETTE.length],
        "marker-end": `url(#arrow-t${t.task})`, "data-child": child, "data-parent": parent }, svg);
    }
    if (g.root in pos) el("circle", { cx: pos[g.root][0], cy: pos[g.root][1], r: R + 9, fill: "none",
      stroke: PALETTE[gi % PALETTE.length], "stroke-width": 3 }, svg);
  }
  for (const n of ids) {
    const g = el("g", { class: "node " + (role[n] || "idle"), "data-node": n }, svg);
    el("circle", { cx: pos[n][0], cy: pos[n][1], r: R }, g);
    el("text", { x: pos[n][0], y: pos[n][1] }, g, String(n));
    el("title", {}, g, `node ${n}: ${role[n] || "no part"}` + (t.reported.includes(n) ? " (done)" : ""));
  }
  return svg;
}

function drawInflight() {
  const f = S.inflight || { running: [], waiting: [] };
  const box = document.getElementById("inflight");
  box.replaceChildren();
  const now = Date.now() / 1000;
  for (const t of f.running.slice(0, TASK_CARDS)) {
    const card = document.createElement("div");
    card.className = "task-card";
    card.dataset.task = t.task;
    const meta = document.createElement("div");
    meta.className = "meta";
    meta.textContent = `task ${t.task}` + (t.attempt ? ` (attempt ${t.attempt + 1})` : "") +
      ` · ${t.scheme} v${t.version} · ${fmt(Math.max(0, now - t.started_t), 1)} s · ` +
      `${t.members.length} member${t.members.length === 1 ? "" : "s"}` +
      (t.aggregators.length ? `, aggregators ${t.aggregators.join(" ")}` : "");
    card.appendChild(meta);
    card.appendChild(miniTree(t));
    box.appendChild(card);
  }
  const more = f.running.length - TASK_CARDS;
  if (more > 0) {
    const p = document.createElement("div");
    p.textContent = `+${more} more: ` + f.running.slice(TASK_CARDS).map((t) => t.task).join(", ");
    box.appendChild(p);
  }
  document.getElementById("waiting").innerHTML = f.waiting.slice(0, 20).map((t) =>
    `<li data-task="${t.task}">task ${t.task} waits` + (t.blocked ? `: ${t.blocked}` : t.at_barrier.length ?
      ` at its barrier (${t.at_barrier.length} ready)` : "") + "</li>").join("");
  document.getElementById("tasks-label").textContent = f.job === null ? "no task running" :
    `job ${f.job} (${f.mode}): ${f.running.length} running, ${f.waiting.length} waiting`;
  document.getElementById("tasks-legend").innerHTML = [["member", "#4e79a7"], ["aggregator (not a member)", "#f28e2b"]]
    .map(([n, c]) => `<span><span class="sw" style="background:${c}"></span>${n}</span>`).join("") +
    `<span><span class="sw" style="border:2px solid #1a7f4b"></span>receiver only</span>` +
    `<span><span class="sw" style="border:2px dashed #999"></span>relay</span><span>arrows: child → parent</span>`;
}

function drawTaskChart() {
  const svg = document.getElementById("task-chart");
  svg.replaceChildren();
  const W = 1280, H = 200, L = 48, Rm = 10, T = 18, B = 22, now = Date.now() / 1000;
  const bars = S.tasks.map((t) => ({ t, s: t.t_start, e: Math.max(t.t_end, t.t_start), kind: outcome(t) }));
  for (const t of (S.inflight || { running: [] }).running) bars.push({ t, s: t.started_t, e: now, kind: "running" });
  if (!bars.length) return;
  const tmax = Math.max(...bars.map((b) => b.e)), span = Math.max(10, Math.min(120, tmax - Math.min(...bars.map((b) => b.s))));
  const tmin = tmax - span, base = t0();
  const shown = bars.filter((b) => b.e >= tmin).sort((a, b) => a.s - b.s);
  const lanes = [];  // greedy interval packing: overlapping tasks stack, so the height is the concurrency
  for (const b of shown) {
    let i = lanes.findIndex((end) => end <= b.s);
    if (i < 0) { i = lanes.length; lanes.push(0); }
    lanes[i] = b.e;
    b.lane = i;
  }
  const X = (x) => L + (W - L - Rm) * (x - tmin) / span;
  const lh = Math.min(16, (H - T - B) / Math.max(1, lanes.length));
  const axis = el("g", { class: "axis" }, svg);
  el("line", { x1: L, x2: W - Rm, y1: H - B, y2: H - B }, axis);
  for (let k = 0; k <= 6; k++) el("text", { x: X(tmin + span * k / 6), y: H - 6, "text-anchor": "middle" }, axis,
    fmt(tmin + span * k / 6 - base, 0) + " s");
  el("text", { x: L, y: 11, "text-anchor": "start" }, axis, `last ${fmt(span, 0)} s: up to ${lanes.length} at once`);
  for (const b of shown) {
    const x = X(Math.max(b.s, tmin)), w = Math.max(2, X(b.e) - x);
    const r = el("rect", { class: "task-bar", "data-task": b.t.task, "data-outcome": b.kind, x, y: T + b.lane * lh,
      width: w, height: Math.max(1, lh - 1), fill: OUTCOME_COLOR[b.kind] }, svg);
    el("title", {}, r, `job ${b.t.job} task ${b.t.task} (${b.kind}): members ${b.t.members.join(" ")}` +
      (b.t.aggregators.length ? `; aggregators ${b.t.aggregators.join(" ")}` : "") + `; ${fmt(b.e - b.s, 3)} s`);
  }
}

function drawTable() {
  const tb = document.querySelector("#links-table tbody");
  tb.innerHTML = S.links.map((l) => `<tr data-link="${l.src}-${l.dst}"><td>${l.src} → ${l.dst}</td>` +
    `<td class="tp">${fmt(l.throughput_mbps, 2)}</td><td>${fmt(l.rate_mbps)}</td><td>${l.how || (l.measured ? "passive" : "nominal")}</td>` +
    `<td>${l.age_s == null ? "–" : fmt(l.age_s, 1)}</td><td>${l.spread == null ? "–" : fmt(100 * l.spread, 1)}</td>` +
    `<td>${fmt(l.bytes_total / 1e6, 2)}</td></tr>`).join("");
}

function drawHeader() {
  const c = S.cluster;
  if (!c) return;
  document.getElementById("cluster").textContent = "cluster " + c.cluster;
  const nodes = document.getElementById("nodes");
  nodes.textContent = `nodes ${c.up}/${c.expected_nodes} up`;
  nodes.className = "pill " + (c.up === c.expected_nodes ? "good" : "bad");
  const j = c.job;
  document.getElementById("job").textContent = !j ? "no job yet" : j.mode === "tasks" ?
    `job ${j.job}: ${j.scheme} tasks, ${j.done} done, ${c.tasks_in_flight} in flight` :
    `job ${j.job}: ${j.scheme} ${j.done}/${j.rounds} rounds`;
  document.getElementById("version").textContent = "plan v" + c.plan_version;
  const g = document.getElementById("guard");
  const v = c.guard_verdict || (c.guard_valid === true ? "valid" : c.guard_valid === false ? "invalid" : null);
  g.textContent = { valid: "fidelity ok", invalid: "fidelity INVALID", unjudged: "fidelity UNJUDGED" }[v] || "fidelity –";
  g.className = "pill " + ({ valid: "good", invalid: "bad", unjudged: "warn" }[v] || "");
  g.title = Object.entries(c.guard || {}).map(([s, x]) => `${s}: ${x.verdict}` +
    (x.reasons && x.reasons.length ? ` (${x.reasons.join("; ")})` : "")).join("\n");
  const p = S.plan;
  document.getElementById("plan-label").textContent = p ?
    `plan v${p.version} (${p.scheme}), ${p.groups_total} tree${p.groups_total === 1 ? "" : "s"}, ${p.chunks} chunks` +
    (j && j.mode === "tasks" ? " — the job's plan; each task runs a plan of its own (Tasks in flight)" : "") :
    "no plan yet";
  const sel = document.getElementById("group-select");
  const want = p ? p.groups.length : 0;
  if (sel.options.length !== want + 1) {
    const v = sel.value;
    sel.replaceChildren(new Option("all", "all"));
    if (p) p.groups.forEach((g, i) => sel.add(new Option(`#${i} root ${g.root} (${g.chunks} chunks)`, String(i))));
    sel.value = [...sel.options].some((o) => o.value === v) ? v : "all";
  }
}

function render() {
  S.dirty = false;
  drawHeader();
  drawGraph();
  drawThroughput();
  drawRounds();
  drawTimeline();
  drawInflight();
  drawTaskChart();
  drawTable();
}

function schedule() {
  if (!S.dirty) { S.dirty = true; requestAnimationFrame(render); }
}

// --- data ----------------------------------------------------------------------------------------
function applySnapshot(m) {
  S.cluster = m.cluster; S.links = m.view.links; S.plan = m.plan; S.rounds = m.rounds; S.timeline = m.timeline;
  S.tasks = m.tasks || []; S.inflight = m.in_flight || S.inflight;
  S.series = {};
  for (const [k, pts] of Object.entries(m.series)) S.series[k] = pts;
  S.seq = m.seq;
}

function applyUpdate(m) {
  for (const { seq, kind, item } of m.items) {
    if (seq <= S.seq) continue;
    if (kind === "point") {
      const k = `${item.src}-${item.dst}`, pts = (S.series[k] = S.series[k] || []);
      pts.push([item.t, item.mbps]);
      if (pts.length > SERIES_KEEP) pts.shift();
    } else if (kind === "round") S.rounds.push(item);
    else if (kind === "task") {
      S.tasks.push(item);
      if (S.tasks.length > TASKS_KEEP) S.tasks.shift();
    }
    else if (kind === "timeline") S.timeline.push(item);
  }
  S.seq = Math.max(S.seq, m.seq);
  S.cluster = m.cluster; S.links = m.links;
  if (m.plan !== undefined) S.plan = m.plan;
  if (m.in_flight !== undefined) S.inflight = m.in_flight;
}

function connect() {
  const conn = document.getElementById("conn");
  const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`);
  ws.onmessage = (ev) => {
    const m = JSON.parse(ev.data);
    if (m.type === "snapshot") applySnapshot(m); else applyUpdate(m);
    S.updates++;
    document.body.dataset.updates = S.updates;
    conn.textContent = "live"; conn.className = "pill conn-live";
    schedule();
  };
  ws.onclose = () => {
    conn.textContent = "disconnected (retrying)"; conn.className = "pill conn-lost";
    setTimeout(connect, 2000);
  };
}

for (const id of ["group-select", "show-plan", "show-labels"]) document.getElementById(id).addEventListener("change", schedule);
connect();
