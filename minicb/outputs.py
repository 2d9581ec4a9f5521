"""What the engine hands back: finished outputs and per-step results."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from minicb.request import RequestMetrics
from minicb.scheduler.plan import StepPlan


@dataclass
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    metrics: RequestMetrics

    @classmethod
    def ended(cls, request_id: int, finish_reason: str, text: str = "") -> RequestOutput:
        """A final output for a stream that ends without tokens (abort, engine error)."""
        return cls(request_id, None, [], text, [], finish_reason, RequestMetrics(time.time()))


@dataclass
class TokenDelta:
    """One new token of one request, with the text it adds (may be "" mid-character)."""

    request_id: int
    token_id: int
    text: str
    index: int  # 0 for the first generated token


@dataclass
class StepResult:
    """Everything one ``LLMEngine.step()`` did: the plan, its tokens, who finished, timings."""

    plan: StepPlan
    new_tokens: list[TokenDelta] = field(default_factory=list)
    finished: list[RequestOutput] = field(default_factory=list)
    wall_start: float = 0.0
    wall_end: float = 0.0
    schedule_s: float = 0.0
    forward_s: float = 0.0
    sample_s: float = 0.0
