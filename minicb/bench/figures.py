"""From run summaries to the figures the report shows: medians with min and max, ratios.

Each measured run leaves a minicb metrics summary; ``FIGURES`` names the numbers taken
from it. Over the repeats of one system on one workload each figure becomes its median,
minimum and maximum. Ratios between two systems are taken repeat by repeat (the systems
alternate within each repeat, so a pair shares the machine's mood) and then summarised
the same way. Pure Python.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from minicb.bench.records import RunRecord

_LAT = ("ttft", "tpot", "itl", "e2e")
# figure key -> path into a metrics summary
FIGURES: dict[str, tuple[str, ...]] = {
    "output_tok_s": ("throughput", "output_tokens_per_s"),
    "total_tok_s": ("throughput", "total_tokens_per_s"),
    "req_s": ("throughput", "requests_per_s"),
    **{f"{name}_{q}": ("latency", f"{name}_s", q) for name in _LAT for q in ("p50", "p90", "p99")},
    "slot_occupancy": ("batch", "slot_occupancy"),
    "padding_waste": ("batch", "padding_waste"),
    "kv_utilisation": ("kv", "utilisation"),
    "preemptions": ("preemptions", "total"),
    "goodput_req_s": ("goodput", "requests_per_s"),
    "goodput_fraction": ("goodput", "fraction"),
}


def lookup(summary: dict[str, Any], path: tuple[str, ...]) -> float | None:
    """The number at ``path``, or None where the summary has none (a system that does not
    expose it, an empty distribution)."""
    node: Any = summary
    for key in path:
        if not isinstance(node, dict) or node.get(key) is None:
            return None
        node = node[key]
    return float(node) if isinstance(node, int | float) else None


def spread(values: Iterable[float | None]) -> dict[str, float] | None:
    """Median, min, max and count of the values present; None when there are none."""
    v = [x for x in values if x is not None]
    if not v:
        return None
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def figures_of(record: RunRecord) -> dict[str, float | None]:
    """Every figure of one run (empty for a run that failed)."""
    if record.error:
        return {}
    out = {key: lookup(record.summary, path) for key, path in FIGURES.items()}
    out["wall_s"] = record.wall_s
    return out


def aggregate(records: list[RunRecord]) -> dict[str, dict[str, float] | None]:
    """Each figure over the repeats: median, min, max."""
    per_run = [figures_of(r) for r in records if not r.error]
    keys = list(FIGURES) + ["wall_s"]
    return {k: spread(f.get(k) for f in per_run) for k in keys}


def paired_ratio(
    a: list[RunRecord], b: list[RunRecord], key: str = "output_tok_s"
) -> dict[str, float] | None:
    """``a``'s figure over ``b``'s, repeat by repeat (repeat i with repeat i)."""
    ratios = []
    for ra, rb in zip(a, b, strict=False):
        fa, fb = figures_of(ra).get(key), figures_of(rb).get(key)
        if fa is not None and fb:
            ratios.append(fa / fb)
    return spread(ratios)


def ratio_table(runs: dict[str, list[RunRecord]], key: str = "output_tok_s") -> dict[str, Any]:
    """Every ordered pair of systems that both ran: 'x / y' -> paired ratio of ``key``."""
    table = {}
    names = [n for n, recs in runs.items() if any(not r.error for r in recs)]
    for x in names:
        for y in names:
            if x != y:
                table[f"{x} / {y}"] = paired_ratio(runs[x], runs[y], key)
    return table
