"""What a MetricsCollector keeps: one record per request and the sums over every step,
updated event by event (minicb.telemetry.metrics) and read by the summary
(minicb.telemetry.summary). Pure Python: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    """What the events told us about one request."""

    arrival: float | None = None
    admitted: float | None = None  # first admission
    token_times: list[float] = field(default_factory=list)
    finished: float | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    aborted: bool = False
    wait_from: float | None = None  # start of the current wait; None while running
    waited: float = 0.0

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
