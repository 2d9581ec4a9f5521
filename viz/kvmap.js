// The KV block map: the device pool as a grid, each block coloured by the request that owns
// it, free blocks pale, and the CPU swap space as a strip below.
//
// Live, the server sends the real block ids after each step (a kv_map notice), so the map
// shows where blocks really are, fragmentation included. A trace carries only each
// request's block count, so in replay the owners are laid out in request order instead.

import { fitCanvas } from "./timeline.js";

const FREE = "#eef0f3";
const RECENT_STEPS = 3; // a preemption stays flagged this many iterations

export function ownerColor(id) {
  return `hsl(${(id * 137.508) % 360}, 62%, ${48 + (id % 3) * 8}%)`;
}

// block id -> owner (device) and a list of swapped owners, at `step`.
function layout(model, step) {
  const total = step.kvTotal || model.kvTotal;
  const owners = new Array(total).fill(-1);
  const swapped = [];
  if (step.kv) {
    for (const [rid, blocks] of Object.entries(step.kv.device)) for (const b of blocks) owners[b] = Number(rid);
    for (const [rid, blocks] of Object.entries(step.kv.swap)) for (const _ of blocks) swapped.push(Number(rid));
    return { owners, swapped, exact: true };
  }
  let b = 0;
  for (const [rid, n] of step.rows) {
    const r = model.reqs.get(rid);
    if (r && r.endStep === step.index) continue; // finished here: its blocks went back
    for (let i = 0; i < n && b < total; i++) owners[b++] = rid;
  }
  while (b < Math.min(step.kvUsed, total)) owners[b++] = -2; // held by someone not scheduled
  for (let i = 0; i < step.kvSwapped; i++) swapped.push(-2);
  return { owners, swapped, exact: false };
}

export function drawKvMap(canvas, model, cursor) {
  const { ctx, w, h } = fitCanvas(canvas);
  ctx.clearRect(0, 0, w, h);
  const step = model.stepAt(cursor);
  const total = (step && step.kvTotal) || model.kvTotal;
  if (!total) return null;
  const { owners, swapped, exact } = step ? layout(model, step) : { owners: new Array(total).fill(-1), swapped: [], exact: true };
  const swapH = swapped.length ? 18 : 0;
  const gridH = h - swapH;
  const cols = Math.max(1, Math.ceil(Math.sqrt((total * w) / gridH)));
  const size = Math.min(w / cols, gridH / Math.ceil(total / cols));
  const pad = size > 5 ? 1 : 0;
  for (let b = 0; b < total; b++) {
    const o = owners[b];
    ctx.fillStyle = o === -1 ? FREE : o === -2 ? "#6b7280" : ownerColor(o);
    ctx.fillRect((b % cols) * size, Math.floor(b / cols) * size, size - pad, size - pad);
  }
  if (swapped.length) { // the CPU swap space: one small cell per swapped block
    const s = Math.min(12, w / swapped.length);
    swapped.forEach((o, i) => {
      ctx.fillStyle = o < 0 ? "#7c3aed" : ownerColor(o);
      ctx.fillRect(i * s, gridH + 4, Math.max(s - 1, 0.5), 12);
      ctx.strokeStyle = "#7c3aed"; ctx.strokeRect(i * s + 0.5, gridH + 4.5, Math.max(s - 2, 0.5), 11);
    });
  }
  // preemptions of the last few iterations: flagged on the map, since their blocks just went
  const recent = [];
  for (let i = model.stepPos(cursor); i >= 0 && model.steps[i].index > (step?.index ?? 0) - RECENT_STEPS; i--) {
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
  return { used, total, swapped: swapped.length, exact, preempted: recent };
}
