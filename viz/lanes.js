// The host's lane and the device's lane of the latest iterations, and how much of the
// device's time was idle (issue 35; docs/events.md: device_start, prepare_s, process_s).
//
// Each step event says where its work happened: the host schedules (schedule_s, from
// wall_start), the runner prepares its inputs (prepare_s, from device_start) and the device
// computes (forward_s + sample_s), then the host processes the outputs (process_s, ending at
// wall_end). Without overlap scheduling the two lanes take turns, and the device waits while
// the host works; with it, the next iteration's host work lies inside this one's device time.
//
// The lanes are drawn on the engine's own clock (busy_s: the seconds of its own steps), so
// the demo's other engine, stepped by the same thread, leaves no gap here (each step shifted
// by its own offset: with overlap, a step's device work that fell between two calls is drawn
// where its step ended); the idle share is 1 - the device's seconds / the own clock's
// seconds over the iterations drawn.

import { t } from "./i18n.js";
import { fitCanvas } from "./timeline.js";

const KEEP = 48; // iterations drawn
// The lanes' own colours (teal for the host, sky for the device): none is a phase's colour
// on the timeline or an engine's on the charts, so each colour keeps one meaning on the page.
const COLORS = { schedule: "#0f766e", process: "#5eead4", prepare: "#7dd3fc", device: "#0c4a6e" };
const records = new WeakMap(); // a panel's model -> its latest steps' lanes

// Called once per panel: the steps its model hears (live, replayed, or a joining page's
// recent history) are noted here first.
export function watchLanes(p) {
  const model = p.model, apply = model.apply.bind(model), applyView = model.applyView.bind(model);
  model.apply = (e) => {
    if (e.type === "reset") records.delete(model);
    if (e.type === "step" && e.device_start != null) note(model, e);
    apply(e);
  };
  model.applyView = (view) => {
    records.delete(model);
    for (const e of view.recent || []) if (e.device_start != null) note(model, e);
    applyView(view);
  };
}

function note(model, e) {
  const list = records.get(model) || [];
  const offset = e.busy_s != null ? e.busy_s - e.wall_end : 0; // engine clock -> own clock
  list.push({
    step: e.step, start: e.wall_start + offset, end: e.wall_end + offset, own: e.busy_s,
    schedule: e.schedule_s, prepare: e.prepare_s || 0, process: e.process_s || 0,
    deviceStart: e.device_start + offset, device: e.forward_s + e.sample_s,
  });
  if (list.length > 4 * KEEP) list.splice(0, list.length - KEEP);
  records.set(model, list);
}

// The device's idle share over `steps`: 1 - its seconds / the own clock's seconds (busy_s
// from before the first to the last: with overlap, a plan's device time between two of the
// engine's calls, while a demo paces it, is hidden work, not counted as the engine's time).
export function idleShare(steps, before) {
  if (!steps.length) return null;
  const first = steps[0];
  const from = before?.own ?? (first.own != null ? first.own - (first.end - first.start) : first.start);
  const span = (steps.at(-1).own ?? steps.at(-1).end) - from;
  const device = steps.reduce((sum, s) => sum + s.device, 0);
  return span > 0 ? Math.max(0, 1 - device / span) : null;
}

// Called where the page draws a panel: the lanes up to iteration `cursor`.
export function drawLanes(p, cursor) {
  const all = (records.get(p.model) || []).filter((s) => s.step <= cursor);
  const steps = all.slice(-KEEP), before = all.at(-KEEP - 1);
  const canvas = lanesCanvas(p.el);
  canvas.parentElement.hidden = !steps.length;
  if (!steps.length) return;
  const idle = idleShare(steps, before);
  p.el.dataset.deviceIdle = idle == null ? "" : idle.toFixed(3);
  const caption = canvas.previousElementSibling.querySelector("small");
  const text = idle == null ? "" :
    t("lanesIdle").replace("{idle}", `${Math.round(idle * 100)} %`).replace("{n}", steps.length);
  if (caption.textContent !== text) caption.textContent = text; // unchanged: no layout pass
  const { ctx, w, h } = fitCanvas(canvas);
  ctx.clearRect(0, 0, w, h);
  const left = 56, t0 = steps[0].start, span = Math.max(1e-9, steps.at(-1).end - t0);
  const x = (time) => left + ((time - t0) / span) * (w - left - 4);
  const lane = h / 2;
  ctx.font = "11px sans-serif";
  ctx.fillStyle = "#374151";
  ctx.fillText(t("lanesHost"), 4, lane * 0.5 + 4);
  ctx.fillText(t("lanesDevice"), 4, lane * 1.5 + 4);
  const box = (row, from, seconds, color) => {
    if (!(seconds > 0)) return;
    ctx.fillStyle = color;
    ctx.fillRect(x(from), row * lane + 4, Math.max(1, x(from + seconds) - x(from)), lane - 8);
  };
  for (const s of steps) {
    box(0, s.start, s.schedule, COLORS.schedule);
    box(0, s.end - s.process, s.process, COLORS.process);
    box(1, s.deviceStart, s.prepare, COLORS.prepare);
    box(1, s.deviceStart + s.prepare, s.device, COLORS.device);
  }
}

function lanesCanvas(el) {
  let canvas = el.querySelector("canvas.lanes");
  if (canvas) return canvas;
  const block = document.createElement("div");
  block.className = "lanes-block";
  block.innerHTML = `<h4><span data-i18n="lanes">${t("lanes")}</span> <small class="muted"></small></h4>`;
  canvas = document.createElement("canvas");
  canvas.className = "lanes";
  canvas.style.cssText = "width: 100%; height: 48px; display: block;";
  block.append(canvas);
  el.querySelector("canvas.timeline").after(block);
  return canvas;
}
