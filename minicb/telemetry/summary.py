"""The summary of a run: every figure of ``MetricsCollector.summary()`` (one JSON-safe
dict) computed from the collector's per-request records and step totals
(minicb.telemetry.records). minicb.telemetry.metrics lists the definitions; docs/events.md
has the long form. Pure Python: no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from minicb.core.latency import distribution, e2e, jain_index, queue_time, tpot, ttft
from minicb.telemetry.records import RequestRecord, StepTotals

if TYPE_CHECKING:
    from minicb.telemetry.metrics import MetricsCollector


def summarise(
    c: MetricsCollector, ttft_slo: float | None = None, tpot_slo: float | None = None
) -> dict[str, Any]:
    """Every figure of ``MetricsCollector.summary`` from what the collector has seen."""
    duration = (c.t_max - c.t_min) if c.t_min is not None else 0.0
    reqs = c.requests
    done = {i: r for i, r in reqs.items() if r.finished is not None and r.arrival is not None}
    ttfts = {
        i: ttft(r.arrival, r.first_token)
        for i, r in reqs.items()
        if r.first_token is not None and r.arrival is not None
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
            "rejected": c.rejected,
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
        "batch": _batch(c.steps),
        "kv": _kv(c.steps),
        "preemptions": _preemptions(c.steps),
        "prefix_cache": _prefix_cache(c.steps),
        "speculative": _speculative(c.steps),
        "fairness": _fairness(c, done),
        "goodput": _goodput(done, ttfts, tpots, ttft_slo, tpot_slo, duration),
    }


def _preemptions(s: StepTotals) -> dict[str, Any]:
    return {
        "total": sum(s.preempted.values()),
        "recompute": s.preempted.get("recompute", 0),
        "swap": s.preempted.get("swap", 0),
        "swapped_out": s.swapped_out,
        "swapped_in": s.swapped_in,
    }


def _prefix_cache(s: StepTotals) -> dict[str, Any]:
    return {
        "query_tokens": s.prefix_query_tokens,
        "hit_tokens": s.prefix_hit_tokens,
        "host_hit_tokens": s.prefix_host_hit_tokens,
        "hit_rate": _ratio(s.prefix_hit_tokens, s.prefix_query_tokens),
        "prefill_tokens": s.prefill_tokens,
    }


def _speculative(s: StepTotals) -> dict[str, Any]:
    return {
        "drafted_rows": s.drafted_rows,
        "draft_tokens": s.draft_tokens,
        "accepted_tokens": s.accepted_tokens,
        "acceptance_rate": _ratio(s.accepted_tokens, s.draft_tokens),
        "accepted_tokens_per_step": _ratio(s.accepted_tokens, s.count),
        "tokens_per_decode_row": _ratio(s.decode_rows + s.accepted_tokens, s.decode_rows),
    }


def _batch(s: StepTotals) -> dict[str, Any]:
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


def _kv(s: StepTotals) -> dict[str, Any]:
    reserved = s.kv_held - s.kv_live - s.kv_last_block_slack
    return {
        "utilisation": _ratio(s.kv_live, s.kv_held),
        "internal_fragmentation": _ratio(s.kv_last_block_slack, s.kv_held),
        "reservation_waste": _ratio(reserved, s.kv_held),
        "mean_pool_usage": _ratio(s.kv_usage_sum, s.count),
        "peak_pool_usage": s.kv_usage_peak,
    }


def _fairness(c: MetricsCollector, done: dict[tuple[int, int], RequestRecord]) -> dict[str, Any]:
    normalised = [
        e2e(r.arrival, r.finished) / r.num_output_tokens
        for r in done.values()
        if r.num_output_tokens
    ]
    waits = {i: _wait(r, c.t_max) for i, r in c.requests.items() if r.arrival is not None}
    longest = max(waits, key=waits.__getitem__) if waits else None
    return {
        "jain_index": jain_index(normalised) if normalised else None,
        "longest_wait_s": waits[longest] if longest is not None else None,
        "longest_wait_request": longest[1] if longest is not None else None,
    }


def _goodput(
    done: dict[tuple[int, int], RequestRecord],
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


def _wait(r: RequestRecord, end: float | None) -> float:
    """Time spent not running; a wait still open counts up to the last event seen."""
    if r.wait_from is None or end is None:
        return r.waited
    return r.waited + (end - r.wait_from)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None
