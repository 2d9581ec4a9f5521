"""The web app: the visualizer at ``/``, its files, plotly.js, and ``/ws``, one WebSocket
per browser: events out, controls in.

    app = create_app(engine_loop, mode="demo", model_name="SmolLM2-135M-Instruct")

The app never touches an engine itself: controls run in the engine thread through the
EngineLoop (minicb.server.controls), and what the engines did reaches the browsers as
*frames*: one subscription per engine, folded a dozen times a second into what a page
draws and encoded and compressed once for every browser of the same kind (broadcast.py,
frames.py; what goes on the wire: docs/events.md, "WebSocket messages"), so
nothing a browser does can make the engine or another browser wait. A browser gets a
*view* of each engine first (its requests, recent iterations and KV map), then the frames
after it; a slow tab's backlog is replaced by a fresh view. A rebuilt engine announces
itself with a "reset" event, which arrives in order with the events around it.

The door (guard.Guard): a foreign page's Origin is refused before the upgrade
(403); with a key set, a connection shows it as ``?key=`` or in its first message,
``{"type": "auth", "key": ...}``, after the server's ``{"type": "auth_required"}``, and
gets the key's role. A viewer's controls are refused. Texts (prompts, output tokens) are
redacted here, in the fan-out, never in the engine's events: for viewers unless
``show_text``, and in serve mode for everyone (the API's users' texts), except that
controllers see the prompts typed on a page. Each connection's messages are bounded in
size and rate, so a flood is answered with errors at the door, not in the engine thread.

Messages out: (``auth_required``), ``hello`` (with the ``role`` and each engine's view),
then ``frame``s ({engine, events, dropped, kv_grid at scale}), a ``view`` again for a tab
that fell behind, replies to controls (``ack`` or ``error``), and in replay mode one
``replay`` with each whole trace, folded as a live page gets it.
Modes: "demo" (engines, a workload feeder, every control), "serve" (one engine behind
the API), "replay" (no engine: the browser scrubs through recorded traces).
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, Request, WebSocket
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.middleware.gzip import GZipMiddleware
from starlette.websockets import WebSocketDisconnect

from minicb.server.api_error import APIError, error_handler
from minicb.server.broadcast import OUTBOX_FRAMES, Broadcast, compress
from minicb.server.controls import handle_control
from minicb.server.frames import StepFolder
from minicb.server.guard import CONTROLLER, VIEWER, Guard, check_hosts
from minicb.server.redaction import redact_event, with_own_tokens
from minicb.sim.demo import simulation_choices
from minicb.telemetry.events import StepEvent
from minicb.telemetry.kv_state import KVState

if TYPE_CHECKING:
    from collections.abc import Callable

    from minicb.server.engine_loop import EngineLoop
    from minicb.server.lesson import Lesson
    from minicb.telemetry.trace import Trace

# viz/ sits beside the package in the repository (the project is installed editable).
VIZ_DIR = Path(__file__).resolve().parents[2] / "viz"
MODES = ("demo", "serve", "replay")
KEEP_EXPLANATIONS = 64  # rounds whose decisions stay available to the single-step reply
AUTH_TIMEOUT_S = 30.0  # for the first message's key: a person may be typing it
MAX_MESSAGE_CHARS = 16_384  # the largest control (a prompt of 4,000 chars fits with room)
CONTROL_RATE, CONTROL_BURST = 20.0, 40  # controls a second per connection, and the burst
KEEP_TYPED = 4096  # ids of requests typed on the page, remembered to show their own text
CLOSE_UNAUTHORIZED = 4401  # WebSocket close code: the page asks for a key again


@dataclass(eq=False)
class Client:
    """One browser: its role, whether it sees texts (``True``: all, ``False``: none,
    ``None``: only what this app's controllers typed), and its outbox of messages."""

    role: str = CONTROLLER
    sees_text: bool | None = True
    # Frames (encoded) and replies waiting for its socket; None until its socket is up.
    outbox: asyncio.Queue | None = None
    # Puts a message in this browser's outbox from any thread (set once its socket is up).
    send: Callable[[dict[str, Any]], None] | None = None
    bytes_sent: int = 0
    resyncs: int = 0  # times its backlog was replaced by a fresh view (a slow tab)


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


class Hub:
    """What every browser of one app shares: the engines (or the traces), and the
    scheduler's explanations of recent rounds, kept for the single-step control.

    ``replay`` maps panel names to recorded traces (replay mode, no engine loop);
    ``guard`` is the door.
    """

    def __init__(
        self,
        engine_loop: EngineLoop | None,
        *,
        mode: str = "demo",
        model_name: str = "",
        replay: dict[str, Trace] | None = None,
        guard: Guard | None = None,
        lesson: Lesson | None = None,
    ) -> None:
        """``lesson``: the scenario a demo plays (lesson.py); its narration reaches every
        browser through ``broadcast``."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        if mode == "replay" and (engine_loop is not None or not replay):
            raise ValueError("replay mode needs at least one trace and no engine loop")
        if mode != "replay" and engine_loop is None:
            raise ValueError(f"{mode} mode needs an engine loop")
        self.loop, self.mode, self.model_name = engine_loop, mode, model_name
        self.replay, self.guard = replay or {}, guard or Guard()
        # engine name -> ids of the requests typed on a page (an ordered set, bounded)
        self.typed: dict[str, OrderedDict[int, None]] = {}
        # the demo's workload (a lesson's feeder is the scenario's, not for the page to set)
        self.feeder = engine_loop.feeder if engine_loop and not lesson else None
        self.lesson = lesson
        if lesson is not None:
            lesson.notify = self.broadcast
        self.clients: set[Client] = set()
        self.broadcast_frames = Broadcast(self)
        # round number -> {engine name: the plan's decisions in words}
        self._explained: OrderedDict[int, dict[str, list[str]]] = OrderedDict()
        for name, engine in (engine_loop.engines if engine_loop else {}).items():
            engine.bus.subscribe(functools.partial(self._record, name), kinds=["step"])

    # ---- browsers (engine thread) ----------------------------------------------------------
    async def join(self, role: str = CONTROLLER) -> tuple[Client, dict[str, Any]]:
        """A browser's client and its hello, with each engine's view as of the last frame;
        in the asyncio loop, between two frames, so it gets every frame after its view."""
        await self.broadcast_frames.start()
        assert self.loop is not None
        hello = await self.loop.acall(lambda: self.hello(role))
        client = self.connect(role)
        hello["engines"] = self.broadcast_frames.views(client)
        return client, hello

    def connect(self, role: str = CONTROLLER) -> Client:
        sees = self.guard.show_text or (
            role == CONTROLLER and (True if self.mode != "serve" else None)
        )
        client = Client(role, sees)
        self.clients.add(client)
        return client

    def broadcast(self, message: dict[str, Any]) -> None:
        """Send ``message`` to every connected browser (any thread), after the frames of
        what the engines did before it (a narration names requests those frames bring)."""
        if self.broadcast_frames.running:
            self.broadcast_frames.notice(message)
            return
        for client in list(self.clients):
            if client.send is not None:
                client.send(message)

    def disconnect(self, client: Client) -> None:
        self.clients.discard(client)
        if not self.clients:
            self.broadcast_frames.close()

    def viewer_figures(self) -> dict[str, float]:
        """Browsers connected and bytes sent to them, for /metrics."""
        return {
            "minicb_viewers": len(self.clients),
            "minicb_viewer_bytes_sent_total": self.broadcast_frames.bytes_sent,
            "minicb_viewer_resyncs_total": sum(c.resyncs for c in self.clients),
        }

    def hello(self, role: str = CONTROLLER) -> dict[str, Any]:
        """The first message a browser gets: mode, model, engines, its role and the control
        state. With an engine loop, call it in the engine thread (it reads the engines'
        views)."""
        loop, controls = self.loop, role == CONTROLLER
        model = self.model_name or next((t.header.get("model") for t in self.replay.values()), "")
        engines = loop.engine_infos() if loop else [_replay_info(*i) for i in self.replay.items()]
        return {
            "type": "hello",
            "mode": self.mode,
            "model": model or "",
            "engines": engines,
            "role": role,
            "paused": bool(loop and loop.paused),
            "delay_s": loop.delay_s if loop else 0.0,
            "rounds": loop.rounds if loop else 0,
            "workload": self.feeder.describe() if self.feeder else None,
            # the simulated-GPU picker, or None (a real model; a lesson fixes its runner)
            "simulation": None if self.lesson else simulation_choices(loop),
            "scenario": self._scenario(),  # the lesson played, with its narration, or None
            "controls": {
                "step": controls and loop is not None,
                "workload": controls and self.feeder is not None,
                "settings": controls and self.mode == "demo",
                "prompt": controls and loop is not None,
            },
        }

    def _scenario(self) -> dict[str, Any] | None:
        """The lesson a demo plays, or the one an exported trace recorded (its header)."""
        if self.lesson is not None:
            return self.lesson.describe()
        recorded = (t.header.get("scenario") for t in self.replay.values())
        return next((s for s in recorded if s), None)

    # ---- the scheduler's explanations (a bus listener, engine thread) --------------------
    def _record(self, name: str, steps: Sequence[StepEvent]) -> None:
        # Steps run before the loop counts their round, so this round is rounds + 1.
        assert self.loop is not None  # subscribed only when there is a loop
        round_no = self.loop.rounds + 1
        for event in steps:
            self._explained.setdefault(round_no, {})[name] = event.plan.explain()
        while len(self._explained) > KEEP_EXPLANATIONS:
            self._explained.popitem(last=False)

    def explained(self, round_no: int) -> dict[str, list[str]]:
        return dict(self._explained.get(round_no, {}))

    # ---- texts -----------------------------------------------------------------------------
    def note_typed(self, name: str, request_id: int) -> None:
        """Remember a request typed on a page (engine thread, before it first steps)."""
        typed = self.typed.setdefault(name, OrderedDict())
        typed[request_id] = None
        while len(typed) > KEEP_TYPED:
            typed.popitem(last=False)

    def shown(self, client: Client, name: str, event: dict[str, Any]) -> dict[str, Any]:
        """``event`` (a JSON dict) as ``client`` may see it: where it may not read texts,
        only what the allow-list keeps (redaction.redact_event)."""
        if client.sees_text is True:
            return event
        typed = self.typed.get(name, {}) if client.sees_text is None else {}
        if event.get("request_id") in typed:
            return event
        shown = redact_event(event)
        if typed and event.get("type") == "tokens":  # a step's tokens: its own ones, shown
            return with_own_tokens(shown, event, typed)
        return shown


def _replay_info(name: str, trace: Trace) -> dict[str, Any]:
    """A recorded engine described as a live one is (see LLMEngine.describe)."""
    config = trace.header.get("config") or {}
    kv_total = next((e.plan.kv_total for e in trace.events if isinstance(e, StepEvent)), 0)
    return {
        "name": name,
        "batching": config.get("batching", name),
        "config": config,
        "model": trace.header.get("model"),
        "kv_total": kv_total,
        "block_size": config.get("block_size", 16),
        "has_tokenizer": True,
        "max_model_len": config.get("max_model_len"),
        # the recorded runner (a simulated GPU says so) and whether it was one
        "runner": trace.header.get("hardware") or {},
        "simulated": bool((trace.header.get("hardware") or {}).get("simulated")),
        "step": 0,
    }


def replay_events(name: str, trace: Trace) -> list[dict[str, Any]]:
    """A recorded engine's events folded as a live page gets them (frames.StepFolder), with
    every step's KV changes: a replay draws exactly the map the live page drew."""
    folder = StepFolder(_replay_info(name, trace), KVState())
    folder.exact = True  # the whole trace is sent once: the slider needs every block
    return folder.fold(trace.events, tokens=True)


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


def _refusal(client: Client, limit: RateLimit, text: str) -> dict[str, Any] | None:
    """The error for a control refused at the door (before it is even parsed), or None."""
    why = None
    if len(text) > MAX_MESSAGE_CHARS:
        why = f"message of {len(text)} chars is over the limit of {MAX_MESSAGE_CHARS}"
    elif client.role == VIEWER:
        why = "this connection is a viewer (read-only); controls need the controller's key"
    elif not limit.allow():
        why = f"too many controls: at most {CONTROL_RATE:g} a second (bursts of {CONTROL_BURST})"
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
    if hub.mode == "replay":
        traces = {
            n: {
                "header": t.header,
                "events": [hub.shown(client, n, e) for e in replay_events(n, t)],
            }
            for n, t in hub.replay.items()
        }
        await websocket.send_bytes(compress(json.dumps({"type": "replay", "traces": traces})))
    client.send = functools.partial(_offer, asyncio.get_running_loop(), outbox)
    tasks = [asyncio.create_task(hub.broadcast_frames.write(websocket, client))]
    limit = RateLimit()
    try:
        while True:
            text = await websocket.receive_text()
            reply = _refusal(client, limit, text) or await handle_control(hub, text)
            await outbox.put(reply)
    except (WebSocketDisconnect, RuntimeError):  # closed by the browser, or mid-send
        pass
    finally:
        hub.disconnect(client)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# ---- the app ---------------------------------------------------------------------------
def create_app(engine_loop: EngineLoop | None, **options: Any) -> FastAPI:
    """The FastAPI app serving the visualizer and ``/ws`` for these engines (or a replay);
    ``options`` are the Hub's (``guard`` among them). minicb.server.openai_api adds the
    OpenAI routes to it. The page and its files are open; what they show comes through
    the guarded ``/ws`` and ``/viz/info``."""
    hub = Hub(engine_loop, **options)
    reader = [Depends(hub.guard.http_check(CONTROLLER, VIEWER))]
    app = FastAPI(title="minicb", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.hub = hub
    check_hosts(app, hub.guard)  # a foreign Host (DNS rebinding) is refused before any route
    app.add_exception_handler(APIError, error_handler)  # a refused /viz/info

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(VIZ_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/plotly.min.js", include_in_schema=False)
    def plotly_js() -> FileResponse:
        """plotly.min.js as shipped inside the plotly Python package: the viz works offline."""
        import plotly

        path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
        # the installed package's file changes only with the package: a day in the cache
        return FileResponse(path, media_type="text/javascript", headers=CACHE_A_DAY)

    @app.get("/viz/info", include_in_schema=False, dependencies=reader)
    async def info(request: Request) -> JSONResponse:
        role = hub.guard.role(Guard.key_of(request)) or VIEWER  # the dependency let it in
        hello = functools.partial(hub.hello, role)
        return JSONResponse(await hub.loop.acall(hello) if hub.loop else hello())

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await serve_client(websocket, hub)

    app.mount("/viz", StaticFiles(directory=VIZ_DIR), name="viz")
    # A class of 200 loads plotly.js (4.8 MB) 200 times: gzipped it is a third of that. The
    # middleware leaves WebSockets and event streams (the API's tokens) alone.
    app.add_middleware(GZipMiddleware, minimum_size=1024)
    return app


CACHE_A_DAY = {"Cache-Control": "public, max-age=86400"}
