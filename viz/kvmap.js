// The KV block map: the device pool as a grid, each block coloured by the request that owns
// it, free blocks pale, and the CPU swap space as a strip below. With prefix caching, a
// block several requests share (reference count above 1) carries a dark frame and its
// count, and a free block that still holds a cached prefix (evictable) is drawn hatched;
// a block a request holds but has not written yet (a KV reservation, or static batching's
// prompt + max_tokens up front) is drawn in a pale shade of its owner's colour; hovering a
// block says who holds it.
//
// The model keeps the map block by block (its KvState, changed by each step's kv_ops, live
// and in a trace alike), so the map shows where blocks really are (fragmentation
// included), and a replayed trace draws exactly the map the live page drew. A pool too
// large to send block by block (a simulated GPU's tens of thousands) comes from the server
// folded into cells of several blocks (kv_grid): each cell takes the colour of the request
// holding most of its blocks, and the caption says how many blocks a cell stands for.

import { t } from "./i18n.js";
import { fitCanvas } from "./timeline.js";

const FREE = "#eef0f3";
const CACHED = "#d6e4f0"; // free, but still holding a cached prefix
const SHARED_FRAME = "#111827";
const RECENT_STEPS = 3; // a preemption stays flagged this many iterations

const RESERVED_LIGHTNESS = 86; // a held block not written yet: its owner's hue, pale
const lightness = (id, reserved) => (reserved ? RESERVED_LIGHTNESS : 48 + (id % 3) * 8);

export function ownerColor(id, reserved = false) {
  return `hsl(${(id * 137.508) % 360}, 62%, ${lightness(id, reserved)}%)`;
}

// ownerColor as [r, g, b], for the pixel path (cached: a few hundred owners at a time).
const RGB = new Map();
function ownerRgb(id, reserved) {
  const key = 2 * id + (reserved ? 1 : 0);
  let rgb = RGB.get(key);
  if (!rgb) {
    const h = (id * 137.508) % 360, s = 0.62, l = lightness(id, reserved) / 100;
    const f = (n) => { const k = (n + h / 30) % 12; return Math.round(255 * (l - s * Math.min(l, 1 - l) * Math.max(-1, Math.min(k - 3, 9 - k, 1)))); };
    rgb = [f(0), f(8), f(4)];
    if (RGB.size > 4096) RGB.clear();
    RGB.set(key, rgb);
  }
  return rgb;
}

// After `step`: each device block's first holder (-1: free), number of holders (a block
// shared by a prefix has several) and whether it is held but not written yet (reserved),
// the evictable cached blocks, and the owner of each swapped block. Typed arrays: a
// simulated GPU's pool has tens of thousands of blocks.
function layout(total, kv, written) {
  const owner = new Int32Array(total).fill(-1), count = new Uint16Array(total);
  const reserved = new Uint8Array(total), swapped = [];
  for (const [id, blocks] of kv.tables) {
    const done = written?.[id] ?? blocks.length;
    blocks.forEach((b, i) => {
      if (count[b]++ === 0) owner[b] = id;
      if (i >= done) reserved[b] = 1; // never a shared block: those are full prefixes
    });
  }
  for (const [id, blocks] of kv.swaps) for (const _ of blocks) swapped.push(id);
  return { owner, count, reserved, cached: kv.cached, swapped };
}

// The server's folded map as the same layout, one entry per cell (-1 free, -2 cached).
function gridLayout(grid) {
  const n = grid.cells.length, owner = Int32Array.from(grid.cells), count = new Uint16Array(n);
  const cached = new Set();
  for (let i = 0; i < n; i++) { if (owner[i] >= 0) count[i] = 1; else if (owner[i] === -2) cached.add(i); }
  return { owner, count, reserved: new Uint8Array(n), cached, swapped: [] };
}

// Who holds block b in `kv` (for the hover text only).
function holdersOf(kv, b) {
  return [...kv.tables].filter(([, blocks]) => blocks.includes(b)).map(([rid]) => rid);
}

function hatch(ctx, x, y, s) {
  ctx.save();
  ctx.beginPath(); ctx.rect(x, y, s, s); ctx.clip();
  ctx.strokeStyle = "#7aa2c8"; ctx.lineWidth = 1;
  for (let d = -s; d < s; d += 4) { ctx.beginPath(); ctx.moveTo(x + d, y + s); ctx.lineTo(x + d + s, y); ctx.stroke(); }
  ctx.restore();
}

function drawBlock(ctx, x, y, s, owner, count, reserved, cached) {
  ctx.fillStyle = count ? ownerColor(owner, reserved) : cached ? CACHED : FREE;
  ctx.fillRect(x, y, s, s);
  if (cached && s > 4) hatch(ctx, x, y, s);
  if (count > 1) {
    ctx.strokeStyle = SHARED_FRAME; ctx.lineWidth = Math.max(1, s / 8);
    ctx.strokeRect(x + ctx.lineWidth / 2, y + ctx.lineWidth / 2, s - ctx.lineWidth, s - ctx.lineWidth);
    if (s >= 14) {
      ctx.fillStyle = "#fff"; ctx.font = `bold ${Math.floor(s / 2)}px system-ui, sans-serif`;
      ctx.textAlign = "center"; ctx.textBaseline = "middle";
      ctx.fillText(String(count), x + s / 2, y + s / 2);
      ctx.textAlign = "start";
    }
  }
}

