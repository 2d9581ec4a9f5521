// PanelModel: one engine's history, rebuilt from its events alone.
//
// The same code reads a live WebSocket and a recorded trace, so live and replay draw the
// same rows and the same KV map. Each StepEvent is self-contained for states (it lists who
// ran in which phase and who was admitted, preempted, swapped or finished) and for the KV
// pool (every request's block ids after the step), so cells and maps are filled from it;
// the request events add what steps lack: prompts, arrival times, text, first-token times.
// A "reset" event (the engine was rebuilt with new settings) starts the panel afresh.

export const PHASE = { waiting: 0, prefill: 1, decode: 2, padding: 3, preempted: 4, swapped: 5 };
export const PHASE_NAMES = ["waiting", "prefill", "decode", "padding", "preempted", "swapped"];

class Req {
  constructor(id, startStep) {
    this.id = id;
    this.startStep = startStep; // first iteration it could have run in
    this.endStep = null; // last iteration it was in the batch (null: still here)
    // Phase code per iteration from cellsFrom, the first iteration it did anything but wait
    // (null: it has only waited). The wait before it is implied: ten thousand queued
    // requests then cost nothing per iteration.
    this.cells = [];
    this.cellsFrom = null;
    this.produced = []; // tokens a speculative decode cell produced (1 + accepted drafts), by k - startStep
    this.state = PHASE.waiting; // what it is doing when not scheduled
    this.arrival = null; // seconds on the engine's clock
    this.arrivalOwn = null; // seconds on the side's own clock (PanelModel.ownNow)
    this.prompt = null;
    this.numPrompt = null;
    this.maxTokens = null;
    this.pieces = []; // [step, text] per generated token, to rebuild text at any step
    this.tokenIds = [];
    this.firstTokenStep = null;
    this.firstTokenTime = null;
    this.firstTokenOwn = null;
    this.reasons = []; // [step, reason]
    this.finishReason = null;
    this.mine = false; // typed in this tab
  }

  cellAt(k) {
    if (this.cellsFrom == null || k < this.cellsFrom) return PHASE.waiting;
    return this.cells[k - this.cellsFrom] ?? PHASE.waiting;
  }

  setCell(k, code) {
    if (this.cellsFrom == null) {
      if (code === PHASE.waiting) return;
      this.cellsFrom = k;
    }
    this.cells[k - this.cellsFrom] = code;
  }

  textAt(step) {
    let s = "";
    for (const [k, piece] of this.pieces) if (k <= step) s += piece;
    return s;
  }

  // TTFT as docs/events.md defines it ("Latency: one definition of each figure"):
  // first token time - arrival time, both on the side's own clock (PanelModel.ownNow).
  ttft() {
    return this.firstTokenOwn != null && this.arrivalOwn != null
      ? this.firstTokenOwn - this.arrivalOwn : null;
  }

  // TTFT as seen at `step`, ending at own time `now`: the real one once its first token
  // came, else the wait so far (a lower bound: leaving waiting requests out would make a
  // long queue, static batching's, look fast). pending says which; null: not counted
  // (not arrived by then, or gone without a first token, e.g. aborted).
  ttftAt(step, now) {
    if (this.firstTokenStep != null && this.firstTokenStep <= step) return { value: this.ttft(), pending: false };
    if (this.arrivalOwn == null || this.startStep > step) return null;
    if (this.endStep != null && this.endStep <= step) return null;
    return { value: now - this.arrivalOwn, pending: true };
  }
}

export class PanelModel {
  constructor(info) {
    // Steps back whose block maps are kept: all of them for a replay's slider; a live page
    // draws only the latest, and a simulated GPU's maps would fill memory (app.js sets it).
    this.mapsKept = Infinity;
    this.reset(info);
  }

