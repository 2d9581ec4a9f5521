"""``minicb bench --simulate``: every reproduction by name, and the one report they make.

The papers' reproductions run on the simulated runner (minicb/sim/paper_reproductions.py) and the
fleet's on simulated replicas (minicb/fleet/fleet_reproductions.py); each folder writes its own
sections and charts (sim/paper_report.py, fleet/fleet_report.py). This module stands above both
floors and joins them: one catalogue to run by name, one markdown report, one offline HTML
page of plotly charts (plotly.js inline, so it opens offline). Every heading and chart
says SIMULATED and names the profile.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Iterable
from typing import Any

import plotly.graph_objects as go

from minicb.cost_model.catalogue import load_profile
from minicb.fleet import fleet_report, fleet_reproductions
from minicb.sim import paper_report, paper_reproductions

REPRODUCTIONS: dict[str, Callable[..., dict[str, Any]]] = {
    **paper_reproductions.REPRODUCTIONS,
    **fleet_reproductions.REPRODUCTIONS,
}
SECTIONS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    **paper_report.SECTIONS,
    **fleet_report.SECTIONS,
}


def run_all(
    names: Iterable[str], profile_name: str = "H100:llama-3.1-8b", size: float = 1.0
) -> dict[str, dict[str, Any]]:
    """The named reproductions in order; ``profile_name`` is the at-scale comparison's GPU
    and model (the papers' reproductions keep their published setups). Each result says
    ``simulated`` and how long it took to compute here (``wall_s``)."""
    load_profile(profile_name)  # a bad name fails before anything runs
    results = {}
    for name in names:
        if name not in REPRODUCTIONS:
            raise ValueError(
                f"unknown reproduction {name!r}; choose from {', '.join(REPRODUCTIONS)}"
            )
        t = time.perf_counter()
        extra = {"profile_name": profile_name} if name == "scale" else {}
        result = REPRODUCTIONS[name](size, **extra)
        results[name] = {**result, "simulated": True, "wall_s": time.perf_counter() - t}
    return results


def render(results: dict[str, dict[str, Any]]) -> str:
    """Markdown: one section per reproduction that ran, in the order they ran."""
    lines = ["# Reproductions (SIMULATED: the real scheduler over a step-time model)", ""]
    for name, result in results.items():
        lines += SECTIONS[name](result)
        lines.append(f"Ran in {result['wall_s']:.1f} s of this machine's time.")
        lines.append("")
    return "\n".join(lines)


def figures(results: dict[str, dict[str, Any]]) -> list[go.Figure]:
    """One chart per reproduction that ran: the papers' first, then the fleet's."""
    return paper_report.figures(results) + fleet_report.figures(results)


def render_html(results: dict[str, dict[str, Any]], markdown: str) -> str:
    """The charts (plotly.js inline once) and the markdown, in one offline page."""
    charts = [
        fig.to_html(full_html=False, include_plotlyjs=(i == 0), default_height=460)
        for i, fig in enumerate(figures(results))
    ]
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>minicb reproductions "
        "(SIMULATED)</title></head><body><h1>minicb reproductions: SIMULATED</h1>"
        + "".join(charts)
        + f"<pre>{html.escape(markdown)}</pre></body></html>"
    )
