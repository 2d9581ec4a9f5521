"""The web app: the visualizer at ``/``, its files, plotly.js, and the ``/ws`` event stream.

    app = create_app(engine_loop, {"continuous": bus_c, "static": bus_s}, mode="demo")
    uvicorn.run(app, host="127.0.0.1", port=8000)

The app never touches an engine itself: controls go to the engine thread through the
EngineLoop (see minicb.server.controls), and events come back through one bounded
subscription per engine per browser (see minicb.server.ws), so a slow tab loses old
events rather than slowing the engine. Other route sets (the OpenAI-compatible API) are
added to the returned app by their own modules.

Modes: "demo" (engines, a workload feeder, every control), "serve" (one engine behind an
API: no feeder, no rebuilds), "replay" (no engine at all: the browser receives a recorded
trace and scrubs through it).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, WebSocket
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from minicb.server.hub import Hub
from minicb.server.ws import serve_client

if TYPE_CHECKING:
    from minicb.telemetry.bus import EventBus
    from minicb.server.engine_loop import EngineLoop
    from minicb.server.workload import WorkloadFeeder
    from minicb.telemetry.trace import Trace

# viz/ sits beside the package in the repository (the project is installed editable).
VIZ_DIR = Path(__file__).resolve().parents[2] / "viz"
MODES = ("demo", "serve", "replay")


def plotly_js_path() -> Path:
    """plotly.min.js as shipped inside the plotly Python package: the viz works offline."""
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def create_app(
    engine_loop: EngineLoop | None,
    buses: dict[str, EventBus],
    *,
    mode: str = "demo",
    model_name: str = "",
    replay: dict[str, Trace] | None = None,
    feeder: WorkloadFeeder | None = None,
    viz_dir: str | Path | None = None,
    queue_size: int = 4096,
) -> FastAPI:
    """The FastAPI app serving the visualizer and ``/ws`` for these engines (or a replay).

    ``buses`` maps each engine name in ``engine_loop.engines`` to its EventBus; ``replay``
    maps panel names to recorded traces (replay mode, no engine); ``feeder`` is the demo's
    workload feeder, if any; ``queue_size`` bounds each browser's queue per engine.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if mode == "replay" and not replay:
        raise ValueError("replay mode needs at least one trace")
    if mode != "replay" and engine_loop is None:
        raise ValueError(f"{mode} mode needs an engine loop")
    hub = Hub(
        engine_loop,
        buses,
        mode=mode,
        model_name=model_name,
        replay=replay,
        feeder=feeder,
        queue_size=queue_size,
    )
    viz = Path(viz_dir) if viz_dir is not None else VIZ_DIR
    app = FastAPI(title="minicb", docs_url=None, redoc_url=None)
    app.state.hub = hub

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(viz / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/plotly.min.js", include_in_schema=False)
    def plotly_js() -> FileResponse:
        return FileResponse(plotly_js_path(), media_type="text/javascript")

    @app.get("/viz/info", include_in_schema=False)
    def info() -> JSONResponse:
        return JSONResponse(hub.hello())

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await serve_client(websocket, hub)

    app.mount("/viz", StaticFiles(directory=viz), name="viz")
    return app


def hub_of(app: Any) -> Hub:
    """The Hub behind an app built by create_app (for tests and other route modules)."""
    return app.state.hub