// Blocks smaller than PIXEL_PATH css pixels (a GPU's pool) are painted pixel by pixel into
// one ImageData: tens of thousands of fillRect calls a frame would stall the page.
const PIXEL_PATH = 4;
const FREE_RGB = [0xee, 0xf0, 0xf3], CACHED_RGB = [0xd6, 0xe4, 0xf0], SHARED_RGB = [0x11, 0x18, 0x27];
const packed = ([r, g, b]) => (0xff << 24) | (b << 16) | (g << 8) | r; // RGBA bytes, little-endian
function paintPixels(ctx, grid, total, gridH) {
  const dpr = window.devicePixelRatio || 1;
  const W = Math.max(1, Math.floor(grid.cols * grid.size * dpr)), H = Math.max(1, Math.floor(gridH * dpr));
  const color = new Uint32Array(total); // each block's colour, once, then copied per pixel
  const free = packed(FREE_RGB), cachedColor = packed(CACHED_RGB), shared = packed(SHARED_RGB);
  for (let b = 0; b < total; b++) {
    const n = grid.count[b];
    color[b] = n > 1 ? shared : n ? packed(ownerRgb(grid.owner[b], grid.reserved[b])) : free;
  }
  for (const b of grid.cached) if (b < total && !grid.count[b]) color[b] = cachedColor;
  const img = ctx.createImageData(W, H), px = new Uint32Array(img.data.buffer), cell = grid.size * dpr;
  const colOf = new Int32Array(W);
  for (let x = 0; x < W; x++) colOf[x] = Math.min(grid.cols - 1, Math.floor(x / cell));
  for (let y = 0; y < H; y++) {
    const rowBase = Math.floor(y / cell) * grid.cols, line = y * W;
    if (rowBase >= total) break;
    for (let x = 0; x < W; x++) {
      const b = rowBase + colOf[x];
      if (b < total) px[line + x] = color[b];
    }
  }
  ctx.putImageData(img, 0, 0);
}

// What a block is, in words, for the hover text.
function describeBlock(b, holders, reserved, cached) {
  if (holders.length > 1) return `${t("kvBlock")} ${b}: ${t("kvShared")} ×${holders.length} (#${holders.join(", #")})`;
  if (holders.length === 1) return `${t("kvBlock")} ${b}: #${holders[0]}` + (reserved ? ` (${t("kvReserved")})` : "");
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
    const inGrid = ev.offsetX < g.cols * g.size && b >= 0 && b < g.count.length;
    if (!inGrid) canvas.title = "";
    else if (g.per > 1) canvas.title = `${t("kvCell")} ${b} (${g.per} ${t("kvBlocks")}): ${g.owner[b] >= 0 ? `#${g.owner[b]}` : t(g.owner[b] === -2 ? "kvCached" : "kvFree")}`;
    else canvas.title = describeBlock(b, g.kv ? holdersOf(g.kv, b) : [], g.reserved[b], g.cached.has(b));
  });
}

export function drawKvMap(canvas, model, cursor) {
  // The same iteration on a canvas of the same size draws the same map: keep it.
  const key = `${model.t0}|${cursor}|${model.kvTotal}|${model.kvGrid?.cells.length}|${model.version}|${canvas.clientWidth}x${canvas.clientHeight}`;
  if (canvas.kvKey === key) return canvas.kvFigures;
  canvas.kvKey = key;
  canvas.kvFigures = paint(canvas, model, cursor);
  return canvas.kvFigures;
}

function paint(canvas, model, cursor) {
  const { ctx, w, h } = fitCanvas(canvas);
  ctx.clearRect(0, 0, w, h);
  const step = model.stepAt(cursor);
  const blocks = (step && step.kvTotal) || model.kvTotal;
  if (!blocks) return null;
  // a large pool, live: the server's folded map; else every block from the model's map
  const folded = model.kvGrid && cursor >= model.lastStep ? model.kvGrid : null;
  const kv = folded ? null : model.kvAt(cursor);
  const total = folded ? folded.cells.length : blocks, per = folded ? folded.per : 1;
  const { owner, count, reserved, cached, swapped } = folded ? gridLayout(folded) : layout(total, kv, step?.written);
  const swapH = swapped.length ? 18 : 0;
  const gridH = h - swapH;
  const cols = Math.max(1, Math.ceil(Math.sqrt((total * w) / gridH)));
  const size = Math.min(w / cols, gridH / Math.ceil(total / cols));
  const grid = { cols, size, owner, count, reserved, cached, kv, per };
  if (size < PIXEL_PATH) paintPixels(ctx, grid, total, gridH);
  else {
    const pad = size > 5 ? 1 : 0;
    for (let b = 0; b < total; b++) {
      drawBlock(ctx, (b % cols) * size, Math.floor(b / cols) * size, size - pad, owner[b], count[b], reserved[b], cached.has(b));
    }
  }
  canvas.kvGrid = grid;
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
  let used = 0, shared = 0;
  for (let b = 0; b < total; b++) { used += count[b] > 0; shared += count[b] > 1; }
  if (folded) { // the step's own figures: a cell is one request's, not a count of blocks
    return { used: step?.kvUsed ?? 0, total: blocks, swapped: step?.kvSwapped ?? 0, preempted: recent, shared: 0, cached: step?.kvCached ?? 0, host: step?.kvHostCached ?? 0, per };
  }
  // host: the prefix cache's second tier (kv_offload_blocks), blocks in host memory, counted
  return { used, total, swapped: swapped.length, preempted: recent, shared, cached: cached.size, host: step?.kvHostCached ?? 0, per };
}
