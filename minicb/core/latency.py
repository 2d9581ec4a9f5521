"""The one definition of each latency figure, and the small statistics over them.

Read by RequestMetrics (a finished request's output), MetricsCollector (summaries of live
runs and traces) and PrometheusMetrics (histograms); the visualizer's live figures follow
the same definitions, written out in docs/events.md. Percentiles interpolate linearly
between ranks, as numpy's default does, in pure Python so that metrics need no numpy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


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


# ---- small descriptive statistics --------------------------------------------------------
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
