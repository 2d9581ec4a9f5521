"""``/ws``: one WebSocket per browser, from the door to its last message.

The door (guard.Guard): a foreign page's Origin is refused before the upgrade
(403); with a key set, a connection shows it as ``?key=`` or in its first message,
``{"type": "auth", "key": ...}``, after the server's ``{"type": "auth_required"}``, and
gets the key's role. A viewer's controls are refused. Texts (prompts, output tokens) are
redacted in the fan-out (hub.Hub.shown), never in the engine's events: for viewers unless
``show_text``, and in serve mode for everyone (the API's users' texts), except that
controllers see the prompts typed on a page. Each connection's messages are bounded in
size and rate, so a flood is answered with errors at the door, not in the engine thread.

Messages out: (``auth_required``), ``hello`` (with the ``role`` and each engine's view),
then ``frame``s ({engine, events, dropped, kv_grid at scale}), a ``view`` again for a tab
that fell behind, replies to controls (``ack`` or ``error``), and in replay mode the
``replay`` pieces of the traces, folded as a live page gets them (replay_view.py). Controls
run in the engine thread (controls.py); frames are written by broadcast.py.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect

from minicb.server.broadcast import OUTBOX_FRAMES, compress
from minicb.server.controls import handle_control
from minicb.server.guard import CONTROLLER, VIEWER, Guard
from minicb.server.hub import Client, Hub

AUTH_TIMEOUT_S = 30.0  # for the first message's key: a person may be typing it
MAX_MESSAGE_CHARS = 16_384  # the largest control (a prompt of 4,000 chars fits with room)
CONTROL_RATE, CONTROL_BURST = 20.0, 40  # controls a second per connection, and the burst
CLOSE_UNAUTHORIZED = 4401  # WebSocket close code: the page asks for a key again


@dataclass
class RateLimit:
    """A token bucket: ``burst`` controls at once, then ``rate`` a second."""

    rate: float = CONTROL_RATE
    burst: float = CONTROL_BURST
    tokens: float = CONTROL_BURST
    last: float = field(default_factory=time.monotonic)

    def allow(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


def _offer(aloop: asyncio.AbstractEventLoop, outbox: asyncio.Queue, message: dict) -> None:
    """Queue ``message`` for the socket from another thread (a narration point: rare, and
    the outbox waits for the socket, so a put that must wait is scheduled, never dropped)."""
    aloop.call_soon_threadsafe(lambda: aloop.create_task(outbox.put(message)))


async def _admit(websocket: WebSocket, guard: Guard) -> str | None:
    """The connection's role, accepted, or None once it has been refused (and closed)."""
    headers = websocket.headers
    if not guard.origin_ok(headers.get("origin"), headers.get("host")):
        await websocket.close(code=1008)  # before accept: the upgrade is answered 403
        return None
    query_key = websocket.query_params.get("key")
    who = websocket.client.host if websocket.client else None  # wrong keys are counted per address
    if query_key is not None:
        role = guard.role(query_key, who)
        await (websocket.accept() if role else websocket.close(code=1008))
        return role
    await websocket.accept()
    if guard.api_key is None:
        return CONTROLLER
    # Browsers cannot set headers on a WebSocket: the key comes as the first message.
    await websocket.send_text(json.dumps({"type": "auth_required"}))
    try:
        first = await asyncio.wait_for(websocket.receive(), AUTH_TIMEOUT_S)
        if first["type"] == "websocket.disconnect":
            return None
        text = first.get("text") or ""  # a binary frame holds no key (and is no error)
        msg = json.loads(text) if len(text) <= MAX_MESSAGE_CHARS else None
    except (TimeoutError, ValueError, RecursionError):  # silence, or no JSON
        msg = None
    key = msg.get("key") if isinstance(msg, dict) and msg.get("type") == "auth" else None
    role = guard.role(key, who) if isinstance(key, str) else None
    if role is None:
        why = 'this server needs a key: send {"type": "auth", "key": KEY} first'
        await websocket.send_text(json.dumps({"type": "error", "control": "auth", "message": why}))
        await websocket.close(code=CLOSE_UNAUTHORIZED)
    return role


def _refusal(client: Client, limit: RateLimit, text: str | None) -> dict[str, Any] | None:
    """The error for a control refused at the door (before it is even parsed), or None.
    ``text`` is None for a binary message: controls are JSON text, so it is refused (after
    the rate limit, which it counts against as any control does)."""
    why = None
    if text is not None and len(text) > MAX_MESSAGE_CHARS:
        why = f"message of {len(text)} chars is over the limit of {MAX_MESSAGE_CHARS}"
    elif client.role == VIEWER:
        why = "this connection is a viewer (read-only); controls need the controller's key"
    elif not limit.allow():
        why = f"too many controls: at most {CONTROL_RATE:g} a second (bursts of {CONTROL_BURST})"
    elif text is None:
        why = "a binary message is no control: controls are JSON text messages"
    return {"type": "error", "control": None, "message": why} if why else None


async def serve_client(websocket: WebSocket, hub: Hub) -> None:
    role = await _admit(websocket, hub.guard)
    if role is None:
        return
    if hub.loop:
        client, hello = await hub.join(role)
    else:
        client, hello = hub.connect(role), hub.hello(role)
    client.outbox = outbox = asyncio.Queue(OUTBOX_FRAMES)
    # The engines' state (hello, replay) goes compressed, as frames do: at a GPU's scale a
    # hello is most of a megabyte of JSON, and a class opens the page at once.
    await websocket.send_bytes(compress(json.dumps(hello)))
    if hub.mode == "replay":  # the traces: built in a thread, once per text class, in pieces
        for piece in await hub.replay_views.pieces(client):
            await websocket.send_bytes(piece)
    client.send = functools.partial(_offer, asyncio.get_running_loop(), outbox)
    tasks = [asyncio.create_task(hub.broadcast_frames.write(websocket, client))]
    limit = RateLimit()
    try:
        while True:
            received = await websocket.receive()
            if received["type"] == "websocket.disconnect":
                break
            text = received.get("text")  # None: a binary message (its bytes are not read)
            reply = _refusal(client, limit, text) or await handle_control(hub, text)
            await outbox.put(reply)
    except (WebSocketDisconnect, RuntimeError):  # closed by the browser, or mid-send
        pass
    finally:
        hub.disconnect(client)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
