// The timeline: one row per request, iterations (or wall time) along x, a coloured cell
// per iteration. Drawn on a canvas, one rectangle per run of equal cells, and only for
// requests inside the visible window: a thousand requests stay smooth.

import { PHASE } from "./model.js";

export const COLORS = {
  [PHASE.waiting]: "#d7dce3",
  [PHASE.prefill]: "#f59e0b",
  [PHASE.decode]: "#16a34a",
  [PHASE.padding]: "#9ca3af",
  [PHASE.preempted]: "#dc2626",
  [PHASE.swapped]: "#7c3aed",
};
const AXIS_H = 16; // pixels under the rows for the x ticks
const MAX_ROW_H = 16;
const MIN_ROW_H = 3; // below this a row is a smear: fewer, later rows instead

export function fitCanvas(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  return { ctx, w, h };
}

// Where step k of `model` begins and ends on the shared axis (iterations or seconds).
function span(model, k, scale) {
  if (scale.mode === "iter") return [k - 1, k];
  const p = model.stepPos(k);
  if (p < 0) return [0, 0];
  const s = model.steps[p], prev = model.steps[p - 1];
  const begin = prev ? Math.max(prev.wallEnd, s.wallStart - 0.5) : s.wallStart;
  return [begin - scale.t0, s.wallEnd - scale.t0];
}

// The first step index at or after axis value x (binary search on wall times).
function firstStepFrom(model, x, scale) {
  if (scale.mode === "iter") return Math.max(1, Math.floor(x) + 1);
  let lo = 0, hi = model.steps.length - 1, ans = model.lastStep + 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (model.steps[mid].wallEnd - scale.t0 >= x) { ans = model.steps[mid].step; hi = mid - 1; } else lo = mid + 1;
  }
  return ans;
}

export class Timeline {
  constructor(canvas) {
    this.canvas = canvas;
    this.rows = [];
    this.rowH = MAX_ROW_H;
    this.hatch = null;
  }

  // The requests inside the window; where more than fit at MIN_ROW_H pixels (a GPU's 256
  // slots and its queue), the ones that ran, then the latest that waited; where more ran
  // than fit, the batch now and one in `every` of the others: a row stays tall enough to
  // see it enter and leave the batch.
  visibleRows(model, scale, cursor, fit = Infinity) {
    const from = firstStepFrom(model, scale.x0, scale);
    const rows = model.order.filter((r) => r.startStep <= Math.max(cursor, 1) &&
      (r.endStep == null || r.endStep >= from));
    this.total = rows.length;
    this.every = 1;
    if (rows.length <= fit) return rows;
    const ran = rows.filter((r) => r.cellsFrom != null);
    if (ran.length >= fit) {
      // Every request in the batch now (if they take at most half the rows), then one in
      // `every` of the others: the rows span the whole window. The latest `fit` alone all
      // began in its last seconds (a simulated GPU at 60 requests a second: 94 rows, 3 s of
      // a 20 s window) and left the rest of the panel empty; so does a batch now that takes
      // nearly every row. Which rows by request id, `every` a power of two: a new arrival
      // neither moves the others nor reshuffles the panel, until the load doubles or halves.
      const now = new Set(ran.filter((r) => r.cellAt(cursor) !== PHASE.waiting));
      this.withNow = now.size <= fit / 2;
      const rest = this.withNow ? ran.filter((r) => !now.has(r)) : ran;
      const room = fit - (this.withNow ? now.size : 0);
      this.every = 2 ** Math.ceil(Math.log2(rest.length / room));
      return ran.filter((r) => (this.withNow && now.has(r)) || r.id % this.every === 0);
    }
    const keep = new Set([...ran, ...rows.filter((r) => r.cellsFrom == null).slice(-(fit - ran.length))]);
    return rows.filter((r) => keep.has(r));
  }

