"""The web app: the visualizer at ``/``, its files, plotly.js, and ``/ws``, one WebSocket
per browser: events out, controls in.

    app = create_app(engine_loop, mode="demo", model_name="SmolLM2-135M-Instruct")

The app never touches an engine itself: controls run in the engine thread through the
EngineLoop (minicb.server.controls), and events come back through one bounded
subscription per engine per browser on that engine's bus, so nothing a browser does can
make the engine wait:

    engine thread ──put──► Subscription (bounded; drops the oldest when full, counted)
                               │  pump task: await drain_async()
                               ▼
                           outbox (small asyncio.Queue) ──► writer task ──► socket

A slow tab fills its own outbox, its pumps stop draining, and its subscriptions drop old
events; the engine and the other tabs go on. A closed tab's subscriptions close at once.
Step events carry every request's block ids, and a rebuilt engine announces itself with
a "reset" event on the same bus: both arrive in order with the events around them.

Messages out: ``hello``, then ``events`` batches ({engine, events, dropped}), replies to
controls (``ack`` or ``error``), and in replay mode one ``replay`` with the whole trace.
Modes: "demo" (engines, a workload feeder, every control), "serve" (one engine behind
the API), "replay" (no engine: the browser scrubs through recorded traces).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, WebSocket
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.websockets import WebSocketDisconnect

from minicb.server.controls import handle_control
from minicb.telemetry.events import StepEvent, to_dict

if TYPE_CHECKING:
    from minicb.server.engine_loop import EngineLoop
    from minicb.telemetry.bus import Subscription
    from minicb.telemetry.trace import Trace

# viz/ sits beside the package in the repository (the project is installed editable).
VIZ_DIR = Path(__file__).resolve().parents[2] / "viz"
MODES = ("demo", "serve", "replay")
KEEP_EXPLANATIONS = 64  # rounds whose decisions stay available to the single-step reply
OUTBOX_SIZE = 16  # batches waiting for the socket; beyond this the pumps wait, not the engine
MAX_BATCH = 2048  # events per message, so one message never grows without bound


@dataclass(eq=False)
class Client:
    """One browser: a bounded event queue on each engine's bus."""

    subs: dict[str, Subscription]

    def close(self) -> None:
        for sub in self.subs.values():
            sub.close()


class Hub:
    """What every browser of one app shares: the engines (or the traces), and the
    scheduler's explanations of recent rounds, kept for the single-step control.

    ``replay`` maps panel names to recorded traces (replay mode, no engine loop);
    ``queue_size`` bounds each browser's queue per engine.
    """

    def __init__(
        self,
        engine_loop: EngineLoop | None,
        *,
        mode: str = "demo",
        model_name: str = "",
        replay: dict[str, Trace] | None = None,
        queue_size: int = 4096,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        if mode == "replay" and (engine_loop is not None or not replay):
            raise ValueError("replay mode needs at least one trace and no engine loop")
        if mode != "replay" and engine_loop is None:
            raise ValueError(f"{mode} mode needs an engine loop")
        self.loop, self.mode, self.model_name = engine_loop, mode, model_name
        self.replay, self.queue_size = replay or {}, queue_size
        self.feeder = engine_loop.feeder if engine_loop else None  # the demo's workload
        self.clients: set[Client] = set()
        # round number -> {engine name: the plan's decisions in words}
        self._explained: OrderedDict[int, dict[str, list[str]]] = OrderedDict()
        for name, engine in (engine_loop.engines if engine_loop else {}).items():
            engine.bus.subscribe(functools.partial(self._record, name), kinds=["step"])

    # ---- browsers (engine thread) ----------------------------------------------------------
    def join(self) -> tuple[Client, dict[str, Any]]:
        """Subscribe a browser and describe the engines with the requests they hold; run
        in the engine thread, so no event falls between the description and the queue."""
        client, hello = self.connect(), self.hello()
        for info in hello["engines"]:
            info["requests"] = self.loop.engines[info["name"]].live_requests()
        return client, hello

    def connect(self) -> Client:
        engines = self.loop.engines if self.loop else {}
        client = Client({n: e.bus.subscribe_async(self.queue_size) for n, e in engines.items()})
        self.clients.add(client)
        return client

    def disconnect(self, client: Client) -> None:
        self.clients.discard(client)
        client.close()

    def hello(self) -> dict[str, Any]:
        """The first message a browser gets: mode, model, engines and the control state.
        With an engine loop, call it in the engine thread (it reads the engines' views)."""
        loop = self.loop
        model = self.model_name or next((t.header.get("model") for t in self.replay.values()), "")
        engines = loop.engine_infos() if loop else [_replay_info(*i) for i in self.replay.items()]
        return {
            "type": "hello",
            "mode": self.mode,
            "model": model or "",
            "engines": engines,
            "paused": bool(loop and loop.paused),
            "delay_s": loop.delay_s if loop else 0.0,
            "rounds": loop.rounds if loop else 0,
            "workload": self.feeder.describe() if self.feeder else None,
            "controls": {
                "step": loop is not None,
                "workload": self.feeder is not None,
                "settings": self.mode == "demo",
                "prompt": loop is not None,
            },
        }

    # ---- the scheduler's explanations (a bus listener, engine thread) --------------------
    def _record(self, name: str, event: StepEvent) -> None:
        # Steps run before the loop counts their round, so this round is rounds + 1.
        assert self.loop is not None  # subscribed only when there is a loop
        round_no = self.loop.rounds + 1
        self._explained.setdefault(round_no, {})[name] = event.plan.explain()
        while len(self._explained) > KEEP_EXPLANATIONS:
            self._explained.popitem(last=False)

    def explained(self, round_no: int) -> dict[str, list[str]]:
        return dict(self._explained.get(round_no, {}))


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
        "step": 0,
    }


