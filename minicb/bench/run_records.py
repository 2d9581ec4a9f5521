"""One run's record, and the figures read off it.

A ``RunRecord`` is what every run of the suite leaves behind, whatever system ran: its
events measured by minicb's one ``MetricsCollector`` (``summary``), its wall time, each
step's row, its span, or why it could not run. ``FIGURES`` names the numbers the suite
compares and where each sits in a summary; ``lookup`` reads one (None where a system does
not expose it). The bench's driver makes records (``run_record``, in ``__init__.py``) and
its sanity checks read them (sanity.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    "prefill_tokens": ("prefix_cache", "prefill_tokens"),  # prompt tokens computed
    "prefix_hit_rate": ("prefix_cache", "hit_rate"),  # prompt tokens found cached / looked up
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


@dataclass
class RunRecord:
    system: str
    workload: str
    summary: dict[str, Any] = field(default_factory=dict)  # MetricsCollector.summary(...)
    wall_s: float = 0.0  # from the start of the run to the last request's end
    steps: list[dict[str, float]] = field(default_factory=list)  # step_row of each iteration
    # The first and the last of its events, in seconds from the start of the run: within
    # [0, wall_s] in any correct run (minicb.bench.sanity checks it).
    span: tuple[float, float] = (0.0, 0.0)
    error: str | None = None  # set when the system could not run; figures are then empty

    @property
    def figures(self) -> dict[str, float | None]:
        """Every figure of the run (none for a run that failed)."""
        figures = {k: lookup(self.summary, path) for k, path in FIGURES.items()}
        return {} if self.error else {**figures, "wall_s": self.wall_s}
