"""Serving metrics, computed from events alone.

``MetricsCollector`` is an event listener (subscribe it to an EventBus, or feed it the
events of a trace); ``summary()`` turns what it saw into one JSON-safe dict. The same
events in the same order give exactly the same figures, live or replayed. Definitions
(docs/events.md has the long form):

- latency, per request: TTFT = first token - arrival; TPOT = (last token - first token) /
  (tokens - 1); inter-token latency (ITL) = gaps between consecutive tokens; end-to-end =
  finished - arrival; queue time = first admission - arrival. Each as count, mean, p50,
  p90, p99 and max (percentiles interpolate linearly, as numpy's default does).
- throughput over the run (first arrival or step to last event), counting finished
  requests: output tokens/s, total (prompt + output) tokens/s, requests/s.
- batch: slot occupancy = rows doing real work / slots available, summed over steps;
  padding waste = padding tokens / tokens computed; token budget use = tokens / budget.
- KV, over the scheduled rows of every step: utilisation = live tokens / token slots of
  the blocks they hold; internal fragmentation = empty slots in each row's last block /
  slots held; reservation waste = whole blocks held beyond the last (static batching
  reserves them up front) / slots held. The three add up to 1. Pool usage = used / total
  blocks after each step.
- prefix cache, in tokens over every admission: queries = tokens looked up, hits = tokens
  found (not computed); hit rate = hits / queries. Prefill tokens = tokens of prefill rows
  actually computed (what the cache saves).
- fairness: Jain's index over normalised latency (end-to-end / output tokens) of finished
  requests (1 = all equal); longest wait = most time a request spent not running
  (queued, preempted or swapped out).
- goodput under TTFT/TPOT targets: finished requests that met both, per second.
- speculative decoding: draft tokens verified, accepted (kept as output); acceptance rate =
  accepted / drafted; accepted tokens per step = accepted / iterations; tokens per decode
  row = tokens the decode rows produced / decode rows (1 without speculation, at most
  1 + num_speculative_tokens): the mean tokens per request per iteration.

Pure Python: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minicb.telemetry.events import Event


# ---- the one definition of each latency figure -------------------------------------------
# Read by RequestMetrics (a finished request's output), MetricsCollector (summaries of
# live runs and traces) and PrometheusMetrics (histograms); the visualizer's live figures
# follow the same definitions, written out in docs/events.md.
def ttft(arrival: float, first_token: float) -> float:
    """Time to first token."""
    return first_token - arrival


def tpot(first_token: float, last_token: float, num_tokens: int) -> float:
    """Time per output token after the first: the mean gap between a request's tokens."""
    return (last_token - first_token) / (num_tokens - 1)


def e2e(arrival: float, finished: float) -> float:
    """End-to-end latency."""
    return finished - arrival


def queue_time(arrival: float, first_admitted: float) -> float:
    return first_admitted - arrival


# ---- small descriptive statistics (pure Python, so metrics need no numpy) ---------------
def percentile(sorted_values: list[float], q: float) -> float:
    """The q-th percentile (0..100) of sorted values, interpolating linearly between ranks."""
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def distribution(values: Iterable[float]) -> dict[str, Any]:
    v = sorted(values)
    if not v:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    return {
        "count": len(v),
        "mean": sum(v) / len(v),
        "p50": percentile(v, 50),
        "p90": percentile(v, 90),
        "p99": percentile(v, 99),
        "max": v[-1],
    }


def jain_index(values: list[float]) -> float | None:
    """(sum x)^2 / (n * sum x^2): 1 when all are equal, 1/n when one takes everything."""
    squares = sum(x * x for x in values)
    return sum(values) ** 2 / (len(values) * squares) if squares > 0 else None


def handlers(listener: object) -> dict[str, Any]:
    """A listener's ``_on_<kind>`` methods by kind: looked up once, not by name per event."""
    return {n[4:]: getattr(listener, n) for n in dir(listener) if n.startswith("_on_")}


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


