// The fleet on the page (minicb serve --replicas N): each replica is an engine of the
// server, so it gets its own panel, side by side as static and continuous do in the demo;
// this module titles those panels by replica and draws the router's decisions beside them,
// newest first, each with its reason in words as the server sent it ("routed" events,
// minicb/fleet/fleet.py). Nothing here runs unless a routed event arrives.

const KEEP = 12; // decisions listed: the latest ones
const decisions = []; // routed events, newest first
const counts = new Map(); // replica -> requests routed there since this page opened
let box = null;

// A request as the fleet names it: "r1·4" is request 4 of replica 1. Each replica numbers
// its own requests from 0, so a bare "request 4" would name one on every replica.
function fleetRequest(replica, id) {
  return `r${replica}\u00b7${id}`;
}

// "replica 0" for a replica's panel (its description carries its index), else "".
export function fleetTitle(p) {
  const r = p.model.info && p.model.info.replica;
  return r == null ? "" : `replica ${r}`;
}

// One routed event, from the frame of the replica it went to. Frames come per replica, so
// two replicas' decisions can arrive out of order: they are kept by time (the fleet's
// clock), newest first.
export function noteRouted(e) {
  decisions.unshift(e);
  decisions.sort((a, b) => b.time - a.time); // stable: equal times keep arrival order
  if (decisions.length > KEEP) decisions.length = KEEP;
  counts.set(e.replica, (counts.get(e.replica) || 0) + 1);
  draw();
}

function el(tag, text, attrs = {}) {
  const node = document.createElement(tag);
  if (text != null) node.textContent = text;
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function draw() {
  if (!box) {
    box = el("section", null, { id: "router", class: "card" });
    box.style.marginBottom = "8px";
    document.getElementById("panels").before(box);
  }
  const spread = [...counts].sort((a, b) => a[0] - b[0]).map(([r, n]) => `replica ${r}: ${n}`);
  const head = el("h3", `Router: ${decisions[0].policy}`);
  head.append(el("span", `  (routed so far: ${spread.join(", ")})`, { class: "muted" }));
  const list = el("ol", null, { class: "router-decisions" });
  list.style.margin = "0";
  list.style.paddingLeft = "18px";
  for (const e of decisions) {
    const item = el("li", null, { "data-replica": String(e.replica) });
    const who = fleetRequest(e.replica, e.request_id);
    item.append(el("b", `request ${who} \u2192 replica ${e.replica}`, { "data-request": who }));
    item.append(el("span", ` \u2014 ${e.reason}`, { class: "router-reason" }));
    list.append(item);
  }
  box.replaceChildren(head, list);
}
