// Disaggregated serving on the page (minicb serve --disaggregate P:D): each prefill and
// decode engine is an engine of the server with its own panel; this module titles those
// panels by role and draws every KV transfer between them, in a strip placed between the
// first two panels' timelines: one row per request, an arrow from the prefill engine to
// the decode engine, its blocks, bytes and seconds, and while it waits, why ("kv_transfer"
// events, minicb/fleet/kv_link.py). Nothing here runs unless a kv_transfer event arrives.

const KEEP = 14; // transfers listed: the latest ones
const rows = new Map(); // "decode0/3" -> the latest event of that request's transfer
let strip = null;

// "prefill engine 0" / "decode engine 1" for a disaggregated engine's panel, else "".
export function transferTitle(p) {
  const m = /^(prefill|decode)(\d+)$/.exec(p.name);
  return m ? `${m[1]} engine ${m[2]}` : "";
}

function el(tag, text, attrs = {}) {
  const node = document.createElement(tag);
  if (text != null) node.textContent = text;
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

// Milliseconds, to three places below one (NVLink moves a short prompt's KV in microseconds).
function ms(seconds) {
  const value = seconds * 1e3;
  return value.toFixed(value < 1 ? 3 : 1);
}

function kB(bytes) {
  return bytes >= 1e6 ? `${(bytes / 1e6).toFixed(2)} MB` : `${(bytes / 1e3).toFixed(1)} kB`;
}

// One kv_transfer event (from the decode engine's frame): the request's row takes its
// latest status, and the strip is drawn again.
export function noteTransfer(e, panels) {
  const key = `${e.to_engine}/${e.request_id}`;
  rows.delete(key); // re-inserted: the newest change last
  rows.set(key, e);
  while (rows.size > KEEP) rows.delete(rows.keys().next().value);
  draw(panels);
}

// An engine was rebuilt (another lesson, new settings): its transfers are gone, and the
// strip with them; the panels take the whole width again.
export function forgetTransfers() {
  rows.clear();
  if (strip && strip.isConnected) {
    strip.remove();
    document.getElementById("panels").style.gridTemplateColumns = "";
  }
}

function place(panels) {
  if (strip && strip.isConnected) return;
  strip = el("section", null, { id: "transfers", class: "card" });
  const grid = document.getElementById("panels");
  grid.style.gridTemplateColumns = "minmax(360px, 1fr) 250px minmax(360px, 1fr)";
  if (panels.length > 0) panels[0].el.after(strip);
  else grid.append(strip);
}

function draw(panels) {
  place(panels);
  const all = [...rows.values()];
  const done = all.filter((e) => e.status === "done");
  const bytes = done.reduce((s, e) => s + e.bytes, 0);
  const head = el("h3", "KV transfers");
  head.append(el("div", `${done.length} done, ${kB(bytes)} moved`, { class: "muted" }));
  const most = Math.max(1, ...all.map((e) => e.bytes || e.blocks));
  const list = el("ol", null, { class: "transfer-list" });
  for (const e of all.slice().reverse()) {
    const item = el("li", null, { "data-status": e.status, "data-request": String(e.request_id) });
    item.append(el("b", `${e.from_engine} \u2192 ${e.to_engine}`));
    item.append(el("span", ` request ${e.to_engine}\u00b7${e.request_id}`, { class: "muted" }));
    const bar = el("div", null, { class: "transfer-bar" });
    bar.style.width = `${Math.max(6, (100 * (e.bytes || e.blocks)) / most)}%`;
    item.append(bar);
    const what = e.status === "done"
      ? `${e.blocks} blocks, ${kB(e.bytes)} in ${ms(e.seconds)} ms`
      : `${e.status}: ${e.reason}`;
    item.append(el("div", what, { class: "transfer-what" }));
    list.append(item);
  }
  strip.replaceChildren(head, list);
}