@dataclass
class _Request:
    """What the events told us about one request."""

    arrival: float | None = None
    admitted: float | None = None  # first admission
    token_times: list[float] = field(default_factory=list)
    finished: float | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    aborted: bool = False
    wait_from: float | None = None  # start of the current wait; None while running
    waited: float = 0.0

    def stop_waiting(self, t: float) -> None:
        if self.wait_from is not None:
            self.waited += t - self.wait_from
            self.wait_from = None


@dataclass
class _Steps:
    """Sums over every StepEvent."""

    count: int = 0
    useful_rows: int = 0
    slots: int = 0
    tokens: int = 0
    padding_tokens: int = 0
    budget_used: int = 0
    budget_limit: int = 0
    kv_live: int = 0
    kv_held: int = 0
    kv_last_block_slack: int = 0
    kv_usage_sum: float = 0.0
    kv_usage_peak: float = 0.0
    schedule_s: float = 0.0
    forward_s: float = 0.0
    sample_s: float = 0.0
    preempted: dict[str, int] = field(default_factory=dict)
    swapped_out: int = 0
    swapped_in: int = 0
    prefill_tokens: int = 0
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    decode_rows: int = 0
    drafted_rows: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0


class MetricsCollector:
    """Listens to events; ``summary()`` gives every figure at any moment."""

    def __init__(self) -> None:
        # Keyed by (engine generation, request id): ids start again at 0 after a rebuild
        # (a "reset" event), and a run that crosses one must not mix two requests.
        self.requests: dict[tuple[int, int], _Request] = {}
        self.generation = 0
        self.steps = _Steps()
        self.rejected = 0
        self.t_min: float | None = None
        self.t_max: float | None = None
        self._handlers = handlers(self)

    def __call__(self, event: Event) -> None:
        handler = self._handlers.get(event.kind)
        if handler is not None:
            handler(event)

    def _seen(self, start: float, end: float) -> None:
        if self.t_min is None or start < self.t_min:
            self.t_min = start
        if self.t_max is None or end > self.t_max:
            self.t_max = end

    def _req(self, event: Any) -> _Request:
        self._seen(event.time, event.time)
        key = (self.generation, event.request_id)
        r = self.requests.get(key)
        if r is None:  # only now: setdefault would build a _Request for every event
            r = self.requests[key] = _Request()
        return r

    # ---- per-event updates ---------------------------------------------------------------
    def _on_step(self, e: Any) -> None:
        self._seen(e.wall_start, e.wall_end)
        plan, s = e.plan, self.steps
        s.count += 1
        s.slots += plan.slots_limit
        s.budget_used += plan.budget_used
        s.budget_limit += plan.budget_limit
        s.schedule_s += e.schedule_s
        s.forward_s += e.forward_s
        s.sample_s += e.sample_s
        bs = plan.block_size
        for row in plan.scheduled:
            s.tokens += row.num_tokens
            if row.phase == "padding":
                s.padding_tokens += row.num_tokens
            else:
                s.prefill_tokens += row.num_tokens if row.phase == "prefill" else 0
                s.useful_rows += 1
            if row.phase == "decode":
                s.decode_rows += 1
                s.drafted_rows += row.num_draft_tokens > 0
                s.draft_tokens += row.num_draft_tokens
                s.accepted_tokens += row.num_accepted_tokens
            full = -(-row.context_len // bs)  # blocks the live tokens need
            s.kv_live += row.context_len
            s.kv_held += len(row.block_table) * bs
            s.kv_last_block_slack += full * bs - row.context_len
        if plan.kv_total:
            usage = plan.kv_used / plan.kv_total
            s.kv_usage_sum += usage
            s.kv_usage_peak = max(s.kv_usage_peak, usage)
        for d in plan.preempted:
            s.preempted[d.mode or "?"] = s.preempted.get(d.mode or "?", 0) + 1
        s.swapped_out += len(plan.swapped_out)
        s.swapped_in += len(plan.swapped_in)
        s.prefix_query_tokens += plan.prefix_query_tokens
        s.prefix_hit_tokens += plan.prefix_hit_tokens

    def _on_arrived(self, e: Any) -> None:
        r = self._req(e)
        r.arrival = r.wait_from = e.time
        r.num_prompt_tokens = e.num_prompt_tokens

    def _on_admitted(self, e: Any) -> None:
        r = self._req(e)
        if r.admitted is None:
            r.admitted = e.time
        r.stop_waiting(e.time)

    def _on_preempted(self, e: Any) -> None:
        self._req(e).wait_from = e.time  # waiting again, for readmission or swap-in

    def _on_swapped_in(self, e: Any) -> None:
        self._req(e).stop_waiting(e.time)

    def _on_token(self, e: Any) -> None:
        self._req(e).token_times.append(e.time)

    def _on_finished(self, e: Any) -> None:
        r = self._req(e)
        r.finished = e.time
        r.num_prompt_tokens = e.num_prompt_tokens
        r.num_output_tokens = e.num_output_tokens
        r.stop_waiting(e.time)

    def _on_aborted(self, e: Any) -> None:
        r = self._req(e)
        r.aborted = True
        r.stop_waiting(e.time)

    def _on_reset(self, e: Any) -> None:
        self._seen(e.time, e.time)
        self.generation += 1

    def _on_rejected(self, e: Any) -> None:
        self._seen(e.time, e.time)
        self.rejected += 1

    # ---- the summary ---------------------------------------------------------------------
    def summary(
        self, ttft_slo: float | None = None, tpot_slo: float | None = None
    ) -> dict[str, Any]:
        duration = (self.t_max - self.t_min) if self.t_min is not None else 0.0
        reqs = self.requests
        done = {i: r for i, r in reqs.items() if r.finished is not None and r.arrival is not None}
        ttfts = {
            i: ttft(r.arrival, r.token_times[0])
            for i, r in reqs.items()
            if r.token_times and r.arrival is not None
        }
        tpots = {
            i: tpot(r.token_times[0], r.token_times[-1], len(r.token_times))
            for i, r in reqs.items()
            if len(r.token_times) > 1
        }
        out_tokens = sum(r.num_output_tokens for r in done.values())
        in_tokens = sum(r.num_prompt_tokens for r in done.values())
        return {
            "duration_s": duration,
            "requests": {
                "arrived": sum(r.arrival is not None for r in reqs.values()),
                "finished": len(done),
                "aborted": sum(r.aborted for r in reqs.values()),
                "rejected": self.rejected,
                "tokens_generated": sum(len(r.token_times) for r in reqs.values()),
            },
            "latency": {
                "ttft_s": distribution(ttfts.values()),
                "tpot_s": distribution(tpots.values()),
                "itl_s": distribution(g for r in reqs.values() for g in _gaps(r.token_times)),
                "e2e_s": distribution(e2e(r.arrival, r.finished) for r in done.values()),
                "queue_s": distribution(
                    queue_time(r.arrival, r.admitted)
                    for r in reqs.values()
                    if r.admitted is not None and r.arrival is not None
                ),
            },
            "throughput": {
                "output_tokens_per_s": _ratio(out_tokens, duration),
                "total_tokens_per_s": _ratio(out_tokens + in_tokens, duration),
                "requests_per_s": _ratio(len(done), duration),
            },
            "batch": self._batch(),
            "kv": self._kv(),
            "preemptions": self._preemptions(),
            "prefix_cache": self._prefix_cache(),
            "speculative": self._speculative(),
            "fairness": self._fairness(done),
            "goodput": _goodput(done, ttfts, tpots, ttft_slo, tpot_slo, duration),
        }

    def _preemptions(self) -> dict[str, Any]:
        s = self.steps
        return {
            "total": sum(s.preempted.values()),
            "recompute": s.preempted.get("recompute", 0),
            "swap": s.preempted.get("swap", 0),
            "swapped_out": s.swapped_out,
            "swapped_in": s.swapped_in,
        }

    def _prefix_cache(self) -> dict[str, Any]:
        s = self.steps
        return {
            "query_tokens": s.prefix_query_tokens,
            "hit_tokens": s.prefix_hit_tokens,
            "hit_rate": _ratio(s.prefix_hit_tokens, s.prefix_query_tokens),
            "prefill_tokens": s.prefill_tokens,
        }

    def _speculative(self) -> dict[str, Any]:
        s = self.steps
        return {
            "drafted_rows": s.drafted_rows,
            "draft_tokens": s.draft_tokens,
            "accepted_tokens": s.accepted_tokens,
            "acceptance_rate": _ratio(s.accepted_tokens, s.draft_tokens),
            "accepted_tokens_per_step": _ratio(s.accepted_tokens, s.count),
            "tokens_per_decode_row": _ratio(s.decode_rows + s.accepted_tokens, s.decode_rows),
        }

    def _batch(self) -> dict[str, Any]:
        s = self.steps
        return {
            "steps": s.count,
            "slot_occupancy": _ratio(s.useful_rows, s.slots),
            "padding_waste": _ratio(s.padding_tokens, s.tokens),
            "token_budget_use": _ratio(s.budget_used, s.budget_limit),
            "mean_rows_per_step": _ratio(s.useful_rows, s.count),
            "mean_tokens_per_step": _ratio(s.tokens, s.count),
            "mean_schedule_s": _ratio(s.schedule_s, s.count),
            "mean_forward_s": _ratio(s.forward_s, s.count),
            "mean_sample_s": _ratio(s.sample_s, s.count),
        }

    def _kv(self) -> dict[str, Any]:
        s = self.steps
        reserved = s.kv_held - s.kv_live - s.kv_last_block_slack
        return {
            "utilisation": _ratio(s.kv_live, s.kv_held),
            "internal_fragmentation": _ratio(s.kv_last_block_slack, s.kv_held),
            "reservation_waste": _ratio(reserved, s.kv_held),
            "mean_pool_usage": _ratio(s.kv_usage_sum, s.count),
            "peak_pool_usage": s.kv_usage_peak,
        }

    def _fairness(self, done: dict[tuple[int, int], _Request]) -> dict[str, Any]:
        normalised = [
            e2e(r.arrival, r.finished) / r.num_output_tokens
            for r in done.values()
            if r.num_output_tokens
        ]
        waits = {i: _wait(r, self.t_max) for i, r in self.requests.items() if r.arrival is not None}
        longest = max(waits, key=waits.__getitem__) if waits else None
        return {
            "jain_index": jain_index(normalised) if normalised else None,
            "longest_wait_s": waits[longest] if longest is not None else None,
            "longest_wait_request": longest[1] if longest is not None else None,
        }


def _goodput(
    done: dict[tuple[int, int], _Request],
    ttfts: dict[tuple[int, int], float],
    tpots: dict[tuple[int, int], float],
    ttft_slo: float | None,
    tpot_slo: float | None,
    duration: float,
) -> dict[str, Any] | None:
    """Finished requests that met both targets (a one-token request has no TPOT to miss)."""
    if ttft_slo is None and tpot_slo is None:
        return None
    good = [
        i
        for i in done
        if (ttft_slo is None or (i in ttfts and ttfts[i] <= ttft_slo))
        and (tpot_slo is None or tpots.get(i, 0.0) <= tpot_slo)
    ]
    return {
        "ttft_slo_s": ttft_slo,
        "tpot_slo_s": tpot_slo,
        "requests": len(good),
        "fraction": _ratio(len(good), len(done)),
        "requests_per_s": _ratio(len(good), duration),
    }


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def _wait(r: _Request, end: float | None) -> float:
    """Time spent not running; a wait still open counts up to the last event seen."""
    if r.wait_from is None or end is None:
        return r.waited
    return r.waited + (end - r.wait_from)


def compute_metrics(
    events: Iterable[Event], ttft_slo: float | None = None, tpot_slo: float | None = None
) -> dict[str, Any]:
    """The summary of a whole sequence of events (a replayed trace, a test's list)."""
    collector = MetricsCollector()
    for event in events:
        collector(event)
    return collector.summary(ttft_slo, tpot_slo)
