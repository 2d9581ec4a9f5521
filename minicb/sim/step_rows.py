"""One iteration in numbers: a step event made a row of plain figures.

A row holds the step's wall span, its rows by kind, and the totals the step-time model
reads of a plan (``STEP_TOTALS``: minicb/cost_model/step_time.py). The simulator keeps
such rows of a run (``run.py``, ``keep_steps``); the bench keeps them of every measured
run (minicb/bench/: the share of time outside the model, occupancy over time), and its
calibration fits the ``cpu`` profile to them. It lives here, on the lowest floor that
reads it, so that the simulator needs nothing from the bench above it.
"""

from __future__ import annotations

from minicb.core.events import StepEvent
from minicb.cost_model.step_time import plan_rows, step_totals

STEP_TOTALS = ("tokens", "sampling_rows", "context_tokens", "attended_pairs")


def step_row(e: StepEvent, t0: float) -> dict[str, float]:
    """One iteration in numbers, for the step-time model, the share of time outside the
    model and the occupancy-over-time plot."""
    rows = e.plan.scheduled
    padding = sum(r.phase == "padding" for r in rows)
    return {
        "t": e.wall_start - t0,
        "dt": e.wall_end - e.wall_start,
        "rows": len(rows),
        "useful_rows": len(rows) - padding,
        "padding_rows": padding,
        # A row costs by its tokens, whatever its phase: one-token rows (decodes, padding
        # rows, a last one-token prompt chunk) and the tokens of longer rows.
        "decode_rows": sum(r.num_tokens == 1 for r in rows),
        "prefill_tokens": sum(r.num_tokens for r in rows if r.num_tokens > 1),
        "slots": e.plan.slots_limit,
        # What the simulated runner's step-time model reads of a step (calibration.py).
        **dict(zip(STEP_TOTALS, step_totals(plan_rows(rows)), strict=True)),
        "schedule_s": e.schedule_s,
        "forward_s": e.forward_s,
        "sample_s": e.sample_s,
    }
