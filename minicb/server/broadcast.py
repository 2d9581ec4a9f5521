"""Broadcast: one fold of each engine's events, encoded once per kind of browser, sent to
every browser at a bounded rate (frames.py says what a frame holds).

    engine thread ──put──► one Subscription per engine (this broadcast's; never dropped)
                               │  every 1/FRAME_HZ s, in the server's asyncio loop:
                               │  drain, fold (StepFolder), encode once per text class
                               ▼
                           each browser's outbox (bounded) ──► writer task ──► socket

On the wire a frame is one *binary* message: its JSON compressed with zlib (``deflate``, as
a browser's DecompressionStream("deflate") reads it), compressed once per text class like
its encoding; so is a view that stands in for the frames a slow browser missed. Every
other message (hello, replies, narrations) is JSON in a text message. WebSocket
permessage-deflate is off on the server (launch.py): it compressed every frame again for
each connection. Two hundred browsers cost two hundred socket writes of the same bytes a
frame, not two hundred folds, encodings and compressions; the engine thread pays one queue
put per event whatever the number of browsers. A browser whose outbox is full (a slow tab)
gets its queued frames replaced by one *view* (the fold's state now) and the frames after
it: coarser, never broken, and nobody else waits for it.
"""

from __future__ import annotations

import asyncio
import json
import queue
import zlib
from typing import TYPE_CHECKING, Any

from minicb.core.events import EVENT_KINDS
from minicb.server.frames import DETAIL_ROWS, FRAME_HZ, KV_GRID_EVERY, StepFolder
from minicb.telemetry.kv_state import KVState

if TYPE_CHECKING:
    from starlette.websockets import WebSocket

    from minicb.core.subscription import Subscription
    from minicb.server.hub import Client, Hub

# The broadcast's own queue per engine: a frame's worth of events at any scale (a simulated
# GPU runs a few hundred iterations a second, each a step and a few request events).
FOLD_QUEUE = 1 << 16
OUTBOX_FRAMES = 24  # about two seconds of frames waiting for a browser's socket
# zlib's level for frames (once for all browsers). Measured on 211 frames of the H100 demo
# (16 kB of JSON each): 6, zlib's default, leaves 9.2 % in 0.20 ms a frame; 9 leaves 9.0 %
# in 0.36 ms; 1 leaves 10.9 % in 0.09 ms. permessage-deflate paid 0.2 ms per frame for each
# browser (and its window across messages left 6.2 %).
FRAME_COMPRESSION = 6
# No message over this many bytes of JSON (before compression): a burst of ten thousand
# arrivals in one frame is sent as several messages in a row (same order, nothing
# dropped), each one a client can take.
MAX_MESSAGE_BYTES = 192 * 1024


