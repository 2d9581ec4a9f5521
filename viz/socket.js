// The page's connection: the WebSocket to /ws, the key a guarded server asks for, and the
// server's messages handed on one at a time, in the order they were sent.
//
// A server with a key asks for it ("auth_required"): the page sends the one it keeps for
// this tab (from a shared link's ?key=, or asked once), and forgets it when refused (the
// server closes with 4401), then connects again and asks anew.

import { applyLabels, t } from "./i18n.js";

const $ = (id) => document.getElementById(id);

// Kept in sessionStorage: for this tab only, gone when it closes. A ?key= in the address is
// moved there and taken out of the address bar (so it is not shared by a screenshot).
const KEY = "minicb.key";
const CLOSE_UNAUTHORIZED = 4401;

export function takeKeyFromAddress() {
  const url = new URL(location.href);
  const key = url.searchParams.get("key");
  if (key == null) return;
  sessionStorage.setItem(KEY, key);
  url.searchParams.delete("key");
  history.replaceState(null, "", url);
}

function sendKey(ws) {
  let key = sessionStorage.getItem(KEY);
  if (key == null) {
    key = window.prompt(t("askKey"));
    if (key == null) { ws.close(); return; } // no key given: stay disconnected
    sessionStorage.setItem(KEY, key);
  }
  ws.send(JSON.stringify({ type: "auth", key }));
}

function setStatus(key, cls) { $("status").dataset.i18n = key; $("status").className = `badge ${cls}`; applyLabels(); }

// Opens /ws. `opened(ws)` is told of each socket (a refused key opens a new one);
// `handle(msg, size)` gets every message but the key's request, `size` its bytes on the wire.
export function connect(opened, handle) {
  const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`);
  opened(ws);
  ws.onopen = () => setStatus("connected", "live");
  ws.onclose = (ev) => {
    if (ev.code === CLOSE_UNAUTHORIZED) { // a wrong key: forget it, ask again
      sessionStorage.removeItem(KEY);
      setStatus("badKey", "down");
      setTimeout(() => connect(opened, handle), 200);
      return;
    }
    setStatus("disconnected", "down");
  };
  // The engines' state (frames, compressed once for every viewer; views, the hello, a
  // replay) comes as binary messages of zlib-compressed JSON; anything else as JSON text.
  // Decompressing takes a while, so each message is handled after the one before it: a
  // reply or a narration never overtakes the frames sent first.
  let handled = Promise.resolve();
  ws.onmessage = (ev) => {
    const text = typeof ev.data === "string" ? ev.data : inflate(ev.data);
    const size = typeof ev.data === "string" ? ev.data.length : ev.data.size;
    handled = handled.then(() => text).then((body) => {
      const msg = JSON.parse(body);
      if (msg.type === "auth_required") sendKey(ws);
      else handle(msg, size);
    }).catch((err) => console.error(err)); // one bad message must not stop the ones after it
  };
}

function inflate(blob) {
  return new Response(blob.stream().pipeThrough(new DecompressionStream("deflate"))).text();
}
