// The page: feeds each panel's model from the server's messages (the connection, and the
// key a guarded server asks for, are socket.js's), and redraws what changed once per
// animation frame. Live, each panel shows its latest iteration; in replay the slider picks
// a moment and every panel shows itself as it was then, on one shared time scale.

import { applyLabels, getLang, setLang, t } from "./i18n.js";
import { PanelModel, PHASE_NAMES } from "./model.js";
import { COLORS, Timeline } from "./timeline.js";
import { drawKvMap } from "./kvmap.js";
import { countersAt, formatCounters } from "./counters.js";
import { OccupancyChart, UTILISATION } from "./chart.js";
import { clearDecisions, fillSettings, fillSimulation, fillWorkload, handleReply, showMessage, wireControls } from "./controls.js";
import { showSimulation } from "./simulation.js";
import { showTooltip, hideTooltip } from "./tooltip.js";
import { onNarration, renderLesson, scenarioLabel, showScenario, wireLesson } from "./narration.js";
import { fleetTitle, noteRouted } from "./fleet.js";
import { watchTenants } from "./tenants.js";
import { forgetTransfers, noteTransfer, transferTitle } from "./transfers.js";
import { drawLanes, watchLanes } from "./lanes.js";
import { connect, takeKeyFromAddress } from "./socket.js";
import { showArrivals } from "./arrivals.js";

const $ = (id) => document.getElementById(id);
const ORDER = ["static", "continuous"]; // static on the left: the baseline first
const WINDOWS = { iter: { 100: 100, 300: 300 }, time: { 100: 20, 300: 60 } };

const app = {
  mode: null, panels: [], ws: null, dirty: true, paused: false,
  scale: { mode: "iter", window: "300", x0: 0, x1: 1, t0: 0 },
  replay: null, // {tMin, tMax, t, playing}
  chart: new OccupancyChart($("chart"), { nameOf: (p) => panelTitle(p) }),
  utilChart: new OccupancyChart($("util-chart"), { measures: UTILISATION, title: "utilChart", hideEmpty: true, cap: 1, nameOf: (p) => panelTitle(p) }),
  lastSlow: 0, slowPending: true, lastChart: 0, chartEvery: 250,
};
const SLOW_MS = 250; // counters and the chart: a few times a second
const LIVE_MAPS = 64; // steps back whose KV block maps a live page keeps (it draws the latest)
window.minicb = app; // for the browser tests and the curious

app.send = (msg) => { if (app.ws && app.ws.readyState === 1) app.ws.send(JSON.stringify(msg)); };
app.setPaused = (paused) => {
  app.paused = paused;
  $("pause").classList.toggle("on", paused);
  $("resume").classList.toggle("on", !paused);
};
app.markMine = (ids, text) => {
  for (const [name, id] of Object.entries(ids || {})) {
    const p = app.panels.find((q) => q.name === name);
    if (p) { const r = p.model.req(id); r.mine = true; r.typed = text; p.model.version++; }
  }
  app.dirty = true;
};

// A lesson's own label first (it speaks both languages), then the role the server gave.
function panelTitle(p) { return scenarioLabel(p.name) || transferTitle(p) || fleetTitle(p) || `${t(p.model.batching) || p.name}`; }

function buildPanels(engines) {
  const sorted = [...engines].sort((a, b) => rank(a.name) - rank(b.name));
  $("panels").replaceChildren();
  app.panels = sorted.map((info) => {
    const el = $("panel-template").content.firstElementChild.cloneNode(true);
    el.dataset.engine = info.name;
    $("panels").append(el);
    const p = { name: info.name, el, model: new PanelModel(info), timeline: new Timeline(el.querySelector(".timeline")) };
    const canvas = el.querySelector(".timeline");
    canvas.onmousemove = (ev) => showTooltip(ev, p, p.timeline.rowAt(ev.offsetY), cursorOf(p));
    canvas.onmouseleave = hideTooltip;
    watchLanes(p); // the host's and the device's lanes (lanes.js)
    return p;
  });
  applyLabels();
  app.dirty = true;
}
function rank(name) { const i = ORDER.indexOf(name); return i < 0 ? ORDER.length : i; }

function legend() {
  $("legend").replaceChildren(...PHASE_NAMES.map((name, code) => {
    const s = document.createElement("span");
    s.innerHTML = `<i style="background:${COLORS[code]}"></i>`;
    s.append(t(`ph_${name}`));
    return s;
  }));
}

