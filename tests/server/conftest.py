"""Fixtures and helpers of the server tests: fake-runner engines and /ws readers."""

from __future__ import annotations

import json

from minicb import EngineConfig, FakeRunner, LLMEngine


def fake_engine(batching: str = "continuous", **config) -> LLMEngine:
    """A real engine on a FakeRunner (no model): token i of every request is 10 + i."""
    config.setdefault("num_kv_blocks", 32)
    runner = FakeRunner(num_kv_blocks=config["num_kv_blocks"], token_fn=lambda rid, i: 10 + i)
    return LLMEngine(config=EngineConfig(batching=batching, **config), runner=runner)


def control(ws, **msg):
    """Send a control; return (events received meanwhile, the reply)."""
    ws.send_text(json.dumps(msg))
    events = []
    while True:
        reply = ws.receive_json()
        if reply["type"] != "events":
            return events, reply
        events += [(reply["engine"], e) for e in reply["events"]]


def events_until(ws, done, limit=5000):
    """Receive events until ``done(engine, event)`` is true; all of them, in order."""
    seen = []
    while len(seen) < limit:
        msg = ws.receive_json()
        assert msg["type"] == "events", msg
        for e in msg["events"]:
            seen.append((msg["engine"], e))
            if done(msg["engine"], e):
                return seen
    raise AssertionError("the expected event never came")
