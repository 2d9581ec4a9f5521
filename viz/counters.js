// The live counters of one panel, computed from its model at any iteration (live: the
// latest; replay: wherever the slider is), so a scrubbed trace shows what the room saw.
// Times are on the side's own clock (PanelModel.ownNow), as the scenarios' figures.

const RATE_WINDOW_S = 5; // output tokens/s is measured over the last few seconds

function percentile(sorted, p) {
  if (!sorted.length) return null;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i];
}

export function countersAt(model, cursor) {
  const step = model.stepAt(cursor);
  const out = {
    toks: 0, occupancy: null, padding: null, ttft50: null, ttft99: null,
    ttft50Pending: false, ttft99Pending: false, queue: 0, done: 0, tp: 1, collectiveS: 0,
  };
  if (!step) {
    out.queue = model.order.filter((r) => r.endStep == null).length;
    return out;
  }
  // tokens/s over a trailing window of the side's own time (model.ownNow), ending at this
  // step: the other side's steps, run in between by the same thread, are not charged here
  let tokens = 0, from = step.ownEnd, computed = 0, pads = 0;
  for (let i = model.steps.length - 1; i >= 0; i--) {
    const s = model.steps[i];
    if (s.step > step.step) continue;
    computed += s.tokens; pads += s.paddingTokens;
    if (s.ownEnd >= step.ownEnd - RATE_WINDOW_S) { tokens += model.tokensAt.get(s.step) || 0; from = s.ownStart; }
  }
  const span = step.ownEnd - from;
  out.toks = span > 0 ? tokens / span : 0;
  out.occupancy = step.slotsLimit ? step.useful / step.slotsLimit : null;
  out.padding = computed ? pads / computed : 0;
  const ttfts = [];
  for (const r of model.order) {
    const seen = r.ttftAt(step.step, step.ownEnd);
    if (seen && seen.value != null) ttfts.push(seen);
    if (r.endStep != null && r.endStep <= step.step) out.done++;
  }
  out.done += model.forgotten; // the oldest ended ones a long live page let go of
  ttfts.sort((a, b) => a.value - b.value);
  for (const p of [50, 99]) {
    const at = percentile(ttfts, p);
    out[`ttft${p}`] = at ? at.value : null;
    // a percentile that lands on a request still waiting is itself a lower bound
    out[`ttft${p}Pending`] = at ? at.pending : false;
  }
  out.queue = step.waiting + step.swapped;
  out.tp = step.tp; out.collectiveS = step.collectiveS; // this step's time in collectives
  return out;
}

export function formatCounters(c) {
  const pct = (x) => (x == null ? "–" : `${Math.round(x * 100)}%`);
  const sec = (x) => (x == null ? "–" : x < 1 ? `${Math.round(x * 1000)} ms` : `${x.toFixed(2)} s`);
  return {
    toks: c.toks.toFixed(1), occupancy: pct(c.occupancy), padding: pct(c.padding),
    ttft50: (c.ttft50Pending ? "≥ " : "") + sec(c.ttft50),
    ttft99: (c.ttft99Pending ? "≥ " : "") + sec(c.ttft99),
    queue: String(c.queue), done: String(c.done),
    parallel: c.tp > 1 ? `${c.tp} · ${(c.collectiveS * 1000).toFixed(1)} ms` : null, // null: hidden
  };
}
