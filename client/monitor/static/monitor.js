// hetswarm web monitor: polls /api/v1/state and redraws the page. No framework, no build step, nothing fetched
// from elsewhere. Every string that comes from a peer's record goes in through textContent, never as HTML.
"use strict";

const API = "/api/v1/state";
const POLL_MS = 2000;
const FETCH_TIMEOUT_MS = 8000;
const SVG_NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#2b6cb0", "#dd6b20", "#2f855a", "#c53030", "#6b46c1", "#b7791f", "#0987a0", "#d53f8c",
                 "#4a5568", "#38a169", "#805ad5", "#e53e3e"];
const METRICS = {
  latency_ms: {unit: "ms", lowIsGood: true, label: "latency"},
  bandwidth_mbps: {unit: "Mbit/s", lowIsGood: false, label: "bandwidth"},
};
let metric = "latency_ms";
let lastState = null;

// --- small DOM helpers --------------------------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== null && value !== undefined && value !== false) node.setAttribute(key, value);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== null && value !== undefined) node.setAttribute(key, value);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

function fmt(value, digits = 2) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "?";
  if (Math.abs(value) >= 100) return value.toFixed(0);
  return value.toFixed(digits);
}

function peerLabel(peer) {
  return (peer && (peer.name || peer.short_id || (peer.peer_id || "").slice(-6))) || "?";
}

// --- polling ------------------------------------------------------------------------------------------------------

async function poll() {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), FETCH_TIMEOUT_MS);
  let state = null;
  try {
    const response = await fetch(API, {cache: "no-store", signal: abort.signal});
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    state = await response.json();
  } catch (error) {
    setStatus("error", `cannot reach the monitor (${error.message}); showing the last state`);
  } finally {
    clearTimeout(timer);
    setTimeout(poll, POLL_MS);  // one request at a time: the next is asked for once this one is answered
  }
  if (state === null) return;
  lastState = state;
  try {
    render(state);
  } catch (error) {  // a state this page cannot draw: say so, and draw the next one
    console.error(error);
    setStatus("error", `cannot draw this state (${error.message})`);
  }
}

function setStatus(kind, text) {
  const status = document.getElementById("status");
  status.dataset.status = kind;
  status.textContent = text;
}

function render(state) {
  document.getElementById("swarm").textContent = `swarm ${state.swarm}`;
  const peers = state.peers;
  const colors = new Map(peers.map((p, i) => [p.peer_id, PALETTE[i % PALETTE.length]]));
  const names = new Map(peers.map((p) => [p.peer_id, peerLabel(p)]));
  renderStatus(state);
  renderPeers(state, colors);
  renderHeatmap(state);
  renderPlan(state);
  renderLoss(state, colors, names);
  renderStepTime(state, colors, names);
  document.body.dataset.reads = state.monitor.reads;
}

function renderStatus(state) {
  const m = state.monitor;
  if (m.read_at === null) {
    setStatus(m.error ? "error" : "waiting", m.error || "waiting for the first read of the swarm…");
    return;
  }
  const age = `read ${fmt(m.age_s, 1)} s ago, every ${fmt(m.refresh_s, 1)} s`;
  if (m.error) setStatus("stale", `${m.error}: showing the state ${age}`);
  else setStatus("ok", age);
}

// --- peers --------------------------------------------------------------------------------------------------------

