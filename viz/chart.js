// Slot occupancy over time, one line per engine, drawn with plotly.js (served locally).
// Occupancy = rows doing useful work / max sequences: padding rows do not count.

import { t } from "./i18n.js";
import { scenarioLabel } from "./narration.js";

const MAX_POINTS = 1500; // older points are thinned so a long run stays quick to redraw
const LINE = { static: "#6b7280", continuous: "#2563eb" };
const BY_SIDE = ["#6b7280", "#2563eb"]; // a scenario's two sides, left then right

export class OccupancyChart {
  constructor(el) {
    this.el = el;
    this.lastKey = "";
  }

  update(panels, scale, cursors) {
    if (!window.Plotly) return;
    const traces = [];
    let key = `${scale.mode}|${t("occupancyChart")}`;
    for (const [n, p] of panels.entries()) {
      const steps = p.model.steps;
      const end = p.model.stepPos(cursors.get(p.name));
      const every = Math.max(1, Math.ceil((end + 1) / MAX_POINTS));
      const x = [], y = [];
      for (let i = 0; i <= end; i += every) {
        const s = steps[i];
        x.push(scale.mode === "iter" ? s.step : s.wallEnd - scale.t0);
        y.push(s.slotsLimit ? (100 * s.useful) / s.slotsLimit : 0);
      }
      key += `|${p.name}:${end}:${p.model.version}`;
      traces.push({
        x, y, name: scenarioLabel(p.name) || t(p.model.batching) || p.name, mode: "lines",
        line: { shape: "hv", width: 2, color: scenarioLabel(p.name) ? BY_SIDE[n] : LINE[p.model.batching] },
      });
    }
    if (key === this.lastKey) return;
    this.lastKey = key;
    const layout = {
      margin: { l: 44, r: 10, t: 8, b: 32 },
      height: this.el.clientHeight || 200,
      xaxis: { title: { text: scale.mode === "iter" ? t("iterations") : t(document.body.classList.contains("simulated") ? "simtime" : "walltime") }, range: [scale.x0, scale.x1] },
      yaxis: { title: { text: "%" }, range: [0, 105] },
      legend: { orientation: "h", x: 0, y: 1.12 },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "#fff",
    };
    window.Plotly.react(this.el, traces, layout, { displayModeBar: false, responsive: true, staticPlot: false });
  }
}