// ---- messages from the server ------------------------------------------------------------
function onHello(msg) {
  app.mode = msg.mode; app.role = msg.role;
  if (msg.mode === "serve") watchTenants(); // the fair queue's panel, if the server has one
  document.body.className = msg.mode;
  document.body.classList.toggle("viewer", msg.role === "viewer"); // read-only: no controls
  $("mode").textContent = t(`${msg.mode}Mode`);
  $("mode").dataset.i18n = `${msg.mode}Mode`;
  $("model").textContent = msg.model || "";
  buildPanels(msg.engines);
  clearDecisions(); // a reconnect: the engines may have been rebuilt meanwhile
  onView(msg);
  // The free demo's two engines run different numbers of iterations in the same seconds
  // (static batching 1.7-1.9x as many over the same bursts; a simulated GPU's fuller batch
  // takes longer a step): on one iterations window the side that ran fewer slides off its
  // left edge within minutes. Wall time puts both sides' present at the right edge, and
  // shows continuous batching done with a burst while static batching still works on it.
  // A lesson keeps iterations: its narration counts them.
  if (msg.mode === "demo" && !msg.scenario) {
    app.scale.mode = "time"; $("xmode").value = "time";
    if (msg.engines.some((e) => e.simulated)) { // 20 s: a simulated row of a few seconds reads
      app.scale.window = "100"; $("window").value = "100";
    }
  }
  app.setPaused(msg.paused);
  $("delay").value = Math.round((msg.delay_s || 0) * 1000);
  $("delay-out").value = `${$("delay").value} ms`;
  const c = msg.controls || {};
  $("workload-form").hidden = !c.workload;
  $("settings-form").hidden = !c.settings;
  // replicas (serve --replicas): a prompt goes through the router, so there is no target
  $("prompt-target").hidden = msg.engines.length < 2 || msg.engines.some((e) => e.replica != null);
  if (msg.engines.length) fillSettings(msg.engines[0].config);
  fillWorkload(msg.workload);
  app.simInfo = msg.engines[0];
  showSimulation(app.simInfo, app.panels);
  fillSimulation(c.settings ? msg.simulation : null);
  showScenario(app, msg.scenario, c.settings);
}

// Each engine as the server holds it now (on joining, or again when this tab fell behind):
// its requests, its recent iterations and its KV map; the frames after it go on from there.
function onView(msg) {
  forgetTransfers(); // the strip is drawn again from the views' latest transfers
  const transfers = [];
  for (const info of msg.engines) {
    const p = app.panels.find((q) => q.name === info.name);
    if (!p) continue;
    p.model.reset(info);
    if (msg.mode !== "replay") p.model.mapsKept = LIVE_MAPS;
    p.model.applyView(info);
    transfers.push(...(info.transfers || []));
  }
  transfers.sort((a, b) => a.time - b.time);
  for (const e of transfers) noteTransfer(e, app.panels);
  app.dirty = true;
}

function onFrame(msg) {
  const p = app.panels.find((q) => q.name === msg.engine);
  if (!p) return;
  for (const e of msg.events) {
    p.model.apply(e); // a "reset" among them starts the panel afresh
    if (e.type === "routed") noteRouted(e); // a fleet's router: its reasons beside the panels
    if (e.type === "kv_transfer") noteTransfer(e, app.panels); // between the engines' panels
    if (e.type === "reset") { app.simInfo = e.info; showSimulation(e.info, app.panels); forgetTransfers(); clearDecisions(); }
  }
  if (msg.kv_grid) p.model.kvGrid = msg.kv_grid;
  p.model.dropped = msg.dropped || 0;
  showArrivals(msg.arrivals); // the demo's workload: arrivals skipped for both engines
  app.frames = (app.frames || 0) + 1;
  app.bytes = (app.bytes || 0) + (msg.size || 0);
  app.dirty = true;
}

function onReplay(msg) {
  for (const p of app.panels) {
    const trace = msg.traces[p.name];
    if (trace) for (const e of trace.events) p.model.apply(e);
  }
  const ends = app.panels.flatMap((p) => p.model.steps.length ? [p.model.steps.at(-1).wallEnd] : []);
  const starts = app.panels.map((p) => p.model.t0).filter((x) => x != null);
  app.replay = { tMin: Math.min(...starts), tMax: Math.max(...ends), t: Math.max(...ends), playing: false };
  $("replay-bar").hidden = false;
  renderLesson(app); // an exported lesson: its point's moment, now that the steps are in
  app.dirty = true;
}