  reset(info) { // info: the engine's description (hello, or a reset event's info)
    this.info = info;
    this.name = info.name ?? this.name;
    this.batching = info.batching;
    this.kvTotal = info.kv_total || 0;
    this.reqs = new Map();
    this.order = []; // requests in arrival order: the rows
    this.steps = []; // compact step records, steps[i].step == i + 1 when none were missed
    this.live = new Set(); // ids of requests still in the engine
    this.tokensAt = new Map(); // step number -> tokens generated in it
    this.written = new Map(); // request id (a string) -> KV blocks it has written
    this.version = (this.version ?? 0) + 1; // bumped on every change: renderers redraw
    this.dropped = 0;
    this.t0 = null;
    this.baseStep = info.step || 0; // iterations the engine ran before this page joined
    this.firstKnown = this.baseStep + 1; // cells before this iteration were never seen here
    this.current = null; // the step being applied: requests first seen in it start there
  }

  // The side's own clock (docs/events.md: the seconds of its own steps, each step event's
  // busy_s) for an event at engine time t, which comes after the latest step: the demo's one
  // thread runs the other side's steps in between, and the wall clock would charge them to
  // this side. Traces written before busy_s: the engine's clock.
  ownNow(t) {
    const s = this.steps.at(-1);
    if (!s) return this.info.busy_s ?? t;
    return s.hasOwn ? s.ownEnd : t;
  }

  get lastStep() { return this.steps.length ? this.steps[this.steps.length - 1].step : this.baseStep; }

  req(id, create = true) {
    let r = this.reqs.get(id);
    if (!r && create) {
      r = new Req(id, this.current ?? this.lastStep + 1);
      this.reqs.set(id, r);
      this.order.push(r);
      this.live.add(id);
    }
    return r;
  }

