"""Fixtures and helpers of the server tests: fake-runner engines, /ws readers, and a live
guarded demo with a real WebSocket client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

from starlette.websockets import WebSocketDisconnect

from minicb import EngineConfig, FakeRunner, LLMEngine
from minicb.driver.engine_loop import EngineLoop
from minicb.server.app import create_app
from minicb.server.broadcast import read_message
from minicb.server.demo_feeder import WorkloadFeeder, WorkloadSpec
from minicb.server.guard import Guard
from minicb.server.openai_api import install_openai_routes
from tests.api.live import live_server


def fake_engine(batching: str = "continuous", **config) -> LLMEngine:
    """A real engine on a FakeRunner (no model): token i of every request is 10 + i."""
    config.setdefault("num_kv_blocks", 32)
    runner = FakeRunner(num_kv_blocks=config["num_kv_blocks"], token_fn=lambda rid, i: 10 + i)
    return LLMEngine(config=EngineConfig.from_kwargs(batching=batching, **config), runner=runner)


def message(ws) -> dict:
    """The next /ws message of a TestClient socket, read as the page reads it: a frame comes
    compressed in a binary message, anything else as JSON text."""
    received = ws.receive()
    if received["type"] == "websocket.close":
        raise WebSocketDisconnect(received.get("code", 1000), received.get("reason"))
    data = received.get("bytes")
    return read_message(data if data is not None else received["text"])


def control(ws, **msg):
    """Send a control; return (events received meanwhile in frames, the reply)."""
    ws.send_text(json.dumps(msg))
    events = []
    while True:
        reply = message(ws)
        if reply["type"] != "frame":
            return events, reply
        events += [(reply["engine"], e) for e in reply["events"]]


def events_until(ws, done, limit=5000):
    """Receive frames until ``done(engine, event)`` is true for one of their events; all of
    them, in order."""
    seen = []
    while len(seen) < limit:
        msg = message(ws)
        assert msg["type"] == "frame", msg
        for e in msg["events"]:
            seen.append((msg["engine"], e))
            if done(msg["engine"], e):
                return seen
    raise AssertionError("the expected event never came")


class CharTokenizer:
    """One token per character: enough for prompts given as text."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) % 256 for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(map(chr, ids))


class HeavyFakeRunner(FakeRunner):
    """A fake whose KV blocks weigh 1 MiB each, as a real runner's would: the settings'
    memory check sees a pool's bytes without any being allocated."""

    def describe(self) -> dict:
        return {**super().describe(), "bytes_per_block": 1 << 20}


@contextmanager
def guarded_demo(guard: Guard | None = None, mode: str = "demo") -> Iterator[SimpleNamespace]:
    """A live demo (or, with ``mode="serve"``, one engine named "api") on fake runners,
    with the OpenAI routes, behind ``guard``, on a real socket (uvicorn on 127.0.0.1).

    Yields ``url`` (http://...), ``ws`` (ws://.../ws), ``loop`` and ``app``.
    """
    names = ("static", "continuous") if mode == "demo" else ("api",)
    engines = {}
    for name in names:
        config = EngineConfig(batching=name if name == "static" else "continuous", num_kv_blocks=32)
        runner = HeavyFakeRunner(
            num_kv_blocks=32, token_fn=lambda rid, i: 65 + i % 26, tokenizer=CharTokenizer()
        )
        engines[name] = LLMEngine(config=config, runner=runner)
    feeder = WorkloadFeeder(WorkloadSpec(preset="off")) if mode == "demo" else None
    loop = EngineLoop(engines, feeder=feeder)
    app = create_app(loop, mode=mode, model_name="fake", guard=guard)
    install_openai_routes(app, loop, names[-1], "fake", guard=guard)
    loop.start()
    try:
        with live_server(app) as url:
            ws = "ws" + url.removeprefix("http") + "/ws"
            yield SimpleNamespace(url=url, ws=ws, loop=loop, app=app)
    finally:
        loop.stop()


def ws_connect(url: str, origin: str | None = None, **options):
    """A real WebSocket client (``websockets``), as a non-browser or, with ``origin``, as a
    page of that origin; no proxy, messages up to 8 MiB."""
    from websockets.sync.client import connect

    headers = {"Origin": origin} if origin else None
    return connect(url, additional_headers=headers, proxy=None, max_size=8 << 20, **options)


def receive(ws, timeout: float = 10.0) -> dict:
    """The next message of a ``websockets`` client, read as the page reads it."""
    return read_message(ws.recv(timeout=timeout))


def replies(ws, count: int, timeout: float = 20.0) -> list[dict]:
    """The next ``count`` messages that are no event batches (replies to controls)."""
    out = []
    while len(out) < count:
        msg = receive(ws, timeout)
        if msg["type"] != "frame":
            out.append(msg)
    return out