// ---- the server's messages --------------------------------------------------------------
// Every message but the key's request (socket.js answers that), in the order it was sent.
function onMessage(msg, size) {
  if (msg.type === "frame") { msg.size = size; onFrame(msg); }
  else if (msg.type === "view") onView(msg);
  else if (msg.type === "hello") onHello(msg);
  else if (msg.type === "replay") onReplay(msg);
  else if (msg.type === "narration") onNarration(app, msg);
  else {
    if (msg.type === "ack" && msg.control === "scenario") showScenario(app, msg.scenario, true);
    handleReply(msg, app);
  }
}

// ---- drawing -------------------------------------------------------------------------------
function cursorOf(p) {
  if (!app.replay) return p.model.lastStep;
  const pos = lastBefore(p.model.steps, app.replay.t);
  return pos < 0 ? 0 : p.model.steps[pos].step;
}
function lastBefore(steps, time) {
  let lo = 0, hi = steps.length - 1, best = -1;
  while (lo <= hi) { const m = (lo + hi) >> 1; if (steps[m].wallEnd <= time + 1e-9) { best = m; lo = m + 1; } else hi = m - 1; }
  return best;
}

function updateScale(cursors) {
  const s = app.scale;
  const t0s = app.panels.map((p) => p.model.t0).filter((x) => x != null);
  s.t0 = t0s.length ? Math.min(...t0s) : 0;
  if (s.mode === "iter") s.x1 = Math.max(10, ...cursors.values());
  else s.x1 = Math.max(1, ...app.panels.map((p) => { const st = p.model.stepAt(cursors.get(p.name)); return st ? st.wallEnd - s.t0 : 0; }));
  const w = WINDOWS[s.mode][s.window];
  s.x0 = w ? Math.max(0, s.x1 - w) : 0;
}

// Each frame's own work in ms (the last FRAME_LOG), read by the browser tests: what the page
// costs at scale, beside the requestAnimationFrame deltas they measure.
const FRAME_LOG = 600;
app.frameMs = [];
function frame(now) {
  requestAnimationFrame(frame);
  const start = performance.now();
  render(now);
  app.frameMs.push(performance.now() - start);
  if (app.frameMs.length > FRAME_LOG) app.frameMs.shift();
}

function render(now) {
  if (app.replay && app.replay.playing) {
    app.replay.t = Math.min(app.replay.tMax, app.replay.t + 1 / 60);
    if (app.replay.t >= app.replay.tMax) app.replay.playing = false;
    $("scrub").value = Math.round((1000 * (app.replay.t - app.replay.tMin)) / Math.max(app.replay.tMax - app.replay.tMin, 1e-9));
    app.dirty = true;
  }
  // Redraw when something changed; the slow part follows at most every SLOW_MS.
  const slow = app.slowPending && now - app.lastSlow > SLOW_MS;
  if (!app.dirty && !slow) return;
  const cursors = new Map(app.panels.map((p) => [p.name, cursorOf(p)]));
  updateScale(cursors);
  if (app.dirty) {
    app.dirty = false;
    app.slowPending = true;
    drawPanels(cursors);
  }
  if (slow) {
    app.slowPending = false;
    app.lastSlow = now;
    for (const p of app.panels) {
      const c = formatCounters(countersAt(p.model, cursors.get(p.name)));
      for (const dd of p.el.querySelectorAll("dd[data-c]")) {
        const hidden = c[dd.dataset.c] == null; // shown only where it applies
        if (dd.parentElement.hidden !== hidden) dd.parentElement.hidden = hidden;
        setText(dd, c[dd.dataset.c] ?? "");
      }
    }
    if (now - app.lastChart > app.chartEvery) { // at most a tenth of the time on the chart
      const start = performance.now();
      app.chart.update(app.panels, app.scale, cursors);
      app.utilChart.update(app.panels, app.scale, cursors);
      app.lastChart = now;
      app.chartEvery = Math.max(SLOW_MS, 10 * (performance.now() - start));
    } else app.slowPending = true; // the chart's turn comes later
    renderMine(cursors);
  }
}