  stepPos(k) { // position in this.steps of the last step record with .step <= k, or -1
    const first = this.steps.length ? this.steps[0].step : 1;
    const guess = k - first;
    if (this.steps[guess] && this.steps[guess].step === k) return guess;
    let lo = 0, hi = this.steps.length - 1, best = -1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (this.steps[mid].step <= k) { best = mid; lo = mid + 1; } else hi = mid - 1;
    }
    return best;
  }

  stepAt(k) { // the last step record with .step <= k, or null
    const p = this.stepPos(k);
    return p < 0 ? null : this.steps[p];
  }

  apply(e) {
    this.version++;
    const handler = HANDLERS[e.type];
    if (handler) handler(this, e);
  }

  onStep(e) {
    const k = e.step;
    this.current = k;
    if (this.t0 == null) this.t0 = e.wall_start;
    const why = (list, tag) => list.forEach((d) => this.req(d.request_id).reasons.push([k, d.reason, tag]));
    for (const d of e.preempted) this.req(d.request_id).state = d.mode === "swap" ? PHASE.swapped : PHASE.preempted;
    for (const d of e.swapped_out) this.req(d.request_id).state = PHASE.swapped;
    for (const d of [...e.admitted, ...e.swapped_in]) this.req(d.request_id).state = PHASE.waiting;
    why(e.admitted, "admitted"); why(e.preempted, "preempted"); why(e.swapped_out, "swapped");
    why(e.swapped_in, "swapped_in"); why(e.drafted || [], "drafted"); why(e.finished, "finished");
    // rows for occupancy; tokens for padding waste (docs/events.md: padding tokens / all
    // tokens computed, so a prefill chunk weighs its tokens)
    let useful = 0, padding = 0, tokens = 0, paddingTokens = 0;
    const ran = new Set();
    // blocks holding each request's KV after this step (beyond them: held, not written);
    // a request admitted without running yet has written none
    for (const d of e.admitted) this.written.set(String(d.request_id), 0);
    for (const row of e.scheduled) {
      this.written.set(String(row.request_id), Math.ceil(row.context_len / (e.block_size || 16)));
      const r = this.req(row.request_id);
      const code = PHASE[row.phase] ?? PHASE.decode;
      r.setCell(k, code);
      if (row.num_draft_tokens) r.produced[k - r.startStep] = 1 + (row.num_accepted_tokens || 0);
      ran.add(row.request_id);
      const n = row.num_tokens ?? 1;
      tokens += n;
      if (code === PHASE.padding) { padding++; paddingTokens += n; } else useful++;
    }
    for (const id of this.live) { // everyone else still here shows what it waits as
      if (ran.has(id)) continue;
      const r = this.reqs.get(id);
      if (k >= r.startStep) r.setCell(k, r.state);
    }
    for (const d of e.finished) this.end(d.request_id, k);
    this.steps.push({
      step: k, wallStart: e.wall_start, wallEnd: e.wall_end,
      // the step on the side's own clock (ownNow); older traces: the engine's
      hasOwn: e.busy_s != null, ownEnd: e.busy_s ?? e.wall_end,
      ownStart: (e.busy_s ?? e.wall_end) - (e.wall_end - e.wall_start), useful, padding, tokens, paddingTokens,
      slotsLimit: e.slots_limit, budgetUsed: e.budget_used, budgetLimit: e.budget_limit,
      kvUsed: e.kv_used, kvFree: e.kv_free, kvTotal: e.kv_total, kvSwapped: e.kv_swapped,
      waiting: e.num_waiting, swapped: e.num_swapped, finished: e.finished.length,
      preempted: e.preempted.map((d) => [d.request_id, d.mode]),
      decisions: [...e.admitted, ...e.preempted, ...e.swapped_out, ...e.swapped_in, ...e.finished],
      notes: e.notes,
      // request id (a string) -> its block ids after this step: what the KV map draws
      blockTables: e.block_tables, swapTables: e.swap_tables,
      cachedBlocks: e.cached_blocks || [], // evictable blocks still holding a cached prefix
      written: Object.fromEntries(this.written),
      // tensor parallelism (absent from older traces: one rank)
      tp: e.tensor_parallel_size || 1, collectiveS: e.collective_s || 0,
      // how busy the GPU was, 0..1 (a simulated GPU's model; null: unknown, older traces)
      bandwidthUtil: e.bandwidth_util ?? null, flopUtil: e.flop_util ?? null,
    });
    this.current = null;
    if (e.kv_total) this.kvTotal = e.kv_total;
    const old = this.steps[this.steps.length - 1 - this.mapsKept];
    if (old) old.blockTables = old.swapTables = old.cachedBlocks = old.written = null;
  }

  end(id, step) {
    const r = this.req(id);
    if (r.endStep == null) r.endStep = Math.max(step, r.startStep);
    this.live.delete(id);
    this.written.delete(String(id));
  }
}

const HANDLERS = {
  step: (m, e) => m.onStep(e),
  arrived: (m, e) => {
    const r = m.req(e.request_id);
    r.arrival = e.time; r.arrivalOwn = m.ownNow(e.time); r.prompt = e.prompt; r.numPrompt = e.num_prompt_tokens;
    r.maxTokens = e.max_tokens;
    if (m.t0 == null) m.t0 = e.time;
  },
  first_token: (m, e) => {
    const r = m.req(e.request_id);
    r.firstTokenStep = e.step; r.firstTokenTime = e.time; r.firstTokenOwn = m.ownNow(e.time);
  },
  token: (m, e) => {
    const r = m.req(e.request_id);
    r.pieces.push([e.step, e.text]);
    if (e.redacted) r.redacted = true; // a text-free view: the server blanked text and id
    else r.tokenIds.push(e.token_id);
    m.tokensAt.set(e.step, (m.tokensAt.get(e.step) || 0) + 1);
  },
  finished: (m, e) => {
    const r = m.req(e.request_id);
    r.finishReason = e.finish_reason; m.end(e.request_id, e.step);
  },
  aborted: (m, e) => { m.req(e.request_id).finishReason = "abort"; m.end(e.request_id, m.lastStep); },
  preempted: () => {}, admitted: () => {}, swapped_out: () => {}, swapped_in: () => {},
  rejected: () => {},
  reset: (m, e) => m.reset(e.info), // request ids and step numbers start again
};
