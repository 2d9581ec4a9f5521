"""KV reservation: how many tokens of KV cache a request is given when it is admitted.

The continuous scheduler asks the block manager, at admission, for room for
``reservation(...)`` tokens at once, and later only for what a request outgrows:

- ``paged`` (vLLM): nothing ahead; blocks come one at a time as tokens are written.
- ``max`` (Orca Max, or any contiguous-cache engine): prompt + ``max_tokens``, the worst
  case, since the output length is unknown when the request arrives.
- ``pow2`` (Orca Pow2 in the vLLM paper): prompt + the real output length rounded up to a
  power of two, so at most twice what is used.
- ``oracle`` (Orca Oracle): prompt + exactly the real output length.

The "real output length" is the request's hint, ``expected_output_tokens`` (given to
``LLMEngine.add_request``; ``max_tokens`` when absent). Nothing checks the hint: a request
that outgrows its reservation grows paged, a block at a time, like any other, and the
plan says so. A reservation never exceeds prompt + ``max_tokens`` nor the model's context.
Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from minicb.core.config import KV_RESERVATIONS
from minicb.core.request import Request
from minicb.core.scheduler.block_manager import blocks_needed


@dataclass(frozen=True)
class Reservation:
    """What a request is given at admission: ``prompt + output`` tokens of KV cache."""

    mode: str
    prompt: int  # prompt tokens
    output: int  # output tokens reserved beyond the prompt
    why: str  # how ``output`` was chosen, in words

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.output

    def words(self, block_size: int) -> str:
        """'reserves 40 blocks for 512 + 128 tokens (max)'."""
        blocks = blocks_needed(self.num_tokens, block_size)
        return f"reserves {blocks} blocks for {self.prompt} + {self.output} tokens ({self.why})"


def expected_output(req: Request) -> int:
    """The output length a reservation plans for: the hint, else ``max_tokens``."""
    hint = req.expected_output_tokens
    return req.params.max_tokens if hint is None else hint


def reservation(mode: str, req: Request, max_model_len: int) -> Reservation | None:
    """The reservation ``mode`` makes for ``req`` at admission; None for ``paged``."""
    if mode == "paged":
        return None
    expected = expected_output(req)
    if mode == "max":
        output, why = req.params.max_tokens, "max"
    elif mode == "pow2":
        output = 1 << (expected - 1).bit_length()  # smallest power of two >= expected
        why = f"pow2: {expected} expected, rounded up"
    elif mode == "oracle":
        output, why = expected, "oracle: the expected output length"
    else:
        choices = ", ".join(KV_RESERVATIONS)
        raise ValueError(f"unknown kv_reservation {mode!r}; choose one of {choices}")
    # Never more than the request could ever hold.
    prompt = req.num_prompt_tokens
    output = min(output, req.params.max_tokens, max_model_len - prompt)
    return Reservation(mode, prompt, output, why)
