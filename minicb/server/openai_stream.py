"""Server-sent events for one request: a chunk per generated token, then ``data: [DONE]``.

Two things make a stream correct rather than merely fast:

- Stop strings. The engine cuts the text where a stop string begins, but a stop string
  can span several tokens, and its first half would already have been sent. So the last
  ``len(longest stop) - 1`` characters are held back until the next token shows they
  do not begin a stop string; the final output (already cut) settles the rest.
- Disconnects. When the client goes away, Starlette cancels the response, and this
  generator is closed without reaching its end: the ``finally`` then hands the abort to
  ``on_abandon`` (a plain function: awaiting inside a cancelled task is not possible), so
  the engine drops the request at its next iteration and frees its KV blocks.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from minicb.request import RequestOutput, TokenDelta
from minicb.server.engine_loop import RequestStream
from minicb.server.openai_errors import error_body
from minicb.server.openai_responses import Reply

DONE = b"data: [DONE]\n\n"


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode("utf-8") + b"\n\n"


class TextHoldback:
    """Streams text while keeping back a tail that may still become a stop string."""

    def __init__(self, stops: list[str]) -> None:
        self.keep = max((len(s) for s in stops), default=1) - 1
        self.seen = ""  # every character the engine has streamed so far
        self.sent = 0  # how many of them went to the client

    def push(self, text: str) -> str:
        self.seen += text
        upto = len(self.seen) - self.keep
        if upto <= self.sent:
            return ""
        out, self.sent = self.seen[self.sent : upto], upto
        return out

    def finish(self, final_text: str) -> str:
        """What is left of the final (stop-cut) text once the sent part is taken off."""
        sent = self.seen[: self.sent]
        return final_text[len(sent) :] if final_text.startswith(sent) else ""


def failure_event(out: RequestOutput) -> bytes:
    return sse(error_body(out.text, type="server_error", code="engine_error"))


async def sse_stream(
    stream: RequestStream,
    reply: Reply,
    stops: list[str],
    on_abandon: Callable[[], None],
) -> AsyncIterator[bytes]:
    finished = False
    try:
        opening = reply.role_chunk()
        if opening is not None:
            yield sse(opening)
        hold = TextHoldback(stops)
        async for item in stream:
            if isinstance(item, TokenDelta):
                yield sse(reply.chunk(hold.push(item.text), [item.token_id]))
                continue
            finished = True
            if item.finish_reason == "error":  # the engine failed a step; tell, then end
                yield failure_event(item)
                break
            tail = hold.finish(item.text)
            yield sse(reply.chunk(tail, finish_reason=item.finish_reason))
            if reply.include_usage:
                yield sse(reply.usage_chunk(item))
        yield DONE
    finally:
        if not finished:
            on_abandon()
