"""The answer to an OpenAI request, whole (a JSON body) or as server-sent events.

``Reply`` builds the bodies of one request's answer, under one id, creation time and
model; ``sse_stream`` turns its token stream into SSE chunks: a chunk per generated token,
the closing chunk (and, when asked, the usage), then ``data: [DONE]``. A stream's chunks
add up to the final text, a stop string cut off, because the engine's token deltas do (it
holds back a tail that could still begin a stop string). When the client goes away,
Starlette closes the generator before its end, and its ``finally`` hands the abort to a
plain function (awaiting inside a cancelled task is not possible), so the engine frees the
request's KV blocks at once.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from minicb.core.request import RequestOutput, TokenDelta
from minicb.driver.request_stream import RequestStream
from minicb.server.api_error import APIError

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = b"data: [DONE]\n\n"


# ---- the answers -----------------------------------------------------------------------
@dataclass
class Reply:
    """One request's answer, whole or in chunks, with one id, creation time and model:

    completion:  {"object": "text_completion", "choices": [{"text", "finish_reason"}]}
    chat:        {"object": "chat.completion", "choices": [{"message": {role, content}}]}
    chat chunk:  {"object": "chat.completion.chunk", "choices": [{"delta": {...}}]}

    ``return_token_ids`` (as vLLM has it) adds the generated ids to each choice.
    """

    chat: bool
    model: str
    include_usage: bool = False  # streaming: a last chunk with the usage
    return_token_ids: bool = False
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.id = self.id or ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]

    def _body(
        self, choices: list[dict], chunk: bool, out: RequestOutput | None = None
    ) -> dict[str, Any]:
        kind = "text_completion"
        if self.chat:
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        body = {"id": self.id, "object": kind, "created": self.created, "model": self.model}
        body["choices"] = choices
        if out is not None:
            prompt, completion = len(out.prompt_token_ids), len(out.token_ids)
            body["usage"] = dict(
                prompt_tokens=prompt,
                completion_tokens=completion,
                total_tokens=prompt + completion,
                prompt_tokens_details={"cached_tokens": out.metrics.num_cached_tokens},
            )
        elif chunk and self.include_usage:
            body["usage"] = None  # only the last chunk carries it, as OpenAI does
        return body

    def _choice(self, key: str, value: Any, finish: str | None, ids: list[int] | None) -> dict:
        choice = {"index": 0, key: value, "logprobs": None, "finish_reason": finish}
        if self.return_token_ids:
            choice["token_ids"] = list(ids or [])
        return choice

    def full(self, out: RequestOutput) -> dict[str, Any]:
        key, value = "text", out.text
        if self.chat:
            key, value = "message", {"role": "assistant", "content": out.text}
        return self._body([self._choice(key, value, out.finish_reason, out.token_ids)], False, out)

    def chunk(
        self, text: str | None, ids: list[int] | None = None, finish: str | None = None
    ) -> dict[str, Any]:
        """A stream's chunk; ``text`` None: a chat stream's first, with the role only."""
        if not self.chat:
            choice = self._choice("text", text, finish, ids)
        elif text is None:
            choice = self._choice("delta", {"role": "assistant", "content": ""}, None, ids)
        else:
            delta = {"content": text} if text or finish is None else {}
            choice = self._choice("delta", delta, finish, ids)
        return self._body([choice], chunk=True)

    def usage_chunk(self, out: RequestOutput) -> dict[str, Any]:
        return self._body([], chunk=True, out=out)


# ---- server-sent events ----------------------------------------------------------------
def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode("utf-8") + b"\n\n"


async def sse_stream(
    stream: RequestStream, reply: Reply, on_abandon: Callable[[], None]
) -> AsyncIterator[bytes]:
    """A chunk per generated token, the closing chunk (and usage), then ``[DONE]``."""
    finished = False
    try:
        if reply.chat:
            yield sse(reply.chunk(None))
        async for item in stream:
            if isinstance(item, TokenDelta):
                yield sse(reply.chunk(item.text, [item.token_id]))
                continue
            finished = True
            if item.finish_reason == "error":  # the engine failed a step; tell, then end
                error = APIError(item.text, 500, type="server_error", code="engine_error")
                yield sse(error.body())
                break
            yield sse(reply.chunk("", finish=item.finish_reason))
            if reply.include_usage:
                yield sse(reply.usage_chunk(item))
        yield DONE
    finally:
        if not finished:
            on_abandon()
