"""OpenStreams: every request stream still open, by the engine that holds its request.

The engine loop (engine_loop.py) opens a RequestStream (request_stream.py) when it adds a
request and keeps it here until the request ends. Each engine's bus feeds its own streams
(``StreamFeed``, one listener per engine); the loop ends them with an error when a step
fails or the thread ends. A request that goes on in another engine (disaggregated serving:
from a prefill engine to a decode engine, minicb/fleet/disagg_handoff.py) is held through
its first engine's end (``hold``) and takes its stream along (``move``). Everything here
runs in the engine thread.
"""

from __future__ import annotations

from minicb.core.engine_like import SteppedEngine
from minicb.core.request import RequestOutput
from minicb.driver.request_stream import STREAM_KINDS, RequestStream, StreamFeed


class OpenStreams:
    def __init__(self, engines: dict[str, SteppedEngine]) -> None:
        """``engines``: the loop's own dict (name -> engine), read at each abort, so an
        engine put in an old one's place (``EngineLoop.replace_engine``) is the one asked."""
        self.engines = engines
        self.by_engine: dict[str, dict[int, RequestStream]] = {name: {} for name in engines}
        self.feeds = {name: StreamFeed(self.by_engine[name]) for name in engines}
        for name, engine in engines.items():  # the one channel of its open streams
            engine.bus.subscribe(self.feeds[name], kinds=STREAM_KINDS)

    def add(self, stream: RequestStream, arrival: float) -> None:
        """Open ``stream``, whose request arrived at ``arrival``."""
        self.feeds[stream.engine].open(stream, arrival)

    def abort(self, stream: RequestStream) -> bool:
        """Abort a stream's request where it is now: its stream's engine and id are read
        here, not when the client hung up (a disaggregated request may have moved on
        since). A stream held between two engines (``moving``) has no engine that holds its
        request: the abort waits on the stream and ``move`` applies it where the request
        lands."""
        if stream.moving:
            stream.aborted = True
            return True
        return self.engines[stream.engine].abort_request(stream.request_id)

    def hold(self, engine: str, request_id: int) -> None:
        """Keep a request's open stream open through its end on ``engine``, which is not its
        end: it goes on in another engine (a prefill engine's end after the first token),
        where ``move`` takes it. Called by the first listener on that engine's bus as the
        end is published, before the stream feed sees it."""
        stream = self.by_engine[engine].get(request_id)
        if stream is not None:
            stream.moving = True

    def move(self, engine: str, request_id: int, to: str, to_id: int) -> RequestStream | None:
        """A request that goes on in another engine takes its open stream along. A client
        that hung up while it moved has its abort applied there now (``abort``)."""
        stream = self.by_engine[engine].pop(request_id, None)
        if stream is not None:
            stream.engine, stream.request_id, stream.moving = to, to_id, False
            self.feeds[to].open(stream, None)
            if stream.aborted:
                self.engines[to].abort_request(to_id)
        return stream

    def end(self, engine: str, request_id: int, why: str) -> None:
        """End a request's open stream with finish reason "error" and ``why`` (a fleet whose
        request failed between engines)."""
        stream = self.by_engine[engine].pop(request_id, None)
        if stream is not None:
            stream.push(RequestOutput.ended(request_id, "error", why))

    def end_all(self, why: str, engine: str | None = None) -> None:
        """End every open stream of ``engine`` (of every engine if None) with "error"."""
        for name, streams in self.by_engine.items():
            if engine is None or name == engine:
                for rid, stream in list(streams.items()):
                    stream.push(RequestOutput.ended(rid, "error", why))
                streams.clear()