  draw(model, scale, cursor) {
    // Nothing new in the model, the same window, the same size: the same picture.
    const c = this.canvas;
    const key = `${model.version}|${cursor}|${scale.mode}|${scale.x0}|${scale.x1}|${c.clientWidth}x${c.clientHeight}`;
    if (key === this.key) return;
    this.key = key;
    const { ctx, w, h } = fitCanvas(c);
    ctx.clearRect(0, 0, w, h);
    const rowsH = h - AXIS_H;
    const rows = this.visibleRows(model, scale, cursor, Math.max(1, Math.floor(rowsH / MIN_ROW_H)));
    const rowH = Math.min(MAX_ROW_H, Math.max(rowsH / Math.max(rows.length, 1), 0.25));
    this.rows = rows; this.rowH = rowH;
    const px = (x) => ((x - scale.x0) / Math.max(scale.x1 - scale.x0, 1e-9)) * w;
    const gap = rowH >= 6 ? 1 : 0;
    const kFrom = Math.max(firstStepFrom(model, scale.x0, scale), model.firstKnown);
    for (let i = 0; i < rows.length; i++) {
      const r = rows[i], y = i * rowH;
      if (y >= rowsH) break; // rows below the canvas (a queue of thousands) are not drawn
      const last = Math.min(r.endStep ?? cursor, cursor);
      let k = Math.max(r.startStep, kFrom);
      while (k <= last) {
        const code = r.cellAt(k);
        // the wait before its first cell is one run, found without walking it
        let j = r.cellsFrom == null ? last : k < r.cellsFrom ? Math.min(r.cellsFrom - 1, last) : k;
        while (j + 1 <= last && r.cellAt(j + 1) === code) j++;
        const x0 = px(span(model, k, scale)[0]), x1 = px(span(model, j, scale)[1]);
        ctx.fillStyle = code === PHASE.padding ? this.hatchFor(ctx) : COLORS[code];
        ctx.fillRect(x0, y, Math.max(x1 - x0, 0.5), Math.max(rowH - gap, 0.25));
        k = j + 1;
      }
      if (r.drafts.length) {
        this.drawDrafts(ctx, model, scale, r, y, rowH - gap, Math.max(r.startStep, kFrom), last, px);
      }
      if ((r.mine || r.lit) && rowH >= 3) { // typed in this tab, or named by the narration
        ctx.strokeStyle = r.lit ? "#f59e0b" : "#1d4ed8"; ctx.lineWidth = r.lit ? 2.5 : 1.5;
        const x0 = px(span(model, Math.max(r.startStep, kFrom), scale)[0]);
        ctx.strokeRect(x0, y + 0.5, px(span(model, last, scale)[1]) - x0, rowH - gap - 1);
      }
    }
    this.drawAxis(ctx, w, h, scale);
  }

  // Speculative decoding: a decode cell that verified a draft gets a white bar along its
  // foot, as long as the share of the guesses the model kept (full: all kept, and the
  // model's bonus token after them), or a dark stub when it kept none; it reads at any row
  // height, 256 rows included. Where the cell is tall and wide enough it also says
  // "accepted/guesses".
  drawDrafts(ctx, model, scale, r, y, cellH, from, last, px) {
    const barH = Math.max(1, Math.min(3, cellH / 3));
    const words = cellH >= 9;
    ctx.font = `${Math.min(cellH - 2, 11)}px system-ui, sans-serif`;
    ctx.textBaseline = "middle"; ctx.textAlign = "center";
    for (let k = from; k <= last; k++) {
      const d = r.drafts[k - r.startStep];
      if (!d) continue;
      const [guesses, accepted] = d;
      const [a, b] = span(model, k, scale), x0 = px(a), x1 = px(b), wide = x1 - x0;
      ctx.fillStyle = accepted ? "#ffffff" : "#111827";
      ctx.fillRect(x0, y + cellH - barH, Math.max(wide * Math.max(accepted / guesses, 0.2), 0.5), barH);
      const label = `${accepted}/${guesses}`;
      if (words && wide >= ctx.measureText(label).width + 2) {
        ctx.fillStyle = "#ffffff"; ctx.fillText(label, (x0 + x1) / 2, y + (cellH - barH) / 2);
      }
    }
    ctx.textAlign = "start";
  }

  hatchFor(ctx) { // padding: computed but useless, drawn striped
    if (!this.hatch) {
      const c = document.createElement("canvas");
      c.width = c.height = 6;
      const g = c.getContext("2d");
      g.fillStyle = COLORS[PHASE.padding]; g.fillRect(0, 0, 6, 6);
      g.strokeStyle = "#e5e7eb"; g.lineWidth = 1.5;
      g.beginPath(); g.moveTo(0, 6); g.lineTo(6, 0); g.stroke();
      this.hatch = ctx.createPattern(c, "repeat");
    }
    return this.hatch;
  }

  drawAxis(ctx, w, h, scale) {
    const y = h - AXIS_H;
    ctx.fillStyle = "#f3f4f6"; ctx.fillRect(0, y, w, AXIS_H);
    ctx.fillStyle = "#4b5563"; ctx.font = "10px system-ui, sans-serif"; ctx.textBaseline = "top";
    const range = Math.max(scale.x1 - scale.x0, 1e-9);
    const raw = range / 8, mag = 10 ** Math.floor(Math.log10(raw));
    const stepSize = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
    for (let v = Math.ceil(scale.x0 / stepSize) * stepSize; v <= scale.x1; v += stepSize) {
      const x = ((v - scale.x0) / range) * w;
      ctx.fillRect(x, y, 1, 4);
      const label = scale.mode === "iter" ? String(Math.round(v)) : `${+v.toFixed(1)}s`;
      ctx.fillText(label, Math.min(x + 2, w - 24), y + 4);
    }
  }

  rowAt(offsetY) {
    const i = Math.floor(offsetY / this.rowH);
    return i >= 0 && i < this.rows.length ? this.rows[i] : null;
  }
}