function drawPanels(cursors) {
  // Every canvas first, then the page's text: a text written between two canvases would
  // make the next canvas's size read lay the page out again (once a panel at scale).
  const kvs = app.panels.map((p) => {
    const cursor = cursors.get(p.name);
    p.timeline.draw(p.model, app.scale, cursor);
    drawLanes(p, cursor);
    return drawKvMap(p.el.querySelector(".kvmap"), p.model, cursor);
  });
  app.panels.forEach((p, i) => {
    const cursor = cursors.get(p.name), kv = kvs[i];
    setData(p.el, "step", cursor);
    setData(p.el, "rows", p.timeline.rows.length);
    setText(p.el.querySelector(".panel-title"), panelTitle(p));
    const shown = p.timeline.rows.length, all = p.timeline.total || shown;
    const sampled = t(p.timeline.withNow ? "rowsSampledNow" : "rowsSampled")
      .replace("{every}", p.timeline.every).replace("{shown}", shown).replace("{all}", all);
    const which = p.timeline.every > 1 ? sampled : `${t("rowsShown")} ${shown} ${t("rowsOf")} ${all}`;
    setText(p.el.querySelector(".panel-step"), `${t("iterations")}: ${cursor}` + (all > shown ? ` · ${which}` : ""));
    if (kv) {
      setData(p.el, "kvUsed", kv.used);
      setText(p.el.querySelector(".kv-figures"),
        `${t("kvUsed")} ${kv.used} / ${kv.total}` + (kv.swapped ? ` · ${t("kvSwapped")} ${kv.swapped}` : "") +
        (kv.host ? ` · ${t("kvHost")} ${kv.host}` : "") +
        (kv.per > 1 ? ` · ${t("kvCellIs")} ${kv.per} ${t("kvBlocks")}` : ""));
    }
    const dropped = p.el.querySelector(".dropped");
    dropped.hidden = !p.model.dropped;
    setText(dropped, `${p.model.dropped} ${t("dropped")}`);
  });
  if (app.replay) $("scrub-out").value = `${(app.replay.t - app.replay.tMin).toFixed(2)} s`;
}

// Writes that change nothing still cost a style pass: skip them.
function setText(el, text) { if (el.textContent !== text) el.textContent = text; }
function setData(el, key, value) { if (el.dataset[key] !== String(value)) el.dataset[key] = value; }

function renderMine(cursors) {
  const items = [];
  for (const p of app.panels) {
    for (const r of p.model.order) {
      if (!r.mine) continue;
      const li = document.createElement("li");
      li.dataset.engine = p.name; li.dataset.request = r.id;
      const text = r.textAt(cursors.get(p.name)) || (r.tokenIds.length ? `[${r.tokenIds.join(" ")}]` : "…");
      li.innerHTML = `<b></b> <span class="text"></span>`;
      li.querySelector("b").textContent = `${t(p.model.batching)} #${r.id}:`;
      li.querySelector(".text").textContent = text;
      items.push(li);
    }
  }
  $("mine").replaceChildren(...items);
}

// ---- page controls that need no server ------------------------------------------------------
$("lang").onclick = () => {
  setLang(getLang() === "zh" ? "en" : "zh");
  $("lang").textContent = getLang() === "zh" ? "English" : "中文";
  legend(); showArrivals(); showSimulation(app.simInfo, app.panels); renderLesson(app); app.dirty = true; app.chart.lastKey = app.utilChart.lastKey = "";
};
$("xmode").onchange = () => { app.scale.mode = $("xmode").value; app.dirty = true; };
$("window").onchange = () => { app.scale.window = $("window").value; app.dirty = true; };
$("scrub").oninput = () => {
  const r = app.replay;
  if (!r) return;
  r.t = r.tMin + (Number($("scrub").value) / 1000) * (r.tMax - r.tMin);
  r.playing = false; app.dirty = true;
};
$("play").onclick = () => {
  const r = app.replay;
  if (!r) return;
  if (r.t >= r.tMax) r.t = r.tMin;
  r.playing = !r.playing; app.dirty = true;
};
window.addEventListener("resize", () => { app.dirty = true; });

$("lang").textContent = getLang() === "zh" ? "English" : "中文";
applyLabels();
legend();
wireControls(app);
wireLesson(app);
showMessage("");
takeKeyFromAddress();
connect((ws) => { app.ws = ws; }, onMessage);
requestAnimationFrame(frame);