function renderPeers(state, colors) {
  const counts = state.counts;
  const byState = Object.entries(counts.by_state).map(([s, n]) => `${n} ${s}`).join(", ");
  document.getElementById("peer-counts").textContent = `${counts.peers} (${byState || "none yet"})`;
  const judged = new Map([...(state.flagged || []).map((r) => [r.peer_id, `flagged: ${r.reason}`]),
                           ...(state.refused || []).map((r) => [r.peer_id, `refused: ${r.reason}`])]);
  const rows = state.peers.map((p) => {
    const role = judged.has(p.peer_id) ? el("span", {class: "refused"}, judged.get(p.peer_id)) :
      p.assignment_version === null ? "" :
      `v${p.assignment_version}: ` + (p.role ? `stage ${p.role.stage} · pipeline ${p.role.replica}` : "standby");
    const heard = el("td", {class: "num" + (p.last_heard_s > 30 ? " late" : "")}, `${fmt(p.last_heard_s, 0)} s ago`);
    return el("tr", {"data-peer-id": p.peer_id},
      el("td", {}, el("span", {class: "swatch", "data-color": colors.get(p.peer_id)}),
         el("span", {class: "peer-name"}, peerLabel(p)), el("span", {class: "peer-id"}, p.short_id)),
      el("td", {}, p.site || ""),
      el("td", {}, `${p.device_name} (${p.device}, ${p.dtype})`),
      el("td", {class: "num"}, fmt(p.tflops)),
      el("td", {class: "num"}, fmt(p.memory_gib, 1)),
      el("td", {}, el("span", {class: `state state-${p.state}`}, p.state)),
      el("td", {}, role),
      heard);
  });
  document.querySelector("#peers tbody").replaceChildren(...rows);
  // Colours go in through the CSSOM: the page's security policy refuses inline style attributes.
  for (const swatch of document.querySelectorAll("#peers .swatch")) swatch.style.background = swatch.dataset.color;
}

// --- link heatmap -------------------------------------------------------------------------------------------------

function linkLookup(state) {
  const measured = new Map(state.links.map((l) => [`${l.src} ${l.dst}`, l]));
  const estimated = new Map();
  for (const l of state.estimated_links) {
    estimated.set(`${l.src} ${l.dst}`, l);
    estimated.set(`${l.dst} ${l.src}`, l);
  }
  return (src, dst) => {
    if (src === dst) return {kind: "self"};
    const own = measured.get(`${src} ${dst}`);
    if (own) return {kind: "measured", link: own};
    const other = measured.get(`${dst} ${src}`);
    if (other) return {kind: "measured-by-peer", link: other};
    const guess = estimated.get(`${src} ${dst}`);
    return guess ? {kind: "estimated", link: guess} : {kind: "missing"};
  };
}

function heatColor(value, lo, hi, lowIsGood) {
  if (!(value > 0)) return "#e2e8f0";
  let t = hi > lo ? (Math.log(value) - Math.log(lo)) / (Math.log(hi) - Math.log(lo)) : 0.5;
  t = Math.min(1, Math.max(0, lowIsGood ? t : 1 - t));  // 0: the best link shown, 1: the worst
  return `hsl(${Math.round(130 * (1 - t))}, 62%, ${Math.round(58 + 8 * (1 - t))}%)`;
}

