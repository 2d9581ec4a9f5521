"""FakeRunner: a runner with no model and no torch, for tests and for timing the scheduler.

Every request's n-th token is ``token_fn(request_id, n)`` (7 by default), so outputs are
known in advance (a row that verifies speculative drafts gets the tokens of the indices it
reaches: the fake's "model" does not depend on the context, so acceptance can be scripted
through ``token_fn``). ``output_lengths`` forces a request to stop after that many tokens (its
last token is then the stop token). With a ``VirtualClock``, each step advances it by the
next of ``step_times`` (or by ``step_time``): every timestamp in the events is then known
exactly, and metrics can be worked out by hand. ``step_time_fn`` instead computes each
step's time from its plan (the simulated runner's step-time model). The real engine,
scheduler, block manager and events run unchanged on top of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from minicb.core.runner import RunnerOutput, VirtualClock

if TYPE_CHECKING:
    from minicb.core.config import EngineConfig
    from minicb.core.scheduler.plan import StepPlan

FAKE_TOKEN = 7
FAKE_STOP_TOKEN = 2


def constant_token(request_id: int, index: int) -> int:
    return FAKE_TOKEN


@dataclass
class FakeRunner:
    num_kv_blocks: int = 64
    max_model_len: int = 256
    num_swap_blocks: int | None = None  # None: as many as num_kv_blocks
    vocab_size: int = 256
    token_fn: Callable[[int, int], int] = constant_token
    output_lengths: dict[int, int] = field(default_factory=dict)  # request id -> tokens
    clock: VirtualClock | None = None
    step_time: float = 0.0  # virtual seconds per step when step_times has run out
    step_times: Sequence[float] = ()
    # Seconds of a step from its plan, when step_times has run out (instead of step_time).
    step_time_fn: Callable[[StepPlan], float] | None = None
    model_name: str = "fake"
    tokenizer: Any | None = None
    stop_token_ids: list[int] = field(default_factory=lambda: [FAKE_STOP_TOKEN])
    steps: int = 0  # plans executed so far

    def __post_init__(self) -> None:
        if self.num_swap_blocks is None:
            self.num_swap_blocks = self.num_kv_blocks
        self.steps_left = list(self.step_times)  # scripted step times not used yet

    def execute(self, plan: StepPlan) -> RunnerOutput:
        self.steps += 1
        if self.steps_left:
            seconds = self.steps_left.pop(0)
        else:
            seconds = self.step_time_fn(plan) if self.step_time_fn else self.step_time
        if self.clock is not None:
            self.clock.advance(seconds)
        sampled: dict[int, int | list[int]] = {}
        for r in plan.scheduled:
            if r.samples and r.num_draft_tokens:  # the "model's" token after each position
                n = r.num_output_tokens
                sampled[r.request_id] = [
                    self._token(r.request_id, n + i) for i in range(1 + r.num_draft_tokens)
                ]
            elif r.samples:
                sampled[r.request_id] = self._token(r.request_id, r.num_output_tokens)
        return RunnerOutput(sampled, forward_s=seconds)

    def _token(self, request_id: int, index: int) -> int:
        length = self.output_lengths.get(request_id)
        if length is not None and index + 1 >= length:
            return self.stop_token_ids[0]
        return self.token_fn(request_id, index)

    def describe(self) -> dict[str, Any]:
        return {"runner": "fake", "num_kv_blocks": self.num_kv_blocks}

    def with_config(self, config: EngineConfig) -> FakeRunner:
        """The same fake for new settings: pool sizes from ``config`` where it sets them,
        and the scripted step times that are left."""
        blocks = config.num_kv_blocks or self.num_kv_blocks
        swap = config.num_swap_blocks if config.num_swap_blocks is not None else blocks
        return replace(
            self, num_kv_blocks=blocks, num_swap_blocks=swap, step_times=self.steps_left, steps=0
        )
