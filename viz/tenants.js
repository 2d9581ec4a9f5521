// The fair queue by tenant (minicb serve --tenant ..., minicb/server/tenant_gate.py): who is
// waiting for a replica, how many uncached prompt tokens that is, how many each tenant has
// had dispatched, and how many were refused and why (a full queue, over its token rate).
// In serve mode the page asks GET /fleet/tenants once a second; a server without a fair
// queue answers {"tenants": null} once, and the panel never appears.

const POLL_MS = 1000;
const KEY = "minicb.key"; // the tab's key, kept by socket.js
let box = null;
let watching = false;

function el(tag, text, attrs = {}) {
  const node = document.createElement(tag);
  if (text != null) node.textContent = text;
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function refusals(rejected) {
  const words = { queue_full: "queue full", rate_limited: "over rate", too_large: "too large" };
  const parts = Object.entries(rejected).filter(([, n]) => n > 0).map(([r, n]) => `${n} ${words[r] || r}`);
  return parts.length ? parts.join(", ") : "0";
}

function draw(snap) {
  if (!box) {
    box = el("section", null, { id: "tenants", class: "card" });
    box.style.marginBottom = "8px";
    document.getElementById("panels").before(box);
  }
  const head = el("h3", "Fair queue by tenant");
  head.append(el("span", `  (in flight ${snap.in_flight} of ${snap.capacity}; band 0 first)`, { class: "muted" }));
  const table = el("table", null, { class: "tenants-table" });
  table.style.borderCollapse = "collapse";
  const cols = ["tenant", "band", "queued", "queued tokens", "dispatched", "refused", "rate (tok/s)"];
  const tr = el("tr");
  for (const c of cols) {
    const cell = el("th", c);
    cell.style.padding = "1px 10px 1px 0";
    cell.style.textAlign = "left";
    tr.append(cell);
  }
  table.append(tr);
  const rows = Object.entries(snap.tenants).sort((a, b) => a[1].priority - b[1].priority || a[0].localeCompare(b[0]));
  for (const [name, t] of rows) {
    const row = el("tr", null, { "data-tenant": name });
    const rate = t.tokens_per_s == null ? "unlimited" : String(t.tokens_per_s);
    for (const v of [name, t.priority, t.queued, t.queued_tokens, t.dispatched, refusals(t.rejected), rate]) {
      const cell = el("td", String(v));
      cell.style.padding = "1px 10px 1px 0";
      row.append(cell);
    }
    table.append(row);
  }
  box.replaceChildren(head, table);
}

// Poll the server's fair queue; stop for good if it has none. Once per page (a new hello
// after a reconnect finds it already watching).
export function watchTenants() {
  if (watching) return;
  watching = true;
  const tick = async () => {
    const key = sessionStorage.getItem(KEY);
    const headers = key ? { Authorization: `Bearer ${key}` } : {};
    try {
      const reply = await fetch("/fleet/tenants", { headers, cache: "no-store" });
      if (reply.ok) {
        const snap = await reply.json();
        if (snap.tenants == null) return; // no fair queue on this server
        draw(snap);
      }
    } catch (err) {
      // the server is away (restarting): try again next tick
    }
    setTimeout(tick, POLL_MS);
  };
  tick();
}
