"""Request: one prompt's journey through the engine, its stop checks, and what it returns.

Pure Python. The scheduler moves requests between queues by changing ``status``; the
runner reads ``all_token_ids`` and ``num_computed_tokens`` through the StepPlan. Stop
strings are matched on the decoded text, which is cut before the stop string, as the
OpenAI API does. A finished request is handed back as a ``RequestOutput``; each new token
on the way as a ``TokenDelta``.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from minicb.core import latency
from minicb.core.config import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # not admitted yet, or preempted by recompute
    RUNNING = "running"  # holds KV blocks on the device
    SWAPPED = "swapped"  # its KV blocks are in the CPU swap space
    FINISHED_STOPPED = "finished_stopped"  # stop token or stop string
    FINISHED_LENGTH = "finished_length"  # reached max_tokens or the context limit
    FINISHED_ABORTED = "finished_aborted"

    @property
    def finished(self) -> bool:
        return self.value.startswith("finished")


FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


@dataclass
class RequestMetrics:
    """A request's times (seconds, engine clock) and counters: the one record of them.

    The engine fills its requests' records in the step (output_processor.py); a reader
    of the events gets the same record from the collector that folds them
    (minicb/telemetry/request_times.py). Both stamp through the methods below: one rule
    for each time."""

    # None only in a collector that heard of the request after it arrived
    arrival_time: float | None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    # Speculative decoding: draft tokens verified for this request, and those kept as output.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # The engine's own clock (LLMEngine.busy_s) at arrival and at the first token's step end,
    # for a page that joins mid-run (the wall clock would charge it other engines' steps).
    arrival_busy_s: float = 0.0
    first_token_busy_s: float | None = None

    @property
    def ttft(self) -> float | None:
        if self.first_token_time is None or self.arrival_time is None:
            return None
        return latency.ttft(self.arrival_time, self.first_token_time)

    # ---- the stamps: each time by one rule ----------------------------------------------
    def scheduled(self, time: float, num_cached_tokens: int) -> None:
        """Admitted at ``time`` (its step's start), with ``num_cached_tokens`` of its
        prompt found in the prefix cache; a readmission after preemption changes nothing."""
        if self.first_scheduled_time is None:
            self.first_scheduled_time = time
            self.num_cached_tokens = num_cached_tokens

    def first_token(self, time: float, busy_s: float | None) -> None:
        """Its first token was ready at ``time`` (its step's end; ``busy_s``: the engine's
        own clock then)."""
        if self.first_token_time is None:
            self.first_token_time = time
            self.first_token_busy_s = busy_s

    def ended(self, time: float) -> None:
        """It finished at ``time`` (its last step's end)."""
        self.finished_time = time


@dataclass
class Request:
    request_id: int
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    priority: int = 0  # lower value is served first, as in vLLM
    prompt: str | None = None
    # A hint: the output length the KV reservation modes plan for (None: max_tokens).
    expected_output_tokens: int | None = None
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    # Tokens whose K/V are in the cache. The next step computes from here on.
    num_computed_tokens: int = 0
    # Iteration at which it arrived: priority aging counts from here, so a preempted
    # request keeps its age.
    arrival_step: int = 0
    metrics: RequestMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = RequestMetrics(
            arrival_time=self.arrival_time, num_prompt_tokens=len(self.prompt_token_ids)
        )

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """``all_token_ids[start:end]`` without building the whole list (a decode needs one)."""
        n_prompt = len(self.prompt_token_ids)
        if start >= n_prompt:
            return self.output_token_ids[start - n_prompt : end - n_prompt]
        if end <= n_prompt:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n_prompt]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens still to run through the model before the next token can be sampled."""
        # num_tokens spelled out: read for every running request at every step.
        return len(self.prompt_token_ids) + len(self.output_token_ids) - self.num_computed_tokens

    @property
    def in_prefill(self) -> bool:
        """More than one token uncomputed: a prompt, or a recompute after preemption."""
        return self.num_uncomputed_tokens > 1

    @property
    def max_total_tokens(self) -> int:
        return self.num_prompt_tokens + self.params.max_tokens

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)

    @property
    def finished(self) -> bool:
        return self.status.finished

    def check_stop(self, eos_token_ids: list[int], max_model_len: int) -> RequestStatus | None:
        """Token-level stops, after a new token was appended: EOS, stop ids, length."""
        last = self.output_token_ids[-1]
        if not self.params.ignore_eos and last in eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if last in self.params.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if len(self.output_token_ids) >= self.params.max_tokens or self.num_tokens >= max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None


@dataclass
class RequestOutput:
    """A finished request: its text, tokens, why it stopped, and its times."""

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


@dataclass(slots=True)  # one per token per step: keep it light
class TokenDelta:
    """One new token of one request, with the text it adds (may be "" mid-character)."""

    request_id: int
    token_id: int
    text: str
    index: int  # 0 for the first generated token
