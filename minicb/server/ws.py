"""``/ws``: one browser's WebSocket: events out, controls in.

Each browser gets its own bounded Subscription per engine (made by the Hub). Nothing the
browser does can make the engine wait:

    engine thread ──put──► Subscription (bounded; drops the oldest when full, counted)
                               │  pump task: await drain_async()
                               ▼
                           outbox (small asyncio.Queue) ──► writer task ──► socket

A slow tab fills its own outbox, its pumps then stop draining, and its subscriptions drop
old events; the engine and the other tabs go on. A disconnected tab is dropped at once:
its subscriptions are closed, so the buses forget them.

Messages out: ``hello`` first, then ``events`` batches ({engine, events, dropped}), control
replies, and in replay mode one ``replay`` message with the whole trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from minicb.telemetry.events import to_dict
from minicb.server.controls import handle_control
from minicb.server.hub import Notice

if TYPE_CHECKING:
    from minicb.server.hub import Hub
    from minicb.telemetry.bus import Subscription

OUTBOX_SIZE = 16  # batches waiting for the socket; beyond this the pumps wait, not the engine
MAX_BATCH = 2048  # events per message, so one message never grows without bound


def event_json(event: Any) -> dict[str, Any]:
    if isinstance(event, Notice):
        return event.data
    return to_dict(event)


async def _pump(name: str, sub: Subscription, outbox: asyncio.Queue) -> None:
    """Move this engine's events from its subscription to the outbox, in batches."""
    while True:
        events = await sub.drain_async(MAX_BATCH)
        if not events:  # closed
            return
        batch = {
            "type": "events",
            "engine": name,
            "events": [event_json(e) for e in events],
            "dropped": sub.dropped,
        }
        await outbox.put(batch)


async def _write(websocket: WebSocket, outbox: asyncio.Queue) -> None:
    while True:
        message = await outbox.get()
        await websocket.send_text(json.dumps(message))


def replay_message(hub: Hub) -> dict[str, Any]:
    traces = hub.replay or {}
    return {
        "type": "replay",
        "traces": {
            name: {"header": t.header, "events": [to_dict(e) for e in t.events]}
            for name, t in traces.items()
        },
    }


async def serve_client(websocket: WebSocket, hub: Hub) -> None:
    await websocket.accept()
    client = None
    if hub.loop is not None:
        client, hello = await hub.loop.acall(hub.join)
    else:
        hello = hub.hello()
    await websocket.send_text(json.dumps(hello))
    if hub.mode == "replay":
        await websocket.send_text(json.dumps(replay_message(hub)))
    outbox: asyncio.Queue = asyncio.Queue(OUTBOX_SIZE)
    tasks = [asyncio.create_task(_write(websocket, outbox))]
    if client is not None:
        tasks += [asyncio.create_task(_pump(n, s, outbox)) for n, s in client.subs.items()]
    try:
        while True:
            text = await websocket.receive_text()
            reply = await handle_control(hub, text)
            await outbox.put(reply)
    except (WebSocketDisconnect, RuntimeError):  # closed by the browser, or mid-send
        pass
    finally:
        if client is not None:
            hub.disconnect(client)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
