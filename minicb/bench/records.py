"""What one benchmark run leaves behind: its metrics summary and a compact step log.

Every system, minicb's or transformers', is reduced to minicb's events (for transformers
they are rebuilt from its timestamps) and measured by the same ``MetricsCollector``: one
definition of TTFT, TPOT, occupancy and the rest for all of them. ``StepLog`` keeps a few
numbers per iteration for the step-time model, the share of time outside the model and the
occupancy-over-time plot. Pure Python.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from minicb.telemetry.events import Event, StepEvent
from minicb.telemetry.metrics import MetricsCollector


@dataclass
class RunRecord:
    system: str
    workload: str
    summary: dict[str, Any]  # MetricsCollector.summary(ttft_slo, tpot_slo)
    wall_s: float  # from the start of the run to the last request's end
    steps: list[dict[str, float]] = field(default_factory=list)  # StepLog rows
    error: str | None = None  # set when the system could not run; figures are then empty

    def to_dict(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "workload": self.workload,
            "wall_s": self.wall_s,
            "error": self.error,
            "summary": self.summary,
            "steps": self.steps,
        }


def step_row(e: StepEvent, t0: float) -> dict[str, float]:
    """One iteration in numbers: when, how long, what ran, where the time went."""
    padding = [r for r in e.scheduled if r.phase == "padding"]
    # For the step-time model a row costs by its tokens, whatever its phase: one-token rows
    # (decodes, padding rows, a last one-token prompt chunk) and the tokens of longer rows.
    one_token = sum(r.num_tokens == 1 for r in e.scheduled)
    multi_tokens = sum(r.num_tokens for r in e.scheduled if r.num_tokens > 1)
    return {
        "t": e.wall_start - t0,
        "dt": e.wall_end - e.wall_start,
        "rows": len(e.scheduled),
        "useful_rows": len(e.scheduled) - len(padding),
        "padding_rows": len(padding),
        "decode_rows": one_token,
        "prefill_tokens": multi_tokens,
        "slots": e.slots_limit,
        "schedule_s": e.schedule_s,
        "forward_s": e.forward_s,
        "sample_s": e.sample_s,
    }


class StepLog:
    """A listener keeping every StepEvent it is given (subscribe it with kinds=["step"])."""

    def __init__(self) -> None:
        self.events: list[StepEvent] = []

    def __call__(self, event: Event) -> None:
        if isinstance(event, StepEvent):
            self.events.append(event)

    def rows(self, t0: float) -> list[dict[str, float]]:
        return [step_row(e, t0) for e in self.events]


def measure_events(
    events: Iterable[Event], t0: float, ttft_slo: float | None, tpot_slo: float | None
) -> tuple[dict[str, Any], list[dict[str, float]]]:
    """The metrics summary and the step log of a list of events (rebuilt ones included)."""
    metrics, log = MetricsCollector(), StepLog()
    for event in events:
        metrics(event)
        log(event)
    return metrics.summary(ttft_slo, tpot_slo), log.rows(t0)


def failed_run(system: str, workload: str, error: str) -> RunRecord:
    return RunRecord(system, workload, summary={}, wall_s=0.0, error=error)
