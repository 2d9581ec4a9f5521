"""The JSON shapes minicb answers with: OpenAI completions and chat completions.

One ``Reply`` per request builds its whole answer (non-streaming) or its chunks
(streaming), so that the id, the creation time and the model name are the same in every
chunk of one request, as clients expect.

    completion:  {"object": "text_completion", "choices": [{"text", "finish_reason"}]}
    chat:        {"object": "chat.completion", "choices": [{"message": {role, content}}]}
    chat chunk:  {"object": "chat.completion.chunk", "choices": [{"delta": {...}}]}

``return_token_ids`` (an extension, as vLLM has it) adds the generated token ids to each
choice: useful with models that have no tokenizer, where the text is empty.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from minicb.request import RequestOutput


def usage(out: RequestOutput) -> dict[str, int]:
    prompt, completion = len(out.prompt_token_ids), len(out.token_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


@dataclass
class Reply:
    chat: bool  # chat completion, or plain completion
    model: str
    include_usage: bool = False  # streaming: a last chunk with the usage
    return_token_ids: bool = False
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]

    def _envelope(self, choices: list[dict[str, Any]], chunk: bool) -> dict[str, Any]:
        if self.chat:
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        body = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if chunk and self.include_usage:
            body["usage"] = None  # only the last chunk carries it, as OpenAI does
        return body

    # ---- one answer ----------------------------------------------------------------------
    def full(self, out: RequestOutput) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": out.text}
        else:
            choice["text"] = out.text
        choice.update(logprobs=None, finish_reason=out.finish_reason)
        if self.return_token_ids:
            choice["token_ids"] = list(out.token_ids)
        body = self._envelope([choice], chunk=False)
        body["usage"] = usage(out)
        return body

    # ---- streaming chunks ----------------------------------------------------------------
    def role_chunk(self) -> dict[str, Any] | None:
        """Chat streams open with the assistant's role and no content yet."""
        if not self.chat:
            return None
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}}
        return self._envelope([{**choice, "logprobs": None, "finish_reason": None}], True)

    def chunk(
        self, text: str, token_ids: list[int] | None = None, finish_reason: str | None = None
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["delta"] = {"content": text} if text or finish_reason is None else {}
        else:
            choice["text"] = text
        choice.update(logprobs=None, finish_reason=finish_reason)
        if self.return_token_ids:
            choice["token_ids"] = token_ids or []
        return self._envelope([choice], chunk=True)

    def usage_chunk(self, out: RequestOutput) -> dict[str, Any]:
        body = self._envelope([], chunk=True)
        body["usage"] = usage(out)
        return body