class Broadcast:
    """The frames of every engine of one app, for every browser connected to it."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.folders: dict[str, StepFolder] = {}
        self.subs: dict[str, Subscription] = {}
        self.frames = 0  # frames folded so far (each engine's)
        self.bytes_sent = 0  # bytes written to every browser's socket, all messages (compressed)
        self.last_grid: dict[str, list[int]] = {}  # the folded map each engine sent last
        # text class -> the view a slow browser gets instead of its backlog, compressed; one
        # for all the browsers of a class that fall behind between two folds
        self._views: dict[Any, bytes] = {}
        self._task: asyncio.Task | None = None
        self._starting = asyncio.Lock()
        # Messages for every browser from the engine thread (narrations), sent after the
        # frames folded from the events that came before them.
        self._notices: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()

    @property
    def running(self) -> bool:
        return self._task is not None

    def notice(self, message: dict[str, Any]) -> None:
        """Send ``message`` to every browser at the next frame, after its events (any thread)."""
        self._notices.put(message)

    # ---- starting (the first browser starts it, in the server's asyncio loop) -------------
    async def start(self) -> None:
        # One start for browsers that join together: the first builds the folders, the
        # others wait for it (without the lock, each would subscribe its own and leak them).
        async with self._starting:
            if self._task is not None:
                return
            loop = self.hub.loop
            assert loop is not None, "a replay has no engines to broadcast"
            for name in list(loop.engines):
                # In the engine thread: the description, the map and the subscription at one
                # moment, so no event falls between a browser's view and the frames after it.
                folder, sub = await loop.acall(lambda n=name: self._join(n))
                self.folders[name], self.subs[name] = folder, sub
            self._task = asyncio.create_task(self._run())

    def _join(self, name: str) -> tuple[StepFolder, Subscription]:
        engine = self.hub.loop.engines[name]
        info = {"name": name, **engine.describe(), "requests": engine.live_requests()}
        # Every token of 256 rows, each iteration, is more than a page can show: at scale the
        # broadcast does not ask for token events, so the engine does not build them for it.
        small = engine.config.max_num_seqs <= DETAIL_ROWS
        kinds = None if small else EVENT_KINDS - {"tokens"}
        sub = engine.bus.subscribe_async(FOLD_QUEUE, kinds)
        return StepFolder(info, KVState.from_snapshot(engine.kv_snapshot_event())), sub

    def close(self) -> None:
        """Stop (the last browser left): the engines build no event for nobody. The next
        browser starts it again from a fresh description of each engine."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for sub in self.subs.values():
            sub.close()
        self.subs, self.folders, self.last_grid = {}, {}, {}

    # ---- what a browser gets first -----------------------------------------------------------
    def views(self, client: Client) -> list[dict[str, Any]]:
        """Each engine as of the last frame, as ``client`` may see it."""
        out = []
        for name, folder in self.folders.items():
            view = folder.view()
            view["requests"] = [self.hub.shown(client, name, r) for r in view["requests"]]
            view["transfers"] = [self.hub.shown(client, name, e) for e in view["transfers"]]
            out.append(view)
        return out

    # ---- the frames ------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            await asyncio.sleep(1 / FRAME_HZ)
            self.frames += 1
            notices = []  # taken first: the events before them are in the queues already
            while not self._notices.empty():
                notices.append(json.dumps(self._notices.get()))
            for name, sub in self.subs.items():
                self._frame(name, sub)
            for text in notices:
                for client in list(self.hub.clients):
                    if client.outbox is not None:
                        self.offer(client, text)

    def _frame(self, name: str, sub: Subscription) -> None:
        folder = self.folders[name]
        events = folder.fold(sub.drain(), tokens=self._tokens(name))
        self._views = {}  # a view from before this fold would miss its events
        grid = None
        if not folder.exact and self.frames % KV_GRID_EVERY == 0:
            grid = folder.grid()
            if grid["cells"] == self.last_grid.get(name):
                grid = None  # the map did not change: nothing to send
            else:
                self.last_grid[name] = grid["cells"]
        if not events and grid is None:
            return
        encoded: dict[Any, list[bytes]] = {}  # one encoding per text class, for its browsers
        for client in list(self.hub.clients):
            if client.outbox is None:
                continue
            key = client.sees_text
            if key not in encoded:
                shown = [self.hub.shown(client, name, e) for e in events]
                head = {"type": "frame", "engine": name, "dropped": sub.dropped}
                if self.hub.feeder is not None:  # the demo's: why a timeline may have gaps
                    head["arrivals"] = self.hub.feeder.counts()
                if grid is not None:
                    head["kv_grid"] = grid
                encoded[key] = [compress(text) for text in _messages(head, shown)]
            for data in encoded[key]:
                self.offer(client, data)

    def _tokens(self, name: str) -> bool:
        return self.hub.loop.engines[name].config.max_num_seqs <= DETAIL_ROWS

    def offer(self, client: Client, message: str | bytes) -> None:
        """Queue an encoded message (a compressed frame, or JSON text); a full outbox is
        replaced by one view (coarser, whole), compressed as a frame is: at a GPU's scale a
        view is hundreds of kilobytes of JSON, and a class on a busy machine has many slow
        browsers at once."""
        outbox = client.outbox
        if outbox.full():
            while not outbox.empty():
                outbox.get_nowait()
            client.resyncs += 1
            key = client.sees_text
            if key not in self._views:
                view = {"type": "view", "engines": self.views(client)}
                self._views[key] = compress(json.dumps(view))
            outbox.put_nowait(self._views[key])
            return
        outbox.put_nowait(message)

    async def write(self, websocket: WebSocket, client: Client) -> None:
        """The browser's writer: its outbox to its socket (a compressed frame as a binary
        message, anything else as JSON text), counting the bytes."""
        while True:
            message = await client.outbox.get()
            if isinstance(message, bytes):
                data = message
                await websocket.send_bytes(data)
            else:
                text = message if isinstance(message, str) else json.dumps(message)
                data = text.encode()
                await websocket.send_text(text)
            client.bytes_sent += len(data)
            self.bytes_sent += len(data)


def compress(text: str) -> bytes:
    """A frame as it goes on the wire: its JSON, zlib-compressed."""
    return zlib.compress(text.encode(), FRAME_COMPRESSION)


def read_message(data: str | bytes) -> dict[str, Any]:
    """A /ws message as a client reads it: a binary one is a compressed frame, a text one is
    JSON as it is (what the page does, in Python: the tests' and the load harness's)."""
    return json.loads(zlib.decompress(data) if isinstance(data, bytes) else data)


def _messages(head: dict[str, Any], events: list[dict[str, Any]]) -> list[str]:
    """The frame as one encoded message, or, past MAX_MESSAGE_BYTES, as several in a row
    that split its events (the folded map rides on the last)."""
    text = json.dumps({**head, "events": events})
    if len(text) <= MAX_MESSAGE_BYTES or len(events) < 2:
        return [text]
    grid = head.pop("kv_grid", None)
    budget = MAX_MESSAGE_BYTES - len(json.dumps(head)) - 64 - len(json.dumps(grid or 0))
    out, part, size = [], [], 0
    for event, encoded in zip(events, map(json.dumps, events), strict=True):
        if part and size + len(encoded) + 2 > budget:
            out.append({**head, "events": part})
            part, size = [], 0
        part.append(event)
        size += len(encoded) + 2
    out.append({**head, "events": part, **({"kv_grid": grid} if grid else {})})
    return [json.dumps(m) for m in out]
