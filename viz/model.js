// PanelModel: one engine's history, rebuilt from the server's frames alone.
//
// The same code reads a live WebSocket and a recorded trace (the server folds both the
// same way, minicb/server/frames.py), so live and replay draw the same rows and the same
// KV map. A step arrives as a digest: its figures, its decisions, the rows that changed
// phase since the step before (row_changes), each row's detail where the batch is small,
// and, where the pool is small enough to draw block by block, the KV changes it made
// (kv_ops, applied to the map). At a GPU's scale a frame brings a folded map (kv_grid)
// instead. The request events add what steps lack: prompts, arrival times, text, first
// tokens. A "reset" event (the engine was rebuilt with new settings) starts afresh.

import { KvState } from "./kvstate.js";

export const PHASE = { waiting: 0, prefill: 1, decode: 2, padding: 3, preempted: 4, swapped: 5 };
export const PHASE_NAMES = ["waiting", "prefill", "decode", "padding", "preempted", "swapped"];
const CHECKPOINT_EVERY = 64; // a replay rebuilds the map of any step from the copy before it
const MAX_REQUESTS = 12000; // live: ended requests beyond this many are forgotten, oldest first

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
    // A speculative decode cell's draft, by k - startStep: [guesses, accepted, proposer]
    // (it produced 1 + accepted tokens; all accepted: the last is the model's bonus token)
    this.drafts = [];
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
    this.rowCode = new Map(); // request id -> the phase of its row in the last step
    this.forgotten = 0; // ended requests dropped from order (a long live run): still counted
    // the KV map after the last step, and copies every CHECKPOINT_EVERY steps for a replay
    this.kv = info.kv ? KvState.fromView(info.kv) : new KvState();
    this.kvGrid = info.kv_grid || null; // a large pool: the server's folded map (live)
    this.checkpoints = [[info.step || 0, this.kv.clone()]];
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

  // A joining page's start (the server's view of the engine): the recent steps for the
  // charts and counters, and the requests held now and the latest that ended, each with
  // the phase of its last row and its history ([step, phase] at each change), drawn from
  // the first recent step on: a page opened between two bursts shows the last one.
  applyView(view) {
    for (const e of view.recent || []) this.onStep(e, true);
    const known = view.recent?.length ? view.recent[0].step : this.lastStep + 1;
    let ended = 0;
    for (const q of view.requests || []) {
      const r = this.req(q.request_id);
      r.startStep = Math.min(r.startStep, q.start_step ?? r.startStep);
      r.arrival = q.arrival; r.prompt = q.prompt; r.numPrompt = q.num_prompt_tokens;
      r.maxTokens = q.max_tokens; r.arrivalOwn = q.arrival_busy_s ?? null;
      if (q.first_token_time != null) {
        r.firstTokenTime = q.first_token_time; r.firstTokenOwn = q.first_token_busy_s ?? null;
        r.firstTokenStep = q.first_token_step ?? this.lastStep;
      }
      if (q.row != null) this.rowCode.set(q.request_id, q.row);
      const history = q.history || [], last = q.end_step ?? this.lastStep;
      history.forEach(([k, code], i) => { // each phase until the next change
        const until = i + 1 < history.length ? history[i + 1][0] - 1 : last;
        for (let s = Math.max(k, known); s <= until; s++) r.setCell(s, code);
      });
      const now = history.at(-1)?.[1]; // what it waits as, if it was preempted or swapped
      if (now === PHASE.preempted || now === PHASE.swapped) r.state = now;
      if (q.end_step != null) { r.finishReason = q.finish_reason; this.end(q.request_id, q.end_step); ended++; }
    }
    this.forgotten = Math.max(0, (view.ended_total ?? ended) - ended); // counted, not drawn
    this.firstKnown = known;
    this.checkpoints = [[this.lastStep, this.kv.clone()]]; // the view's map is the latest
    this.version++;
  }

  // The KV map after step k: the live one, or a replay's, rebuilt from the copy before it.
  kvAt(k) {
    if (k >= this.lastStep) return this.kv;
    let [from, state] = this.checkpoints[0];
    for (const [s, copy] of this.checkpoints) if (s <= k) [from, state] = [s, copy];
    state = state.clone();
    for (let p = Math.max(0, this.stepPos(from) + 1); p < this.steps.length && this.steps[p].step <= k; p++) {
      if (this.steps[p].step > from && this.steps[p].kvOps) state.apply(this.steps[p].kvOps);
    }
    return state;
  }

  onStep(e, history = false) {
    const k = e.step;
    this.current = k;
    if (this.t0 == null) this.t0 = e.wall_start;
    if (!history) { // a joining page's history: figures only, its requests come in the view
      const why = (list, tag) => list.forEach((d) => this.req(d.request_id).reasons.push([k, d.reason, tag]));
      for (const d of e.preempted) this.req(d.request_id).state = d.mode === "swap" ? PHASE.swapped : PHASE.preempted;
      for (const d of e.swapped_out) this.req(d.request_id).state = PHASE.swapped;
      for (const d of [...e.admitted, ...e.swapped_in]) this.req(d.request_id).state = PHASE.waiting;
      why(e.admitted, "admitted"); why(e.preempted, "preempted"); why(e.swapped_out, "swapped");
      why(e.swapped_in, "swapped_in"); why(e.drafted || [], "drafted"); why(e.finished, "finished");
    }
    // rows for occupancy; tokens for padding waste (docs/events.md: padding tokens / all
    // tokens computed, so a prefill chunk weighs its tokens): the server adds them up
    const useful = e.useful_rows, padding = e.padding_rows, tokens = e.num_tokens;
    const paddingTokens = e.padding_tokens;
    this.tokensAt.set(k, e.generated || 0);
    if (!history) {
      // blocks holding each request's KV after this step (beyond them: held, not written);
      // a request admitted without running yet has written none
      for (const d of e.admitted) this.written.set(String(d.request_id), 0);
      for (const [rid, code] of e.row_changes) {
        if (code < 0) this.rowCode.delete(rid); else this.rowCode.set(rid, code);
      }
      for (const [rid, code] of this.rowCode) this.req(rid).setCell(k, code);
      for (const [rid, , contextLen] of e.rows || []) { // a small batch's detail
        this.written.set(String(rid), Math.ceil(contextLen / (e.block_size || 16)));
      }
      for (const [rid, guesses, accepted] of e.drafts || []) { // at any batch size
        const r = this.req(rid); r.drafts[k - r.startStep] = [guesses, accepted, e.proposer];
      }
      for (const id of this.live) { // everyone else still here shows what it waits as
        if (this.rowCode.has(id)) continue;
        const r = this.reqs.get(id);
        if (k >= r.startStep) r.setCell(k, r.state);
      }
      if (e.kv_ops) this.kv.apply(e.kv_ops);
    }
    if (!history) for (const d of e.finished) { this.end(d.request_id, k); this.rowCode.delete(d.request_id); }
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
      notes: e.notes, kvCached: e.kv_cached, kvHostCached: e.kv_host_cached ?? 0, // host tier
      kvOps: e.kv_ops || null, // this step's KV changes: a replay rebuilds any step's map
      written: e.rows ? Object.fromEntries(this.written) : null, // a small batch only
      // tensor parallelism (absent from older traces: one rank)
      tp: e.tensor_parallel_size || 1, collectiveS: e.collective_s || 0,
      // how busy the GPU was, 0..1 (a simulated GPU's model; null: unknown, older traces)
      bandwidthUtil: e.bandwidth_util ?? null, flopUtil: e.flop_util ?? null,
    });
    this.current = null;
    if (e.kv_total) this.kvTotal = e.kv_total;
    if (!history && e.kv_ops && k % CHECKPOINT_EVERY === 0 && this.mapsKept === Infinity) {
      this.checkpoints.push([k, this.kv.clone()]);
    }
    const old = this.steps[this.steps.length - 1 - this.mapsKept];
    if (old) old.kvOps = old.written = null;
    if (this.order.length > MAX_REQUESTS && this.mapsKept !== Infinity) this.forget();
  }

  // A live page at a GPU's scale sees tens of thousands of requests: it keeps the latest.
  forget() {
    const keep = new Set(this.order.filter((r, i) => r.endStep == null || i >= this.order.length - MAX_REQUESTS / 2));
    for (const r of this.order) if (!keep.has(r)) { this.reqs.delete(r.id); this.forgotten++; }
    this.order = this.order.filter((r) => keep.has(r));
  }

  // Changes made between two steps (a prefill engine's sent KV, an abort on an idle
  // engine): the map changes now, and the last step's record keeps them, so the map a
  // replay rebuilds for that step has them too.
  onKvChanges(e) {
    this.kv.apply(e.kv_ops);
    const last = this.steps[this.steps.length - 1];
    if (last && last.kvOps) last.kvOps = last.kvOps.concat(e.kv_ops);
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
  tokens: (m, e) => { // a step's tokens, one entry per token in each list
    e.request_ids.forEach((id, i) => {
      const r = m.req(id);
      r.pieces.push([e.step, e.texts[i] ?? ""]);
      // a text-free view: the server blanked the texts and ids of others' requests
      if (e.token_ids[i] == null) r.redacted = true;
      else r.tokenIds.push(e.token_ids[i]);
    });
  },
  finished: (m, e) => {
    const r = m.req(e.request_id);
    r.finishReason = e.finish_reason; m.end(e.request_id, e.step);
  },
  aborted: (m, e) => { m.req(e.request_id).finishReason = "abort"; m.end(e.request_id, m.lastStep); },
  preempted: () => {}, admitted: () => {}, swapped_out: () => {}, swapped_in: () => {},
  rejected: () => {},
  reset: (m, e) => m.reset(e.info), // request ids and step numbers start again
  kv_changes: (m, e) => m.onKvChanges(e), // only where the map is drawn block by block
  kv_snapshot: (m, e) => { // a trace's whole map: the steps after it change this one
    m.kv = KvState.fromView(e);
    m.checkpoints.push([e.step, m.kv.clone()]);
  },
};
