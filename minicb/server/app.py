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

What the browsers share is the Hub (hub.py); one browser's socket, from the door (keys,
roles, limits) to its last message, is viewer_socket.py; this file builds the app and its
routes.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, Request, WebSocket
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.middleware.gzip import GZipMiddleware

from minicb.server.api_error import APIError, error_handler
from minicb.server.guard import CONTROLLER, VIEWER, Guard, check_hosts
from minicb.server.hub import Hub
from minicb.server.viewer_socket import serve_client

if TYPE_CHECKING:
    from minicb.driver.engine_loop import EngineLoop

# viz/ sits beside the package in the repository (the project is installed editable).
VIZ_DIR = Path(__file__).resolve().parents[2] / "viz"


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
