"""What a caller gives becomes a request's inputs: token ids the model knows, a checked hint.

A prompt is text (encoded by the model's tokenizer), a list of token ids (each checked
against the vocabulary) or a conversation (laid out by the model's chat template). What
cannot become a request is refused with ``RequestRejected``, naming why. The output side,
tokens back to text, is output_processor.py.
"""

from __future__ import annotations

from typing import Any

from minicb.core.scheduler import RequestRejected


def check_hint(expected: int | None, max_tokens: int) -> None:
    """Raise RequestRejected unless ``expected`` (a request's expected output length, which
    KV reservation modes plan for) is None or an int in [1, max_tokens]."""
    if expected is None:
        return
    if not isinstance(expected, int) or isinstance(expected, bool) or expected < 1:
        raise RequestRejected(
            f"expected_output_tokens must be a positive integer, got {expected!r}"
        )
    if expected > max_tokens:
        raise RequestRejected(
            f"expected_output_tokens={expected} exceeds max_tokens={max_tokens}: a request "
            f"never generates more than max_tokens"
        )


class InputProcessor:
    """One model's tokenizer (None: the model folder has none) and vocabulary size."""

    def __init__(self, tokenizer: Any | None, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        """A prompt's token ids: the text encoded, or the ids checked."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestRejected("this model folder has no tokenizer; give token ids")
            return self.tokenizer.encode(prompt, add_special_tokens=False)
        ids = list(prompt)
        vocab = self.vocab_size
        bad = [
            t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab
        ]
        if bad:
            raise RequestRejected(
                f"token id {bad[0]!r} is outside the vocabulary of {vocab} tokens"
            )
        return ids

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a conversation in the model's chat template, ready for the reply."""
        from jinja2 import TemplateError

        if not messages:
            raise RequestRejected("messages is empty; give at least one message")
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise RequestRejected("this model has no chat template; give a plain prompt instead")
        try:
            ids = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True
            )
        except TemplateError as err:  # e.g. a template that insists that roles alternate
            raise RequestRejected(f"the chat template refused these messages: {err}") from err
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # some versions wrap the ids
            ids = ids["input_ids"]
        return list(ids)
