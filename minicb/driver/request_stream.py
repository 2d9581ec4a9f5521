"""RequestStream: one request's tokens and then its end, from the engine thread to an
asyncio consumer (an OpenAI route's reply), without loss.

The engine loop opens a stream when it adds a request (engine_loop.py, ``submit``) and keeps
it among its engine's open streams (open_streams.py) until the request ends. One channel
feeds them all, the engine's bus: a ``StreamFeed`` is a listener for the ``STREAM_KINDS`` of
events; a step's ``tokens`` event gives each stream its TokenDeltas, and a ``finished``
event its final RequestOutput, put together from what the events told (the deltas add up
to the final text). The output's times are not kept here: they are the record the feed's
collector (minicb/telemetry/request_times.py) folds from the same events, which equals
the engine's own. The consumer iterates the stream in its own event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from minicb.core.events import Event
from minicb.core.request import RequestMetrics, RequestOutput, TokenDelta
from minicb.core.request_events import RequestFinished, StepTokens
from minicb.telemetry.request_times import RequestTimes, continued

# What a request's stream hears: a step's admissions (the prompt tokens found cached), its
# tokens, and its end. Its arrival is told when it opens (no listener asks for arrivals).
STREAM_KINDS = ("step", "tokens", "finished", "aborted")


@dataclass
class RequestStream:
    """One request's tokens and then its end, delivered to an asyncio consumer without loss.

    One channel feeds it: its engine's bus (``StreamFeed``). A step's ``tokens`` event
    gives it its TokenDeltas, its ``finished`` event its final RequestOutput, put together
    from what the events told (the deltas add up to the final text) with the request's
    record of its times, or an ``aborted`` event ends it with finish reason "abort". The
    engine thread ends it with "error" if a step fails.
    """

    request_id: int
    loop: asyncio.AbstractEventLoop
    prompt: str | None = None
    prompt_token_ids: list[int] = field(default_factory=list)
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
    # A moved request's record on the engine it left (its arrival, admission, first token)
    started: RequestMetrics | None = None

    def push(self, item: TokenDelta | RequestOutput) -> None:
        # Called in the engine thread; the queue belongs to the consumer's event loop.
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    # ---- fed by the engine's events, in the engine thread --------------------------------
    def token(self, delta: TokenDelta) -> None:
        self.token_ids.append(delta.token_id)
        self.texts.append(delta.text)
        self.push(delta)

    def finished(self, event: RequestFinished, record: RequestMetrics) -> None:
        """Its end: ``record`` is its times on the engine that ended it."""
        if self.started is not None:  # it began in another engine
            record = continued(self.started, record)
        text = "".join(self.texts)
        self.push(
            RequestOutput(
                self.request_id, self.prompt, self.prompt_token_ids, text,
                list(self.token_ids), event.finish_reason, record,
            )
        )  # fmt: skip

    async def __aiter__(self) -> AsyncIterator[TokenDelta | RequestOutput]:
        """Yield TokenDeltas, then the final RequestOutput, then stop."""
        while True:
            item = await self.queue.get()
            yield item
            if isinstance(item, RequestOutput):
                return


class StreamFeed:
    """The one channel of an engine's open ``streams`` (request id -> stream), a listener
    on its bus: a step's tokens feed their requests' streams; a finished event ends its
    request's stream with its output (and closes it), unless the stream is ``moving``
    (the request goes on in another engine, its record so far goes along); an aborted one
    (a client hung up, a rebuild, a failed step) with finish reason "abort". ``times``
    folds the same events into each request's record, read when it ends."""

    def __init__(self, streams: dict[int, RequestStream]) -> None:
        self.streams = streams
        self.times = RequestTimes(late=False)  # the records of the open streams' requests

    def open(self, stream: RequestStream, arrival: float | None) -> None:
        """Feed ``stream`` from now on: its request arrived at ``arrival`` (None: it moved
        here from another engine, which keeps its start)."""
        self.streams[stream.request_id] = stream
        self.times.arrived(stream.request_id, arrival, len(stream.prompt_token_ids))

    def __call__(self, events: Sequence[Event]) -> None:
        self.times(events)  # every step, streams or not: it keeps the engine's own clock
        streams = self.streams
        for event in events:
            if not streams:
                return
            if isinstance(event, StepTokens):
                for delta in event.deltas():
                    stream = streams.get(delta.request_id)
                    if stream is not None:
                        stream.token(delta)
            elif event.kind not in ("finished", "aborted") or event.request_id not in streams:
                continue
            elif isinstance(event, RequestFinished):
                record = self.times.records.pop(event.request_id)
                stream = streams[event.request_id]
                if stream.moving:  # it ends where it goes: its start goes along
                    stream.started = record
                else:
                    streams.pop(event.request_id).finished(event, record)
            else:
                rid = event.request_id
                del self.times.records[rid]
                streams.pop(rid).push(RequestOutput.ended(rid, "abort"))
