// The KV block map: the device pool as a grid, each block coloured by the request that owns
// it, free blocks pale, and the CPU swap space as a strip below. With prefix caching, a
// block several requests share (reference count above 1) carries a dark frame and its
// count, and a free block that still holds a cached prefix (evictable) is drawn hatched;
// hovering a block says who holds it.
//
// Every step event carries every request's block ids after the step, live and in a trace
// alike, so the map shows where blocks really are (fragmentation included), and a replayed
// trace draws exactly the map the live page drew.

import { t } from "./i18n.js";
import { fitCanvas } from "./timeline.js";

const FREE = "#eef0f3";
const CACHED = "#d6e4f0"; // free, but still holding a cached prefix
const SHARED_FRAME = "#111827";
const RECENT_STEPS = 3; // a preemption stays flagged this many iterations

export function ownerColor(id) {
  return `hsl(${(id * 137.508) % 360}, 62%, ${48 + (id % 3) * 8}%)`;
}

// Device block id -> its holders (a block shared by a prefix has several; [] when free), the
// evictable cached blocks, and the owner of each swapped block, after `step`.
function layout(total, step) {
  const holders = Array.from({ length: total }, () => []);
  const swapped = [];
  for (const [rid, blocks] of Object.entries(step.blockTables)) for (const b of blocks) holders[b].push(Number(rid));
  for (const [rid, blocks] of Object.entries(step.swapTables)) for (const _ of blocks) swapped.push(Number(rid));
  return { holders, cached: new Set(step.cachedBlocks || []), swapped };
}

function hatch(ctx, x, y, s) {
  ctx.save();
  ctx.beginPath(); ctx.rect(x, y, s, s); ctx.clip();
  ctx.strokeStyle = "#7aa2c8"; ctx.lineWidth = 1;
  for (let d = -s; d < s; d += 4) { ctx.beginPath(); ctx.moveTo(x + d, y + s); ctx.lineTo(x + d + s, y); ctx.stroke(); }
  ctx.restore();
}

function drawBlock(ctx, x, y, s, holders, cached) {
  ctx.fillStyle = holders.length ? ownerColor(holders[0]) : cached ? CACHED : FREE;
  ctx.fillRect(x, y, s, s);
  if (cached && s > 4) hatch(ctx, x, y, s);
  if (holders.length > 1) {
    ctx.strokeStyle = SHARED_FRAME; ctx.lineWidth = Math.max(1, s / 8);
    ctx.strokeRect(x + ctx.lineWidth / 2, y + ctx.lineWidth / 2, s - ctx.lineWidth, s - ctx.lineWidth);
    if (s >= 14) {
      ctx.fillStyle = "#fff"; ctx.font = `bold ${Math.floor(s / 2)}px system-ui, sans-serif`;
      ctx.textAlign = "center"; ctx.textBaseline = "middle";
      ctx.fillText(String(holders.length), x + s / 2, y + s / 2);
      ctx.textAlign = "start";
    }
  }
}

// What a block is, in words, for the hover text.
function describeBlock(b, holders, cached) {
  if (holders.length > 1) return `${t("kvBlock")} ${b}: ${t("kvShared")} ×${holders.length} (#${holders.join(", #")})`;
  if (holders.length === 1) return `${t("kvBlock")} ${b}: #${holders[0]}`;
  return `${t("kvBlock")} ${b}: ${cached ? t("kvCached") : t("kvFree")}`;
}

// The hover text follows the pointer over the grid the last draw laid out.
function hover(canvas) {
  if (canvas.dataset.kvHover) return;
  canvas.dataset.kvHover = "1";
  canvas.addEventListener("mousemove", (ev) => {
    const g = canvas.kvGrid;
    if (!g) return;
    const b = Math.floor(ev.offsetY / g.size) * g.cols + Math.floor(ev.offsetX / g.size);
    const inGrid = ev.offsetX < g.cols * g.size && b >= 0 && b < g.holders.length;
    canvas.title = inGrid ? describeBlock(b, g.holders[b], g.cached.has(b)) : "";
  });
}

export function drawKvMap(canvas, model, cursor) {
  const { ctx, w, h } = fitCanvas(canvas);
  ctx.clearRect(0, 0, w, h);
  const step = model.stepAt(cursor);
  const total = (step && step.kvTotal) || model.kvTotal;
  if (!total) return null;
  const { holders, cached, swapped } = step
    ? layout(total, step) : { holders: Array.from({ length: total }, () => []), cached: new Set(), swapped: [] };
  const swapH = swapped.length ? 18 : 0;
  const gridH = h - swapH;
  const cols = Math.max(1, Math.ceil(Math.sqrt((total * w) / gridH)));
  const size = Math.min(w / cols, gridH / Math.ceil(total / cols));
  const pad = size > 5 ? 1 : 0;
  for (let b = 0; b < total; b++) {
    drawBlock(ctx, (b % cols) * size, Math.floor(b / cols) * size, size - pad, holders[b], cached.has(b));
  }
  canvas.kvGrid = { cols, size, holders, cached };
  hover(canvas);
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
  const used = holders.filter((h) => h.length).length;
  const shared = holders.filter((h) => h.length > 1).length;
  return { used, total, swapped: swapped.length, preempted: recent, shared, cached: cached.size };
}
