// The KV block map: the device pool as a grid, each block coloured by the request that owns
// it, free blocks pale, and the CPU swap space as a strip below.
//
// Every step event carries every request's block ids after the step, live and in a trace
// alike, so the map shows where blocks really are (fragmentation included), and a replayed
// trace draws exactly the map the live page drew.

import { fitCanvas } from "./timeline.js";

const FREE = "#eef0f3";
const RECENT_STEPS = 3; // a preemption stays flagged this many iterations

export function ownerColor(id) {
  return `hsl(${(id * 137.508) % 360}, 62%, ${48 + (id % 3) * 8}%)`;
}

// Device block id -> owner (-1: free), and the owner of each swapped block, after `step`.
function layout(total, step) {
  const owners = new Array(total).fill(-1);
  const swapped = [];
  for (const [rid, blocks] of Object.entries(step.blockTables)) for (const b of blocks) owners[b] = Number(rid);
  for (const [rid, blocks] of Object.entries(step.swapTables)) for (const _ of blocks) swapped.push(Number(rid));
  return { owners, swapped };
}

export function drawKvMap(canvas, model, cursor) {
  const { ctx, w, h } = fitCanvas(canvas);
  ctx.clearRect(0, 0, w, h);
  const step = model.stepAt(cursor);
  const total = (step && step.kvTotal) || model.kvTotal;
  if (!total) return null;
  const { owners, swapped } = step ? layout(total, step) : { owners: new Array(total).fill(-1), swapped: [] };
  const swapH = swapped.length ? 18 : 0;
  const gridH = h - swapH;
  const cols = Math.max(1, Math.ceil(Math.sqrt((total * w) / gridH)));
  const size = Math.min(w / cols, gridH / Math.ceil(total / cols));
  const pad = size > 5 ? 1 : 0;
  for (let b = 0; b < total; b++) {
    const o = owners[b];
    ctx.fillStyle = o === -1 ? FREE : ownerColor(o);
    ctx.fillRect((b % cols) * size, Math.floor(b / cols) * size, size - pad, size - pad);
  }
  if (swapped.length) { // the CPU swap space: one small cell per swapped block
    const s = Math.min(12, w / swapped.length);
    swapped.forEach((o, i) => {
      ctx.fillStyle = ownerColor(o);
      ctx.fillRect(i * s, gridH + 4, Math.max(s - 1, 0.5), 12);
      ctx.strokeStyle = "#7c3aed"; ctx.strokeRect(i * s + 0.5, gridH + 4.5, Math.max(s - 2, 0.5), 11);
    });
  }
  // preemptions of the last few iterations: flagged on the map, since their blocks just went
  const recent = [];
  for (let i = model.stepPos(cursor); i >= 0 && model.steps[i].step > (step?.step ?? 0) - RECENT_STEPS; i--) {
    for (const [rid, mode] of model.steps[i].preempted) recent.push(`#${rid} ${mode}`);
  }
  if (recent.length) {
    ctx.font = "bold 12px system-ui, sans-serif";
    const text = `⚠ ${recent.join(", ")}`;
    const tw = ctx.measureText(text).width + 10;
    ctx.fillStyle = "rgba(220,38,38,0.92)"; ctx.fillRect(w - tw, 0, tw, 18);
    ctx.fillStyle = "#fff"; ctx.textBaseline = "middle"; ctx.fillText(text, w - tw + 5, 9);
  }
  const used = owners.filter((o) => o !== -1).length;
  return { used, total, swapped: swapped.length, preempted: recent };
}
