// The control bar and forms: each sends one JSON control over the WebSocket; replies
// (ack or error) come back to handleReply. The server checks every field again.

import { t, translateReason } from "./i18n.js";

const $ = (id) => document.getElementById(id);
let send = () => {};
let nextId = 1;
const pending = new Map(); // control id -> what to do with its ack

function control(msg, onAck) {
  const id = nextId++;
  if (onAck) pending.set(id, onAck);
  send({ ...msg, id });
}

export function showMessage(text, isError = false) {
  const el = $("message");
  el.textContent = text;
  el.classList.toggle("error", isError);
}

// The card of the last single step's decisions belongs to the engines that took it: a
// rebuild (new settings, another simulated GPU or lesson) empties it.
export function clearDecisions() {
  $("decisions").replaceChildren("–");
}

function renderDecisions(reply, app) {
  const box = $("decisions");
  box.replaceChildren();
  const head = document.createElement("div");
  head.className = "muted";
  head.textContent = `${t("round")} ${reply.round}`;
  box.append(head);
  for (const engine of app.panels.map((p) => p.name)) {
    const lines = reply.explain?.[engine];
    const h = document.createElement("h4");
    h.textContent = t(app.panels.find((p) => p.name === engine)?.model.batching || engine);
    const ul = document.createElement("ul");
    for (const line of lines == null ? [t("idleEngine")] : lines.length ? lines : [t("noDecisions")]) {
      const li = document.createElement("li");
      li.textContent = translateReason(line);
      li.title = line; // the engine's own words, always one hover away
      ul.append(li);
    }
    box.append(h, ul);
  }
}

export function handleReply(reply, app) {
  if (reply.type === "error") {
    pending.delete(reply.id);
    showMessage(`${t("error")}: ${translateReason(reply.message)}`, true);
    return;
  }
  const onAck = pending.get(reply.id);
  pending.delete(reply.id);
  if ("paused" in reply) app.setPaused(reply.paused);
  if (reply.control === "step") renderDecisions(reply, app);
  if (onAck) onAck(reply);
  showMessage("");
}

export function fillSettings(config) {
  for (const key of ["max_num_seqs", "max_num_batched_tokens", "num_kv_blocks", "preemption_mode", "policy", "static_order", "speculative"]) {
    const el = $(`st-${key}`);
    if (el && config[key] != null) el.value = config[key];
  }
  $("st-enable_chunked_prefill").checked = !!config.enable_chunked_prefill;
  $("st-enable_prefix_caching").checked = !!config.enable_prefix_caching;
}

export function fillWorkload(w) {
  if (!w) return;
  $("wl-preset").value = w.preset; $("wl-rate").value = w.rate;
  $("wl-lengths").value = w.lengths; $("wl-count").value = w.count;
}

// The simulated-GPU picker: the catalogue's GPUs and models (hello's "simulation"; null
// hides it: a real model, a lesson, whose scenario fixes the runner, or a viewer). Choosing
// one rebuilds both engines on that GPU.
export function fillSimulation(sim) {
  $("sim-picker").hidden = !sim;
  if (!sim) return;
  for (const [id, names, current] of [["sim-gpu", sim.gpus, sim.gpu], ["sim-model", sim.models, sim.model]]) {
    $(id).replaceChildren(...names.map((name) => new Option(name, name, false, name === current)));
  }
  $("sim-speed").value = sim.speed ?? 1;
}

export function wireControls(app) {
  send = app.send;
  $("pause").onclick = () => control({ type: "pause" });
  $("resume").onclick = () => control({ type: "resume" });
  $("step").onclick = () => control({ type: "step" });
  $("delay").oninput = () => { $("delay-out").value = `${$("delay").value} ms`; };
  $("delay").onchange = () => control({ type: "speed", delay_s: Number($("delay").value) / 1000 });
  $("workload-form").onsubmit = (ev) => {
    ev.preventDefault();
    control({
      type: "workload", preset: $("wl-preset").value, lengths: $("wl-lengths").value,
      rate: Number($("wl-rate").value), count: Number($("wl-count").value),
    });
  };
  $("settings-form").onsubmit = (ev) => {
    ev.preventDefault();
    const msg = { type: "settings", enable_chunked_prefill: $("st-enable_chunked_prefill").checked,
      enable_prefix_caching: $("st-enable_prefix_caching").checked,
      preemption_mode: $("st-preemption_mode").value, policy: $("st-policy").value,
      static_order: $("st-static_order").value, speculative: $("st-speculative").value };
    for (const key of ["max_num_seqs", "max_num_batched_tokens", "num_kv_blocks"]) {
      const v = $(`st-${key}`).value;
      if (v !== "") msg[key] = Number(v);
    }
    control(msg, (reply) => showMessage(`${t("rebuild")}: ${reply.engines.map((e) => e.name).join(", ")}`));
  };
  $("sim-gpu").onchange = $("sim-model").onchange = () => {
    control({ type: "simulate", gpu: $("sim-gpu").value, model: $("sim-model").value },
      () => showMessage(`${t("simSwitched")}: ${$("sim-gpu").value} · ${$("sim-model").value}`));
  };
  $("sim-speed").onchange = () => control({ type: "pace", speed: Number($("sim-speed").value) });
  $("prompt-form").onsubmit = (ev) => {
    ev.preventDefault();
    const text = $("prompt-text").value;
    control({ type: "prompt", text, target: $("prompt-target").value, max_tokens: Number($("prompt-max").value) },
      (reply) => { app.markMine(reply.ids, text); $("prompt-text").value = ""; });
  };
}
