"""What a MetricsCollector keeps: one record per request and the sums over every step,
updated event by event (minicb.telemetry.metrics) and read by the summary
(minicb.telemetry.summary). Pure Python: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minicb.core.request import RequestMetrics


class RequestRecord:
    """What the collector keeps of one request: its times (``times``: the one record of
    them, as the collector of the events fills it, request_times.py, or as a request's
    journey across two engines joins it, fleet/disaggregated.py), each of its tokens'
    times (for the gaps between them), whether it was aborted, and how long it waited."""

    def __init__(self, times: RequestMetrics, token_times: list[float] | None = None) -> None:
        self.token_times = [] if token_times is None else token_times
        self.times = times
        self.aborted = False
        self.wait_from: float | None = None  # start of the current wait; None while running
        self.waited = 0.0

    # the times as the summary names them, read from the record
    @property
    def arrival(self) -> float | None:
        return self.times.arrival_time

    @property
    def admitted(self) -> float | None:  # first admission
        return self.times.first_scheduled_time

    @property
    def first_token(self) -> float | None:
        return self.times.first_token_time

    @property
    def finished(self) -> float | None:
        return self.times.finished_time

    @property
    def num_prompt_tokens(self) -> int:
        return self.times.num_prompt_tokens

    @property
    def num_output_tokens(self) -> int:
        return self.times.num_generated_tokens

    def stop_waiting(self, t: float) -> None:
        if self.wait_from is not None:
            self.waited += t - self.wait_from
            self.wait_from = None


@dataclass
class StepTotals:
    """Sums over every StepEvent."""

    count: int = 0
    useful_rows: int = 0
    slots: int = 0
    tokens: int = 0
    padding_tokens: int = 0
    budget_used: int = 0
    budget_limit: int = 0
    kv_live: int = 0
    kv_held: int = 0
    kv_last_block_slack: int = 0
    kv_usage_sum: float = 0.0
    kv_usage_peak: float = 0.0
    schedule_s: float = 0.0
    forward_s: float = 0.0
    sample_s: float = 0.0
    preempted: dict[str, int] = field(default_factory=dict)
    swapped_out: int = 0
    swapped_in: int = 0
    prefill_tokens: int = 0
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    prefix_host_hit_tokens: int = 0  # of the hits, those found in the host tier
    decode_rows: int = 0
    drafted_rows: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
