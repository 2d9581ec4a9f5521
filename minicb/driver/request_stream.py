"""RequestStream: one request's tokens and then its end, from the engine thread to an
asyncio consumer (an OpenAI route's reply), without loss.

The engine loop opens a stream when it adds a request (engine_loop.py, ``submit``) and keeps
it among its engine's open streams (open_streams.py) until the request ends. One channel
feeds them all, the engine's bus: ``feed_streams`` is a listener for the ``STREAM_KINDS`` of
events; a step's admission stamps the request's first scheduling, its ``tokens`` event the
request's TokenDeltas, and its ``finished`` event its final RequestOutput, put together from
what the events told (the deltas add up to the final text). The consumer iterates the
stream in its own event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from minicb.core.events import Event, StepEvent
from minicb.core.request import RequestMetrics, RequestOutput, TokenDelta
from minicb.core.request_events import RequestFinished, StepTokens

# What a request's stream hears: its first admission (the prompt tokens found in the prefix
# cache), its tokens, and its end.
STREAM_KINDS = ("step", "tokens", "finished", "aborted")


@dataclass
class RequestStream:
    """One request's tokens and then its end, delivered to an asyncio consumer without loss.

    One channel feeds it: its engine's bus. A step's ``tokens`` event gives it its
    TokenDeltas, its ``finished`` event its final RequestOutput, put together from what the
    events told (the deltas add up to the final text), or an ``aborted`` event ends it with
    finish reason "abort". The engine thread ends it with "error" if a step fails.
    """

    request_id: int
    loop: asyncio.AbstractEventLoop
    prompt: str | None = None
    prompt_token_ids: list[int] = field(default_factory=list)
    arrival_time: float = 0.0
    # the engine that holds the request (a fleet's: the replica it was routed to)
    engine: str = ""
    # Its engine's end is not its end: the request goes on in another engine, which the
    # stream moves to (OpenStreams.hold, move: disaggregated serving).
    moving: bool = False
    # Its client hung up while it was moving: the abort is applied where it lands.
    aborted: bool = False
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    token_ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    metrics: RequestMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = RequestMetrics(
            self.arrival_time, num_prompt_tokens=len(self.prompt_token_ids)
        )

    def push(self, item: TokenDelta | RequestOutput) -> None:
        # Called in the engine thread; the queue belongs to the consumer's event loop.
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    # ---- fed by the engine's events, in the engine thread --------------------------------
    def admitted(self, time: float, num_cached_tokens: int) -> None:
        if self.metrics.first_scheduled_time is None:  # the first admission only
            self.metrics.first_scheduled_time = time
            self.metrics.num_cached_tokens = num_cached_tokens

    def token(self, delta: TokenDelta, time: float) -> None:
        if self.metrics.first_token_time is None:
            self.metrics.first_token_time = time
        self.token_ids.append(delta.token_id)
        self.texts.append(delta.text)
        self.push(delta)

    def finished(self, event: RequestFinished) -> None:
        m = self.metrics
        m.finished_time = event.time
        m.num_generated_tokens = event.num_output_tokens
        m.num_preemptions = event.num_preemptions
        m.num_draft_tokens = event.num_draft_tokens
        m.num_accepted_tokens = event.num_accepted_tokens
        text = "".join(self.texts)
        ids = list(self.token_ids)
        prompt_ids = self.prompt_token_ids
        self.push(
            RequestOutput(
                self.request_id, self.prompt, prompt_ids, text, ids, event.finish_reason, m
            )
        )

    async def __aiter__(self) -> AsyncIterator[TokenDelta | RequestOutput]:
        """Yield TokenDeltas, then the final RequestOutput, then stop."""
        while True:
            item = await self.queue.get()
            yield item
            if isinstance(item, RequestOutput):
                return


def feed_streams(streams: dict[int, RequestStream], events: Sequence[Event]) -> None:
    """The one channel of an engine's open ``streams`` (request id -> stream), a listener
    on its bus: a step's admissions and tokens feed their requests' streams; a finished
    event ends its request's stream with its output (and closes it), unless the stream is
    ``moving`` (the request goes on in another engine); an aborted one (a client hung up,
    a rebuild, a failed step) with finish reason "abort"."""
    for event in events:
        if not streams:
            return
        if isinstance(event, StepEvent):
            for d in event.plan.admitted:
                stream = streams.get(d.request_id)
                if stream is not None:
                    stream.admitted(event.wall_start, d.num_cached_tokens)
        elif isinstance(event, StepTokens):
            for delta in event.deltas():
                stream = streams.get(delta.request_id)
                if stream is not None:
                    stream.token(delta, event.time)
        elif event.request_id not in streams:
            continue
        elif isinstance(event, RequestFinished):
            if not streams[event.request_id].moving:  # a moving one ends where it goes
                streams.pop(event.request_id).finished(event)
        else:
            rid = event.request_id
            streams.pop(rid).push(RequestOutput.ended(rid, "abort"))
