// A share over time (in %), one line per engine and measure, drawn with plotly.js (served
// locally). Slot occupancy = rows doing useful work / max sequences: padding rows do not
// count. GPU utilisation = a step's bytes / (peak bandwidth x its time) and FLOPs / (peak
// FLOP/s x its time), from the step events (null where the runner does not know it). A
// chart with a cap draws values above it at the cap (a real engine's tiny model can beat
// the probed DRAM bandwidth from the CPU's caches), shows its card's .cap-note when one
// was, and keeps the measured value for the hover.

import { t } from "./i18n.js";
import { scenarioLabel } from "./narration.js";

const MAX_POINTS = 1500; // a line's points in the window: beyond this they are thinned
const LINE = { static: "#6b7280", continuous: "#2563eb" };
const BY_SIDE = ["#6b7280", "#2563eb"]; // a scenario's two sides, left then right
const pct = (v) => (v == null ? null : 100 * v);
// measures: i18n key of its name ("" for the chart's only one), value of a step, line dash
export const OCCUPANCY = [{ label: "", value: (s) => (s.slotsLimit ? s.useful / s.slotsLimit : 0) }];
export const UTILISATION = [
  { label: "bandwidthUtil", value: (s) => s.bandwidthUtil, dash: "solid" },
  { label: "flopUtil", value: (s) => s.flopUtil, dash: "dot" },
];

export class OccupancyChart {
  // title: the i18n key of its heading; hideEmpty: its card hides while no step has a value;
  // nameOf: a panel's name in the legend (the page's own panel titles: "replica 1",
  // "prefill engine 0", a lesson's sides), else its kind of batching
  constructor(el, { measures = OCCUPANCY, title = "occupancyChart", hideEmpty = false, cap = null, nameOf = null } = {}) {
    this.el = el;
    this.nameOf = nameOf;
    this.measures = measures;
    this.title = title;
    this.hideEmpty = hideEmpty;
    this.cap = cap; // the largest share drawn (1: 100 %), or null
    this.lastKey = "";
  }

  update(panels, scale, cursors) {
    if (!window.Plotly) return;
    const traces = [];
    let key = `${scale.mode}|${scale.x0}|${scale.x1}|${t(this.title)}`; // the window's lines
    let any = false;
    let capped = false;
    const top = this.cap == null ? Infinity : 100 * this.cap;
    // Static against continuous: each its colour. Engines of one kind (a fleet's replicas, a
    // lesson's two sides): left and right by position, the later ones dotted.
    const byKind = new Set(panels.map((p) => p.model.batching)).size === panels.length;
    for (const [n, p] of panels.entries()) {
      const steps = p.model.steps;
      const end = p.model.stepPos(cursors.get(p.name));
      const xOf = (s) => (scale.mode === "iter" ? s.step : s.wallEnd - scale.t0);
      // Only the window's steps (from the last one before its left edge, where the line
      // enters), thinned to MAX_POINTS: after an hour the line is as fine as after a minute.
      const from = lastAtOrBefore(steps, end, scale.x0, xOf);
      const every = Math.max(1, Math.ceil((end - from + 1) / MAX_POINTS));
      const x = [];
      const ys = this.measures.map(() => []);
      for (let i = from; i <= end; i = i < end ? Math.min(i + every, end) : end + 1) { // the last too
        const s = steps[i];
        x.push(xOf(s));
        this.measures.forEach((m, j) => ys[j].push(pct(m.value(s))));
      }
      key += `|${p.name}:${end}:${p.model.version}`;
      const name = (this.nameOf && this.nameOf(p)) || t(p.model.batching) || p.name;
      const bySide = scenarioLabel(p.name) || !byKind;
      const color = bySide ? BY_SIDE[n % 2] : LINE[p.model.batching];
      const dash = bySide && n >= 2 ? "dot" : null;
      this.measures.forEach((m, j) => {
        any ||= ys[j].some((v) => v != null);
        capped ||= ys[j].some((v) => v > top);
        traces.push({
          x, y: ys[j].map((v) => (v > top ? top : v)), name: m.label ? `${name} · ${t(m.label)}` : name,
          mode: "lines", line: { shape: "hv", width: 2, color, dash: m.dash || dash },
          customdata: ys[j], hovertemplate: "%{customdata:.1f} %",
        });
      });
    }
    if (this.hideEmpty) { // nothing to show (a runner that does not know it): no chart at all
      const card = this.el.closest(".card");
      if (card.hidden === any) card.hidden = !any;
      if (!any) return;
    }
    const note = this.el.closest(".card").querySelector(".cap-note");
    if (note && note.hidden === capped) note.hidden = !capped;
    if (key === this.lastKey) return;
    this.lastKey = key;
    const layout = {
      margin: { l: 44, r: 10, t: 8, b: 32 },
      height: this.el.clientHeight || 200,
      xaxis: { title: { text: scale.mode === "iter" ? t("iterations") : t(document.body.classList.contains("simulated") ? "simtime" : "walltime") }, range: [scale.x0, scale.x1] },
      yaxis: { title: { text: "%" }, range: [0, 105] },
      // several measures per engine: their longer legend goes below, clear of the lines
      legend: this.measures.length > 1 ? { orientation: "h", x: 0, y: -0.4 } : { orientation: "h", x: 0, y: 1.12 },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "#fff",
    };
    window.Plotly.react(this.el, traces, layout, { displayModeBar: false, responsive: true, staticPlot: false });
  }
}

// The position of the last step up to `end` whose x is at or before x0 (0 if none is): x
// grows with the position, so a binary search finds it.
function lastAtOrBefore(steps, end, x0, xOf) {
  let lo = 0, hi = end, best = 0;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (xOf(steps[mid]) <= x0) { best = mid; lo = mid + 1; } else hi = mid - 1;
  }
  return best;
}