function renderHeatmap(state) {
  const box = document.getElementById("heatmap");
  const peers = state.peers;
  const lookup = linkLookup(state);
  const {unit, lowIsGood, label} = METRICS[metric];
  const counts = state.counts;
  const bottleneck = state.assignment && state.assignment.bottleneck_link;
  const hot = bottleneck ? new Set([`${bottleneck.src.peer_id} ${bottleneck.dst.peer_id}`,
                                    `${bottleneck.dst.peer_id} ${bottleneck.src.peer_id}`]) : new Set();
  document.getElementById("links-note").textContent =
    `${label} from each row's peer to each column's peer, ${unit}; ${counts.pairs_measured} of ${counts.pairs} ` +
    `pairs measured; hatched ~ values are estimated${state.estimate_error ? ` (${state.estimate_error})` : ""}; ` +
    "red outline: the plan's bottleneck link";
  box.dataset.peerCount = peers.length;
  if (peers.length === 0) {
    box.replaceChildren(el("p", {class: "muted"}, "no peers yet"));
    return;
  }
  const values = [];
  for (const a of peers) for (const b of peers) {
    const found = lookup(a.peer_id, b.peer_id);
    if (found.link && found.link[metric] > 0) values.push(found.link[metric]);
  }
  const lo = Math.min(...values), hi = Math.max(...values);
  const cell = Math.max(22, Math.min(64, Math.floor(520 / peers.length)));
  const left = 110, top = 64, size = cell * peers.length;
  const root = svg("svg", {viewBox: `0 0 ${left + size + 8} ${top + size + 40}`, width: left + size + 8,
                           role: "img", "aria-label": `${label} heatmap`},
    svg("defs", {}, svg("pattern", {id: "hatch", width: 6, height: 6, patternUnits: "userSpaceOnUse",
                                    patternTransform: "rotate(45)"},
                        svg("line", {x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#ffffff", "stroke-width": 2.2}))));
  peers.forEach((p, i) => {
    root.append(svg("text", {x: left - 6, y: top + i * cell + cell / 2 + 4, "text-anchor": "end",
                             "data-row-peer": p.peer_id}, peerLabel(p)));
    const x = left + i * cell + cell / 2, y = top - 6;
    root.append(svg("text", {x, y, transform: `rotate(-40 ${x} ${y})`, "data-col-peer": p.peer_id}, peerLabel(p)));
  });
  peers.forEach((src, i) => peers.forEach((dst, j) => {
    const found = lookup(src.peer_id, dst.peer_id);
    const x = left + j * cell, y = top + i * cell;
    const value = found.link ? found.link[metric] : null;
    const fill = found.kind === "self" ? "#4a5568" : heatColor(value, lo, hi, lowIsGood);
    const isHot = hot.has(`${src.peer_id} ${dst.peer_id}`);
    const title = found.kind === "self" ? peerLabel(src) :
      `${peerLabel(src)} → ${peerLabel(dst)}: ` + (found.link ?
        `${fmt(found.link.latency_ms, 1)} ms, ${fmt(found.link.bandwidth_mbps, 1)} Mbit/s (${found.kind})` :
        "not measured");
    const group = svg("g", {"data-src": src.peer_id, "data-dst": dst.peer_id, "data-kind": found.kind,
                            "data-value": value},
      svg("title", {}, title),
      svg("rect", {x: x + 1, y: y + 1, width: cell - 2, height: cell - 2, rx: 3, fill,
                   stroke: isHot ? "#c53030" : "none", "stroke-width": isHot ? 3 : 0}));
    if (found.kind === "estimated") {
      group.append(svg("rect", {x: x + 1, y: y + 1, width: cell - 2, height: cell - 2, rx: 3, fill: "url(#hatch)",
                                "fill-opacity": 0.55}));
    }
    if (found.link && cell >= 30) {
      const text = (found.kind === "estimated" ? "~" : "") + fmt(value, value < 10 ? 1 : 0);
      group.append(svg("text", {x: x + cell / 2, y: y + cell / 2 + 4, "text-anchor": "middle",
                                class: found.kind === "estimated" ? "value estimated-value" : "value"}, text));
    } else if (found.kind === "missing") {
      group.append(svg("text", {x: x + cell / 2, y: y + cell / 2 + 4, "text-anchor": "middle", class: "value"}, "?"));
    }
    root.append(group);
  }));
  if (values.length) {
    const legendY = top + size + 14, width = Math.min(size, 240);
    const steps = 24;
    for (let k = 0; k < steps; k++) {
      const v = Math.exp(Math.log(lo) + (Math.log(hi) - Math.log(lo)) * k / (steps - 1 || 1));
      root.append(svg("rect", {x: left + k * width / steps, y: legendY, width: width / steps + 0.5, height: 10,
                               fill: heatColor(v, lo, hi, lowIsGood)}));
    }
    root.append(svg("text", {x: left, y: legendY + 24}, `${fmt(lo, 1)} ${unit}`),
                svg("text", {x: left + width, y: legendY + 24, "text-anchor": "end"}, `${fmt(hi, 1)} ${unit}`));
  }
  box.replaceChildren(root);
}

// --- the stage × pipeline grid ------------------------------------------------------------------------------------

function renderPlan(state) {
  const a = state.assignment;
  const box = document.getElementById("grid");
  const notes = document.getElementById("plan-notes");
  const title = document.getElementById("plan-title");
  if (!a) {
    title.textContent = "";
    box.dataset.peerCount = 0;
    box.replaceChildren(el("p", {class: "muted"}, "no assignment yet: a coordinator publishes one once enough " +
                                                  "peers are ready"));
    notes.replaceChildren();
    return;
  }
  title.textContent = `v${a.version} (${a.model}): ${a.d_pp} stages × ${a.d_dp} pipelines, ` +
    `${a.micro_batches} micro-batches; ${a.reason}`;
  const measured = linkLookup(state);
  const b = a.bottleneck_link;
  const isEnd = (stage, replica) => b && replica === b.pipeline && (stage === b.stage || stage === b.stage + 1);
  const header = el("tr", {}, el("th", {}, "stage (layers)"),
                    ...a.grid[0].map((_, r) => el("th", {}, `pipeline ${r}`)));
  const rows = [header];
  a.grid.forEach((row, stage) => {
    const [first, last] = a.stage_layers[stage];
    rows.push(el("tr", {class: "stage"}, el("td", {class: "stage-label"}, `stage ${stage} [${first}, ${last})`),
      ...row.map((peer, replica) => el("td", {
        class: "grid-cell" + (peer.alive ? "" : " gone") + (isEnd(stage, replica) ? " bottleneck-end" : ""),
        "data-peer-id": peer.peer_id, "data-stage": stage, "data-replica": replica},
        el("span", {class: "peer-name"}, peerLabel(peer)), el("span", {class: "site"}, peer.site || "")))));
    if (stage + 1 < a.grid.length) {
      rows.push(el("tr", {class: "hop"}, el("td"), ...row.map((peer, replica) => {
        const next = a.grid[stage + 1][replica];
        const found = measured(peer.peer_id, next.peer_id);
        const hot = b && b.stage === stage && b.pipeline === replica;
        const figures = found.link ? `${found.kind === "estimated" ? "~" : ""}${fmt(found.link.latency_ms, 0)} ms · ` +
          `${fmt(found.link.bandwidth_mbps, 0)} Mbit/s` : "";
        return el("td", {class: hot ? "hop bottleneck" : "hop", "data-stage": stage, "data-replica": replica,
                         "data-bottleneck": hot ? "true" : null}, `↓ ${figures}${hot ? "  ◀ bottleneck" : ""}`);
      })));
    }
  });
  box.replaceChildren(el("table", {}, el("tbody", {}, ...rows)));
  box.dataset.peerCount = a.grid.flat().length;
  const items = [];
  if (b) {
    items.push(el("li", {class: "bottleneck"}, `bottleneck link: stage ${b.stage}→${b.stage + 1} of pipeline ` +
      `${b.pipeline}, ${peerLabel(b.src)} → ${peerLabel(b.dst)}: ${fmt(b.latency_ms, 0)} ms, ` +
      `${fmt(b.bandwidth_mbps, 0)} Mbit/s${b.estimated ? " (estimated)" : ""}, ${fmt(b.micro_batch_s, 3)} s per micro-batch`));
  }
  const parts = Object.entries(a.breakdown).filter(([k]) => k !== "step_s")
    .map(([k, v]) => `${k.replace(/_s$/, "").replace(/_/g, " ")} ${fmt(v, 3)}`).join(", ");
  items.push(el("li", {}, `predicted step ${fmt(a.predicted_step_s, 3)} s${parts ? ` (${parts})` : ""}; ` +
                          `${a.followers} peers follow this version`));
  if (a.standbys.length) items.push(el("li", {}, "standby: " + a.standbys.map(peerLabel).join(", ")));
  if (a.training_state) items.push(el("li", {class: "training-state"}, trainingStateText(a.training_state)));
  notes.replaceChildren(...items);
}

// The same line as the terminal's (training_state_line in client/monitor/render.py).
const ORIGINS = {"seed": "from the seed", "kept": "kept", "handed off": "handed off", "checkpoint": "from checkpoints"};

function trainingStateText(t) {
  const every = t.checkpoint_every ? ` (every ${t.checkpoint_every} steps)` : "";
  const checkpoint = t.last_checkpoint === null ? "none" : `step ${t.last_checkpoint}`;
  const replicas = t.replicas.map((n, s) => `${t.replicas_training[s]}/${n}`).join(", ");
  const origins = Object.entries(ORIGINS).map(([origin, label]) => {
    const members = t.handoffs.filter((h) => h.origin === origin);
    if (!members.length) return null;
    if (origin !== "handed off" && origin !== "checkpoint") return `${members.length} ${label}`;
    const mib = members.reduce((sum, h) => sum + h.bytes, 0) / 2 ** 20;
    const slowest = Math.max(...members.map((h) => h.seconds));
    return `${members.length} ${label} ${fmt(mib, 1)} MiB in ${fmt(slowest, 1)} s to ` +
      members.map(peerLabel).join(", ");
  }).filter(Boolean).join(", ");
  return `step ${t.step === null ? "-" : t.step} · last checkpoint: ${checkpoint}${every} · ` +
    `replicas training per stage: ${replicas}${origins ? ` · state: ${origins}` : ""}` +
    `${t.resumed_from_checkpoint ? "; resumed from checkpoints" : ""}` +
    `${t.seeded_layers.length ? `; layers ${JSON.stringify(t.seeded_layers)} restarted from the seed` : ""}`;
}

// --- charts -------------------------------------------------------------------------------------------------------

function niceTicks(lo, hi, count = 5) {
  if (!(hi > lo)) hi = lo + 1;
  const raw = (hi - lo) / count;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * magnitude).find((s) => s >= raw);
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9 && ticks.length < 20; t += step) {
    ticks.push(Number(t.toPrecision(12)));
  }
  return ticks;
}

function lineChart(target, series, refs, {yFromZero = false, empty = "no data yet"} = {}) {
  const W = 600, H = 260, L = 52, R = 12, T = 12, B = 32;
  target.dataset.series = series.length;
  target.dataset.points = series.reduce((n, s) => n + s.points.length, 0);
  const points = series.flatMap((s) => s.points).concat(refs.flatMap((r) => [[r.x0, r.y], [r.x1, r.y]]));
  if (points.length === 0) {
    target.replaceChildren(svg("text", {x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty"}, empty));
    return;
  }
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [yFromZero ? 0 : Math.min(...ys), Math.max(...ys)];
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const pad = (y1 - y0) * 0.06;
  y1 += pad;
  if (!yFromZero) y0 -= pad;
  const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const sy = (y) => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  const parts = [];
  const yTicks = niceTicks(y0, y1);
  const spacing = yTicks.length > 1 ? yTicks[1] - yTicks[0] : 1;
  const digits = Math.max(0, Math.min(4, -Math.floor(Math.log10(spacing) + 1e-9)));  // as many as the ticks need
  for (const t of yTicks) {
    parts.push(svg("line", {x1: L, x2: W - R, y1: sy(t), y2: sy(t), class: "gridline"}),
               svg("text", {x: L - 6, y: sy(t) + 4, "text-anchor": "end"}, t.toFixed(digits)));
  }
  for (const t of niceTicks(x0, x1, 6).filter((t) => Number.isInteger(t))) {
    parts.push(svg("text", {x: sx(t), y: H - B + 16, "text-anchor": "middle"}, String(t)));
  }
  parts.push(svg("line", {x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis"}),
             svg("line", {x1: L, x2: L, y1: T, y2: H - B, class: "axis"}),
             svg("text", {x: W - R, y: H - 2, "text-anchor": "end"}, "step"));
  for (const r of refs) {
    parts.push(svg("line", {x1: sx(r.x0), x2: sx(r.x1), y1: sy(r.y), y2: sy(r.y), stroke: "#1d232b",
                            "stroke-width": 1.5, "stroke-dasharray": "6 4", "data-predicted": r.y},
                   svg("title", {}, r.label)));
  }
  for (const s of series) {
    const path = s.points.map((p, i) => `${i ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
    const style = s.dash ? {"stroke-dasharray": "2 3", "data-held-out": "1"} : {};
    parts.push(svg("path", {d: path, fill: "none", stroke: s.color, "stroke-width": 2, "data-peer-id": s.peer, ...style},
                   svg("title", {}, s.label)));
    if (s.points.length < 40) {
      for (const p of s.points) parts.push(svg("circle", {cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: s.color}));
    }
  }
  target.replaceChildren(...parts);
}

function legend(box, series, refs) {
  const items = series.map((s) => {
    const swatch = el("span", {class: "swatch"});
    swatch.style.background = s.color;
    return el("span", {}, swatch, s.label);
  });
  for (const r of refs) items.push(el("span", {}, el("span", {class: "dash"}), r.label));
  box.replaceChildren(...items);
}

function historySeries(state, colors, names, pick) {
  const series = [];
  for (const [peer, points] of Object.entries(state.history.peers)) {
    const xy = points.filter((p) => pick(p) !== null && Number.isFinite(pick(p))).map((p) => [p.step, pick(p)]);
    if (xy.length) series.push({peer, label: names.get(peer) || peer.slice(-6), color: colors.get(peer) || "#999",
                                points: xy});
  }
  return series.sort((a, b) => a.label.localeCompare(b.label));
}

function renderLoss(state, colors, names) {
  const series = historySeries(state, colors, names, (p) => p.loss);
  for (const [peer, points] of Object.entries(state.history.held_out || {})) {  // dotted: held-out loss
    const label = `${names.get(peer) || peer.slice(-6)} held-out`;
    if (points.length) series.push({peer, label, color: colors.get(peer) || "#999", points, dash: true});
  }
  lineChart(document.getElementById("loss-chart"), series, [], {empty: "no loss reported yet"});
  legend(document.getElementById("loss-legend"), series, []);
}

function renderStepTime(state, colors, names) {
  const series = historySeries(state, colors, names, (p) => p.step_s);
  const steps = new Map();  // version → [first step, last step] measured under it, by any peer
  for (const points of Object.values(state.history.peers)) {
    for (const p of points) {
      const [lo, hi] = steps.get(p.version) || [p.step, p.step];
      steps.set(p.version, [Math.min(lo, p.step), Math.max(hi, p.step)]);
    }
  }
  const refs = state.history.predictions.filter((p) => steps.has(p.version) && p.predicted_step_s > 0).map((p) => {
    const [x0, x1] = steps.get(p.version);
    return {x0, x1: Math.max(x1, x0 + 1), y: p.predicted_step_s,
            label: `predicted v${p.version}: ${fmt(p.predicted_step_s, 3)} s`};
  });
  lineChart(document.getElementById("step-chart"), series, refs, {yFromZero: true, empty: "no steps reported yet"});
  legend(document.getElementById("step-legend"), series, refs);
}

// --- start --------------------------------------------------------------------------------------------------------

for (const button of document.querySelectorAll("[data-metric]")) {
  button.addEventListener("click", () => {
    metric = button.dataset.metric;
    for (const other of document.querySelectorAll("[data-metric]")) other.classList.toggle("active", other === button);
    if (lastState) renderHeatmap(lastState);
  });
}
poll();
