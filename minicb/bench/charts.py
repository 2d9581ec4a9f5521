"""The HTML page of one ``minicb bench`` run: plotly charts with plotly.js embedded, so it
opens offline, then the report's markdown tables (report.py).

Charts: output tokens/s per workload and system; decode tokens/s against batch size with
the measured hardware ceiling and the linear layers alone; latency against request rate;
slot occupancy over time of the headline workload, static beside continuous.
"""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

COLORS = {"minicb-continuous": "#1f77b4", "minicb-static": "#ff7f0e", "hf-padded": "#2ca02c",
          "hf-continuous": "#d62728", "minicb-static-sorted": "#9467bd"}  # fmt: skip


def throughput_bars(results: dict[str, Any]) -> go.Figure:
    fig = go.Figure(layout=dict(title="Output tokens/s by workload (median, whiskers min-max)",
                                barmode="group", yaxis_title="output tokens/s"))  # fmt: skip
    systems = {s for w in results["workloads"].values() for s in w["figures"]}
    for system in [s for s in COLORS if s in systems]:
        names, med, lo, hi = [], [], [], []
        for name, w in results["workloads"].items():
            cell = (w["figures"].get(system) or {}).get("output_tok_s")
            if cell:
                names.append(name)
                med.append(cell["median"])
                lo.append(cell["median"] - cell["min"])
                hi.append(cell["max"] - cell["median"])
        fig.add_bar(
            x=names, y=med, name=system, marker_color=COLORS[system],
            error_y=dict(type="data", symmetric=False, array=hi, arrayminus=lo),
        )  # fmt: skip
    return fig


def roofline_chart(results: dict[str, Any]) -> go.Figure:
    pts, blue = results["roofline"]["points"], COLORS["minicb-continuous"]
    fig = go.Figure(layout=dict(
        title="Decode throughput against batch size, with the measured roofline",
        xaxis=dict(title="batch size (requests decoding)", type="log"),
        yaxis=dict(title="tokens/s", type="log"),
    ))  # fmt: skip
    for key, name, line in (
        ("ceiling_tok_s", "hardware ceiling", dict(dash="dash", color="black")),
        ("linears_tok_s", "the linear layers alone", dict(dash="dashdot", color="grey")),
        ("forward_tok_s", "minicb, forward only", dict(dash="dot", color=blue)),
        ("tok_s", "minicb, whole step", dict(color=blue)),
        ("hf_tok_s", "transformers generate", dict(color=COLORS["hf-padded"])),
    ):
        if all(key in p for p in pts):
            fig.add_scatter(x=[p["batch"] for p in pts], y=[p[key] for p in pts], name=name,
                            line=line)  # fmt: skip
    return fig


def latency_chart(results: dict[str, Any]) -> go.Figure:
    fig = go.Figure(layout=dict(title="Latency against request rate (Poisson arrivals)",
                                xaxis_title="request rate (requests/s)",
                                yaxis=dict(title="seconds", type="log")))  # fmt: skip
    for system in COLORS:
        pts = [
            p for p in results["rate_sweep"]
            if p["system"] == system and p["burstiness"] == 1.0 and not p["error"]
        ]  # fmt: skip
        for key, dash in (("ttft_p50", "solid"), ("ttft_p99", "dot"), ("e2e_p50", "dash")):
            if pts:
                fig.add_scatter(
                    x=[p["rate"] for p in pts], y=[p["figures"].get(key) for p in pts],
                    name=f"{system} {key}", line=dict(color=COLORS[system], dash=dash),
                )  # fmt: skip
    return fig


def occupancy_chart(results: dict[str, Any], workload: str) -> go.Figure:
    fig = go.Figure(layout=dict(
        title=f"Slot occupancy over time, {workload} (the repeat of median duration)",
        xaxis_title="seconds from the start of the run",
        yaxis=dict(title="rows doing work / slots", range=[0, 1.05]),
    ))  # fmt: skip
    runs = results["workloads"].get(workload, {}).get("runs", {})
    for system in ("minicb-static", "minicb-static-sorted", "minicb-continuous", "hf-padded"):
        recs = sorted(
            (r for r in runs.get(system, []) if not r["error"]), key=lambda r: r["wall_s"]
        )
        if recs:
            steps = recs[(len(recs) - 1) // 2]["steps"]  # the repeat of median length
            fig.add_scatter(
                x=[s["t"] for s in steps],
                y=[s["useful_rows"] / s["slots"] if s["slots"] else None for s in steps],
                name=system, mode="lines", line=dict(shape="hv", color=COLORS[system]),
            )  # fmt: skip
    return fig


def render_html(results: dict[str, Any], markdown: str) -> str:
    headline = next(iter(results["workloads"]), "")
    figs = [throughput_bars(results)]
    if results.get("roofline", {}).get("points"):
        figs.append(roofline_chart(results))
    if results.get("rate_sweep"):
        figs.append(latency_chart(results))
    figs.append(occupancy_chart(results, headline))
    parts = [
        # plotly.js goes in once, inline, with the first chart: the file works offline.
        fig.to_html(full_html=False, include_plotlyjs=(i == 0), default_height=480)
        for i, fig in enumerate(figs)
    ]
    body = "\n".join(f"<section>{p}</section>" for p in parts)
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>minicb bench</title>"
        "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}"
        "pre{white-space:pre-wrap;font-size:12px}</style></head><body>"
        f"<h1>minicb bench</h1>{body}<h2>Tables</h2><pre>{html.escape(markdown)}</pre>"
        "</body></html>\n"
    )
