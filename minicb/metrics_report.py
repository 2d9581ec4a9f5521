"""A metrics summary (minicb.telemetry.metrics) as a short plain-text report for the terminal."""

from __future__ import annotations

from typing import Any

LATENCIES = (
    ("ttft_s", "TTFT"),
    ("tpot_s", "TPOT"),
    ("itl_s", "inter-token"),
    ("e2e_s", "end-to-end"),
    ("queue_s", "queue time"),
)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_summary(summary: dict[str, Any]) -> str:
    r, b, kv, p, f = (summary[k] for k in ("requests", "batch", "kv", "preemptions", "fairness"))
    t = summary["throughput"]
    lines = [
        f"requests   {r['arrived']} arrived, {r['finished']} finished, {r['aborted']} aborted, "
        f"{r['rejected']} rejected; {r['tokens_generated']} tokens in "
        f"{summary['duration_s']:.3f} s",
        f"throughput {_num(t['output_tokens_per_s'])} output tok/s, "
        f"{_num(t['total_tokens_per_s'])} total tok/s, {_num(t['requests_per_s'], 2)} req/s",
        "",
        f"{'latency (ms)':<14}{'count':>7}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}",
    ]
    for key, label in LATENCIES:
        d = summary["latency"][key]
        cells = "".join(f"{_ms(d[k]):>10}" for k in ("mean", "p50", "p90", "p99", "max"))
        lines.append(f"{label:<14}{d['count']:>7}{cells}")
    lines += [
        "",
        f"batch      {b['steps']} steps, {_num(b['mean_rows_per_step'])} rows and "
        f"{_num(b['mean_tokens_per_step'])} tokens per step; slot occupancy "
        f"{_pct(b['slot_occupancy'])}, padding waste {_pct(b['padding_waste'])}, "
        f"token budget use {_pct(b['token_budget_use'])}",
        f"step time  schedule {_ms(b['mean_schedule_s'])} ms, forward "
        f"{_ms(b['mean_forward_s'])} ms, sample {_ms(b['mean_sample_s'])} ms (means)",
        f"KV cache   utilisation {_pct(kv['utilisation'])}, internal fragmentation "
        f"{_pct(kv['internal_fragmentation'])}, reservation waste {_pct(kv['reservation_waste'])}; "
        f"pool usage mean {_pct(kv['mean_pool_usage'])}, peak {_pct(kv['peak_pool_usage'])}",
        f"preemption {p['total']} ({p['recompute']} recompute, {p['swap']} swap); "
        f"{p['swapped_out']} swapped out, {p['swapped_in']} swapped in",
        f"fairness   Jain's index {_num(f['jain_index'], 3)} over normalised latency; longest wait "
        f"{_ms(f['longest_wait_s'])} ms (request {f['longest_wait_request']})",
    ]
    g = summary.get("goodput")
    if g:
        lines.append(
            f"goodput    {g['requests']} requests met TTFT <= {_ms(g['ttft_slo_s'])} ms and "
            f"TPOT <= {_ms(g['tpot_slo_s'])} ms ({_pct(g['fraction'])}), "
            f"{_num(g['requests_per_s'], 2)} req/s"
        )
    return "\n".join(lines)
