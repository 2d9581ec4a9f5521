"""KV reservation: how many tokens of KV cache a request is given when it is admitted.

The core's admission size (minicb/core/scheduler/hooks.py) is ``paged`` (vLLM): nothing
ahead; blocks come one at a time as tokens are written. The baselines here take more at
once, and later only what a request outgrows:

- ``max`` (Orca Max, or any contiguous-cache engine): prompt + ``max_tokens``, the worst
  case, since the output length is unknown when the request arrives.
- ``pow2`` (Orca Pow2 in the vLLM paper): prompt + the real output length rounded up to a
  power of two, so at most twice what is used.
- ``oracle`` (Orca Oracle): prompt + exactly the real output length.

The "real output length" is the request's hint, ``expected_output_tokens`` (given to
``LLMEngine.add_request``; ``max_tokens`` when absent). Nothing checks the hint: a request
that outgrows its reservation grows paged, a block at a time, like any other, and the
plan says so. A reservation never exceeds prompt + ``max_tokens`` nor the model's context.
Each mode is registered at the hook by this package's ``__init__``. Pure Python.
"""

from __future__ import annotations

from minicb.core.config import EngineConfig
from minicb.core.request import Request
from minicb.core.scheduler.block_manager import blocks_needed
from minicb.core.scheduler.hooks import Reservation


def expected_output(req: Request) -> int:
    """The output length a reservation plans for: the hint, else ``max_tokens``."""
    hint = req.expected_output_tokens
    return req.params.max_tokens if hint is None else hint


class ReservationMode:
    """An admission size that reserves prompt + an output length chosen by ``mode``."""

    def __init__(self, mode: str, config: EngineConfig) -> None:
        self.mode, self.block_size = mode, config.block_size

    def reserve(self, req: Request, num_tokens: int, max_model_len: int) -> Reservation:
        expected = expected_output(req)
        if self.mode == "max":
            output, why = req.params.max_tokens, "max"
        elif self.mode == "pow2":
            output = 1 << (expected - 1).bit_length()  # smallest power of two >= expected
            why = f"pow2: {expected} expected, rounded up"
        else:
            output, why = expected, "oracle: the expected output length"
        # Never more than the request could ever hold.
        prompt = req.num_prompt_tokens
        output = min(output, req.params.max_tokens, max_model_len - prompt)
        if prompt + output < num_tokens:  # a recompute after preemption may be past it
            words = (
                f"; already past its reservation of {prompt} + {output} tokens ({why}), "
                f"it grows paged"
            )
        else:
            blocks = blocks_needed(prompt + output, self.block_size)
            words = f"; reserves {blocks} blocks for {prompt} + {output} tokens ({why})"
        return Reservation(self.mode, prompt + output, words)

    def outgrew(self, req: Request, num_blocks: int) -> str:
        # A reservation covers every token a request can hold unless its hint was short.
        return (
            f"request {req.request_id} outgrew its {self.mode} reservation "
            f"(expected_output_tokens was too small): {num_blocks} more block(s), paged"
        )