# ---- /ws -------------------------------------------------------------------------------
async def _pump(name: str, sub: Subscription, outbox: asyncio.Queue) -> None:
    """Move this engine's events from its subscription to the outbox, in batches."""
    while True:
        events = await sub.drain_async(MAX_BATCH)
        if not events:  # closed
            return
        batch = {"type": "events", "engine": name, "events": [to_dict(e) for e in events]}
        await outbox.put({**batch, "dropped": sub.dropped})


async def _write(websocket: WebSocket, outbox: asyncio.Queue) -> None:
    while True:
        await websocket.send_text(json.dumps(await outbox.get()))


async def serve_client(websocket: WebSocket, hub: Hub) -> None:
    await websocket.accept()
    client, hello = await hub.loop.acall(hub.join) if hub.loop else (None, hub.hello())
    await websocket.send_text(json.dumps(hello))
    if hub.mode == "replay":
        traces = {
            n: {"header": t.header, "events": [to_dict(e) for e in t.events]}
            for n, t in hub.replay.items()
        }
        await websocket.send_text(json.dumps({"type": "replay", "traces": traces}))
    outbox: asyncio.Queue = asyncio.Queue(OUTBOX_SIZE)
    tasks = [asyncio.create_task(_write(websocket, outbox))]
    if client is not None:
        tasks += [asyncio.create_task(_pump(n, s, outbox)) for n, s in client.subs.items()]
    try:
        while True:
            reply = await handle_control(hub, await websocket.receive_text())
            await outbox.put(reply)
    except (WebSocketDisconnect, RuntimeError):  # closed by the browser, or mid-send
        pass
    finally:
        if client is not None:
            hub.disconnect(client)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# ---- the app ---------------------------------------------------------------------------
def create_app(engine_loop: EngineLoop | None, **options: Any) -> FastAPI:
    """The FastAPI app serving the visualizer and ``/ws`` for these engines (or a replay);
    ``options`` are the Hub's. minicb.server.openai_api adds the OpenAI routes to it."""
    hub = Hub(engine_loop, **options)
    app = FastAPI(title="minicb", docs_url=None, redoc_url=None)
    app.state.hub = hub

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(VIZ_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/plotly.min.js", include_in_schema=False)
    def plotly_js() -> FileResponse:
        """plotly.min.js as shipped inside the plotly Python package: the viz works offline."""
        import plotly

        path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
        return FileResponse(path, media_type="text/javascript")

    @app.get("/viz/info", include_in_schema=False)
    async def info() -> JSONResponse:
        return JSONResponse(await hub.loop.acall(hub.hello) if hub.loop else hub.hello())

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await serve_client(websocket, hub)

    app.mount("/viz", StaticFiles(directory=VIZ_DIR), name="viz")
    return app
