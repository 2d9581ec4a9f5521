"""Rebuilding the demo's engines with new settings, on the weights already loaded.

Runs in the engine thread (through ``EngineLoop.call``). Every new engine is built before
any old one is touched, so a setting the EngineConfig refuses changes nothing. Then, per
engine: its requests are aborted (the browsers see them leave), open token streams end
with finish reason "abort", the EventBus and the loop's stream router move to the new
engine, and every browser gets a ``reset`` notice for that panel, because request ids
start again at 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from minicb.engine import LLMEngine
from minicb.request import RequestOutput
from minicb.server.hub import engine_info

if TYPE_CHECKING:
    from minicb.server.hub import Hub


def rebuild_engines(hub: Hub, changes: dict[str, Any]) -> list[dict[str, Any]]:
    """Replace every engine of ``hub.loop`` by one with ``changes`` applied to its config."""
    loop = hub.loop
    assert loop is not None
    new = {
        name: LLMEngine(config=old.config.with_(**changes), share_weights_with=old)
        for name, old in loop.engines.items()
    }
    for name, old in list(loop.engines.items()):
        for rid in list(old.scheduler.requests):
            old.abort_request(rid)
        engine = new[name]
        for stream in loop.replace_engine(name, engine):
            stream.push(RequestOutput.ended(stream.request_id, "abort"))
        bus = hub.buses.get(name)
        if bus is not None:
            old.remove_observer(bus)
            bus.block_size = engine.config.block_size
            engine.add_observer(bus)
        hub.notify(name, {"type": "reset", "info": engine_info(name, engine)})
    for hook in hub.rebuild_hooks:
        hook(loop.engines)
    return [engine_info(n, e) for n, e in loop.engines.items()]
