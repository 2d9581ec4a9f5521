"""The fleet reproductions' sections of the reproductions report: markdown tables, each
headed SIMULATED with its profile, beside the published figure, and a chart for each
(labelled as the papers' are, minicb.sim.paper_report.titled). minicb/bench/all_reproductions.py
puts them on one page with the papers'.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from minicb.fleet.fleet_reproductions import PUBLISHED
from minicb.sim.markdown_table import markdown_table
from minicb.sim.paper_report import titled


def _head(name: str, title: str, r: dict[str, Any]) -> list[str]:
    return [f"## {title} (SIMULATED, {r['profile']})", "", f"Setup: {r['setup']}.", "",
            f"Published: {PUBLISHED[name]}.", ""]  # fmt: skip


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _money(x: float | None) -> str:
    return "-" if x is None else f"${x:.3f}"


def router_section(r: dict[str, Any]) -> list[str]:
    lines = _head("router", "Replicas behind a router: prefix-aware against round-robin", r)
    header = ["policy", "output tok/s", "over round-robin", "prefix hit rate", "over round-robin",
              "prompt tokens computed", "TTFT p50 / p99", "SLO attainment"]  # fmt: skip
    rows = []
    for row in r["rows"]:
        hit_over = "-" if row["hit_over_rr"] is None else f"{row['hit_over_rr']:.2f}x"
        rows.append([
            row["policy"], f"{row['output_tok_s']:.0f}", f"{row['tok_s_over_rr']:.2f}x",
            _pct(row["hit_rate"]), hit_over, f"{row['prefill_tokens']:,}",
            f"{_ms(row['ttft_p50_s'])} / {_ms(row['ttft_p99_s'])}", _pct(row["slo_attainment"]),
        ])  # fmt: skip
    return [*lines, *markdown_table(header, rows), ""]


def _latency_table(rows: list[dict[str, Any]]) -> list[str]:
    header = ["system", "output tok/s", "TTFT p50 / p99", "TPOT p50 / p99", "SLO attainment",
              "goodput (req/s)", "GPU-hours", "$ per M output tokens", "most replicas"]  # fmt: skip
    cells = []
    for row in rows:
        good = "-" if row["goodput_req_s"] is None else f"{row['goodput_req_s']:.2f}"
        cells.append([
            row["system"], f"{row['output_tok_s']:.0f}",
            f"{_ms(row['ttft_p50_s'])} / {_ms(row['ttft_p99_s'])}",
            f"{_ms(row['tpot_p50_s'])} / {_ms(row['tpot_p99_s'])}", _pct(row["slo_attainment"]),
            good, f"{row['gpu_hours']:.3f}", _money(row["usd_per_m_output_tokens"]),
            str(row["replicas_max"]),
        ])  # fmt: skip
    return markdown_table(header, cells)


def replicas_section(r: dict[str, Any]) -> list[str]:
    lines = _head("replicas", "Replicas against one big batch at the same GPU count", r)
    return [*lines, *_latency_table(r["rows"]), ""]


def autoscale_section(r: dict[str, Any]) -> list[str]:
    lines = _head("autoscale", "Autoscaling against a load that doubles", r)
    lines += _latency_table(r["rows"])
    lines += ["", "The autoscaler's decisions (simulated seconds):", ""]
    lines += [f"- {s['time']:.0f} s: {s['action']} replica {s['replica']} ({s['reason']}); "
              f"{s['replicas']} replicas" for s in r["scaling"]] or ["- none"]  # fmt: skip
    return [*lines, ""]


def _spans(starts: list[float], bin_s: float) -> str:
    """Bins that start at ``starts`` as ranges of seconds: "60-90 s, 120-130 s"."""
    spans: list[list[float]] = []
    for t in starts:
        if spans and spans[-1][1] == t:
            spans[-1][1] = t + bin_s
        else:
            spans.append([t, t + bin_s])
    return ", ".join(f"{a:.0f}-{b:.0f} s" for a, b in spans) or "never"


def planner_section(r: dict[str, Any]) -> list[str]:
    lines = _head("planner", "Two autoscalers on a load that ramps up and down", r)
    header = ["system", "SLO attainment", "TTFT met", "TTFT p90 over target", "TPOT met",
              "TPOT p90 over target", "TTFT p50 / p99", "TPOT p50 / p99", "GPU-hours",
              "most GPUs"]  # fmt: skip
    bin_s = r["bin_s"]
    cells = [[
        row["system"], _pct(row["slo_attainment"]), _pct(row["ttft_met"]),
        f"{row['ttft_over_s']:.0f} s ({_spans(row['ttft_over_at'], bin_s)})",
        _pct(row["tpot_met"]), f"{row['tpot_over_s']:.0f} s ({_spans(row['tpot_over_at'], bin_s)})",
        f"{_ms(row['ttft_p50_s'])} / {_ms(row['ttft_p99_s'])}",
        f"{_ms(row['tpot_p50_s'])} / {_ms(row['tpot_p99_s'])}",
        f"{row['gpu_hours']:.3f}", str(row["replicas_max"]),
    ] for row in r["rows"]]  # fmt: skip
    lines += markdown_table(header, cells)
    for row in r["rows"]:
        lines += ["", f"{row['system']}: its decisions (simulated seconds):", ""]
        lines += [f"- {s['time']:.0f} s: {s['action']} {s.get('pool', 'replica')} "
                  f"{s['replica']} ({s['reason']})"
                  for s in row["scaling"]] or ["- none"]  # fmt: skip
    return [*lines, ""]


SECTIONS = {"router": router_section, "replicas": replicas_section,
            "autoscale": autoscale_section, "planner": planner_section}  # fmt: skip


def figures(results: dict[str, dict[str, Any]]) -> list[go.Figure]:
    """One chart per fleet reproduction that ran."""
    out = []
    if "router" in results:
        r, fig = results["router"], go.Figure()
        policies = [row["policy"] for row in r["rows"]]
        fig.add_bar(name="output tok/s", x=policies, y=[row["output_tok_s"] for row in r["rows"]],
                    text=[f"hit rate {row['hit_rate']:.0%}" for row in r["rows"]])  # fmt: skip
        out.append(titled(fig, r, "Router policies on multi-turn chat", "policy", "tok/s"))
    if "replicas" in results:
        r, fig = results["replicas"], go.Figure()
        names = [row["system"] for row in r["rows"]]
        for key, label in (("ttft_p50_s", "TTFT p50"), ("tpot_p50_s", "TPOT p50")):
            fig.add_bar(name=label, x=names, y=[row[key] * 1000 for row in r["rows"]])
        out.append(titled(fig, r, "Replicas against one big batch", "system", "ms"))
    if "autoscale" in results:
        r, fig = results["autoscale"], go.Figure()
        series = r["replicas_over_time"]
        fig.add_scatter(name="replicas", x=series["t"], y=series["replicas"], line_shape="hv")
        out.append(titled(fig, r, "Autoscaled replicas over time", "simulated seconds", "replicas"))
    if "planner" in results:
        r, fig = results["planner"], go.Figure()
        for name, series in r["gpus_over_time"].items():
            fig.add_scatter(name=name, x=series["t"], y=series["gpus"], line_shape="hv")
        out.append(titled(fig, r, "GPUs over time on a ramp: queue-length against SLA planner",
                          "simulated seconds", "GPUs"))  # fmt: skip
    return out
