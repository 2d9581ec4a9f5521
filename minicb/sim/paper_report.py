"""The papers' reproductions in the report: a markdown section for each, beside the
published figures, and a plotly chart for each (``titled`` labels every chart, the fleet's
too). minicb/bench/all_reproductions.py puts these and the fleet's sections into one page.

Every heading, table and chart title says SIMULATED and names the profile: nothing here
can be mistaken for a measurement on a GPU.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from minicb.sim.markdown_table import markdown_table
from minicb.sim.paper_reproductions import PUBLISHED, SARATHI_SYSTEMS

TBT_SLO_S = 0.1  # the P99 time-between-tokens target the Sarathi capacity is read at


def _head(name: str, title: str, result: dict[str, Any]) -> list[str]:
    return [
        f"## {title} (SIMULATED, {result['profile']})",
        "",
        f"Setup: {result['setup']}.",
        "",
        f"Published: {PUBLISHED[name]}.",
        "",
    ]


def _anyscale(r: dict[str, Any]) -> list[str]:
    lines = _head("anyscale", "Anyscale: continuous batching against static", r)
    systems = list(dict.fromkeys(row["system"] for row in r["rows"]))
    rows = []
    for cap in dict.fromkeys(row["cap"] for row in r["rows"]):
        cells = [
            f"{row['output_tok_s']:.0f} tok/s ({row['over_static']:.2f}x, batch "
            f"{row['mean_batch']:.1f})"
            for row in r["rows"]
            if row["cap"] == cap
        ]
        rows.append([str(cap), *cells])
    return [*lines, *markdown_table(["cap", *systems], rows), ""]


def _vllm(r: dict[str, Any]) -> list[str]:
    lines = _head("vllm", "vLLM: Orca's reservations against paged KV", r)
    header = ["system", "mean batch", "KV holding tokens", "capacity (req/s)",
              "sustained (req/s)", "paged's rate over it", "paged's batch over it"]  # fmt: skip
    rows = [
        [row["system"], f"{row['mean_batch']:.1f}", f"{row['kv_utilisation']:.1%}",
         f"{row['req_s']:.2f}", f"{row['sustained_req_s']:.2f}",
         f"{row['paged_rate_over']:.2f}x", f"{row['paged_batch_over']:.2f}x"]
        for row in r["rows"]
    ]  # fmt: skip
    return [*lines, *markdown_table(header, rows), ""]


def sarathi_capacity(r: dict[str, Any]) -> dict[str, float | None]:
    """Per system, the highest load tested whose P99 TBT is within TBT_SLO_S."""
    out: dict[str, float | None] = {}
    for system in SARATHI_SYSTEMS:
        ok = [row["load"] for row in r["rows"] if row["system"] == system
              and row["itl_p99_s"] is not None and row["itl_p99_s"] <= TBT_SLO_S]  # fmt: skip
        out[system] = max(ok) if ok else None
    return out


def _sarathi(r: dict[str, Any]) -> list[str]:
    lines = _head("sarathi", "Sarathi-Serve: P99 time between tokens against load", r)
    rows = []
    for load in dict.fromkeys(row["load"] for row in r["rows"]):
        at = [row for row in r["rows"] if row["load"] == load]
        cells = [f"{row['itl_p99_s'] * 1000:.0f} ms" for row in at]
        rows.append([f"{load:.0%}", f"{at[0]['rate']:.2f}", *cells])
    lines += markdown_table(["load", "rate (req/s)", *SARATHI_SYSTEMS], rows)
    cap = sarathi_capacity(r)
    words = ", ".join(f"{k}: {'none' if v is None else f'{v:.0%}'}" for k, v in cap.items())
    lines += ["", f"Highest load tested within a P99 TBT of {TBT_SLO_S * 1000:.0f} ms: {words}."]
    return [*lines, ""]


def _scale(r: dict[str, Any]) -> list[str]:
    lines = _head("scale", "Static against continuous at scale", r)
    rows = [
        [mode, f"{f['output_tok_s']:.0f}", f"{f['mean_batch']:.1f}",
         f"{f['itl_p99_s'] * 1000:.0f} ms", str(f["steps"])]
        for mode, f in r["figures"].items()
    ]  # fmt: skip
    header = ["batching", "output tok/s", "mean busy slots", "P99 TBT", "steps"]
    lines += markdown_table(header, rows)
    lines += [
        "",
        f"Continuous over static: {r['measured_ratio']:.2f}x simulated (the real schedulers "
        f"on the simulated GPU); the limit case H_B = {r['harmonic_B']:.2f}.",
    ]
    return [*lines, ""]


SECTIONS = {"anyscale": _anyscale, "vllm": _vllm, "sarathi": _sarathi, "scale": _scale}


def figures(results: dict[str, dict[str, Any]]) -> list[go.Figure]:
    """One chart per paper reproduction that ran."""
    out = []
    if "anyscale" in results:
        r, fig = results["anyscale"], go.Figure()
        for system in dict.fromkeys(row["system"] for row in r["rows"]):
            rows = [row for row in r["rows"] if row["system"] == system]
            fig.add_bar(name=system, x=[str(row["cap"]) for row in rows],
                        y=[row["output_tok_s"] for row in rows])  # fmt: skip
        out.append(titled(fig, r, "Anyscale: output tok/s by max_tokens cap", "cap", "tok/s"))
    if "vllm" in results:
        r, fig = results["vllm"], go.Figure()
        names = [row["system"] for row in r["rows"]]
        fig.add_bar(name="mean batch", x=names, y=[row["mean_batch"] for row in r["rows"]])
        fig.add_bar(
            name="sustained req/s", x=names, y=[row["sustained_req_s"] for row in r["rows"]]
        )
        out.append(titled(fig, r, "vLLM: batch size and sustained rate", "system", ""))
    if "sarathi" in results:
        r, fig = results["sarathi"], go.Figure()
        for system in SARATHI_SYSTEMS:
            rows = [row for row in r["rows"] if row["system"] == system]
            tbt_ms = [row["itl_p99_s"] * 1000 for row in rows]
            fig.add_scatter(name=system, x=[row["rate"] for row in rows], y=tbt_ms,
                            mode="lines+markers")  # fmt: skip
        out.append(titled(fig, r, "Sarathi-Serve: P99 TBT against load", "req/s", "ms"))
    if "scale" in results:
        r, fig = results["scale"], go.Figure()
        for mode, series in r["occupancy"].items():
            fig.add_scatter(name=mode, x=series["t"], y=series["rows"], mode="lines")
        out.append(titled(fig, r, "Busy slots over time", "simulated seconds", "rows"))
    return out


def titled(fig: go.Figure, r: dict[str, Any], title: str, x: str, y: str) -> go.Figure:
    """The chart titled SIMULATED with the run's profile, its axes named."""
    fig.update_layout(title=f"SIMULATED ({r['profile']}): {title}", xaxis_title=x,
                      yaxis_title=y, barmode="group")  # fmt: skip
    return fig
