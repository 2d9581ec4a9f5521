"""TokenizerQueue: the OpenAI routes' one tokenizer thread, and the two bounds at its door.

Prompts are tokenized in a thread of their own (one, so they queue there in turn), beside
the engine's: a megabyte of text costs its sender the wait, never a running stream a step.
But one thread is one queue, and a request of two tokens waited there behind every long
prompt sent before it (0.15 s alone, 4-7 s behind ten prompts of a MiB that were all
refused once tokenized). So:

- **A prompt that could never fit is refused by its length, before it is tokenized.** The
  rule: no token covers more than L characters, L being the longest entry of the
  tokenizer's vocabulary as stored (a byte-level BPE entry holds one character per byte, a
  SentencePiece piece its characters; a character is at least one byte). A prompt of N
  characters is then at least N / L tokens, and one of more than ``context x L``
  characters cannot fit the context: 400, naming that limit. (SmolLM2-135M: L = 81 and a
  context of 8,192 tokens, so 663,552 characters.) The rule needs a tokenizer that deletes
  no characters before splitting (byte-level BPE and SentencePiece delete none); one with
  no vocabulary to read (a test's fake) gets no bound by length. A fleet (replicas, or
  prefill and decode engines) shows its engines' tokenizer, loaded in this process, and
  its context: the same rule. Token-id prompts need no tokenizing: the engine counts them.
- **At most ``max_chars`` characters of text wait for the tokenizer or are in it.** What
  holds a short request back is the text queued before it, not how many requests sent it:
  a class of fifty sending a short chat each at once queues a few thousand characters and
  passes; a few near-limit prompts fill the door, and the next text gets 429
  ``tokenizer_busy`` naming the limit, with ``Retry-After``, as the waiting gate answers a
  full engine queue (TGI bounds its validation queue the same way). A text arriving at an
  empty door is always taken: the length rule above already bounds it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from minicb.server.api_error import APIError, busy

# Characters of text waiting for the tokenizer or in it: three prompts at SmolLM2's length
# limit (663,552 characters), a few seconds of one tokenizer thread.
MAX_TOKENIZING_CHARS = 2 << 20


def longest_token(tokenizer: Any) -> int | None:
    """The most characters one token can cover (see the module's rule), or None for a
    tokenizer with no vocabulary to read."""
    vocab = getattr(tokenizer, "get_vocab", None)
    if vocab is None:
        return None
    return max((len(entry) for entry in vocab()), default=None)


@dataclass(eq=False)
class TokenizerQueue:
    """The tokenizer's thread, the text waiting for it, and its bounds."""

    max_chars: int = MAX_TOKENIZING_CHARS
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="minicb-tokenizer")
    )
    waiting_chars: int = 0  # text waiting for the tokenizer or in it (the event loop's count)
    # The tokenizer last read and its longest token (read once: 0.1 s for 49,152 entries).
    _read: tuple[Any, int | None] = (None, None)

    def check_length(self, engine: Any, num_chars: int, param: str) -> None:
        """400 for a text of ``num_chars`` characters that could never fit ``engine``'s
        context, before any tokenizing (the module's rule)."""
        tokenizer = getattr(engine, "tokenizer", None)
        if tokenizer is None:
            return
        if self._read[0] is not tokenizer:
            self._read = (tokenizer, longest_token(tokenizer))
        longest, context = self._read[1], engine.max_model_len
        if longest is None or num_chars <= context * longest:
            return
        raise APIError(
            f"{param} of {num_chars} characters cannot fit the model's context of {context} "
            f"tokens: a token here covers at most {longest} characters, so the limit is "
            f"{context * longest} characters (refused before tokenizing)",
            param=param,
            code="context_length_exceeded",
        )

    async def run(self, tokenize: Callable[[], list[int]], num_chars: int, param: str) -> list[int]:
        """``tokenize()`` (a text of ``num_chars`` characters) in the tokenizer's thread, or
        429 when it would take the text waiting there past ``max_chars``. A refusal from the
        tokenizer (no tokenizer, no chat template, an id outside the vocabulary) is a 400."""
        if self.waiting_chars and self.waiting_chars + num_chars > self.max_chars:
            raise busy(
                f"the tokenizer is busy ({self.waiting_chars} characters of text wait for it, "
                f"and {num_chars} more would pass the limit of {self.max_chars})",
                "tokenizer_busy",
            )
        self.waiting_chars += num_chars
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, tokenize)
        except ValueError as err:
            raise APIError(str(err), param=param) from err
        finally:
            self.waiting_chars -= num_chars
