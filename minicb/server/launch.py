"""What the server commands share: their options, the guard they ask for, the app, and
serving it until Ctrl-C. Each command's own part is its module, which imports this one
(and is never imported by it: the command line adds each command's parser):

- ``minicb demo`` (demo_command.py): static and continuous batching side by side, live in
  the browser; ``--simulate GPU:MODEL`` at data-centre scale on a GPU that is not there,
  ``--scenario NAME`` a lesson;
- ``minicb serve`` (serve_command.py): the OpenAI-compatible API with the visualizer at
  ``/``, one engine, replicas behind a router, or disaggregated prefill and decode;
- ``minicb replay --serve`` (here): the visualizer fed from recorded traces, with a scrub
  slider and no model.

Who may connect: with no ``--api-key`` the server listens on loopback only (a
non-loopback ``--host`` is refused unless ``--insecure-public``); with one, the
guard (guard.Guard) holds /v1, /ws, /metrics and the replay's traces, and
``--viewer-key`` gives a room read-only access. See docs/serving.md.

Building the parsers imports nothing heavy: torch, the model and uvicorn are imported
when a command runs.
"""

from __future__ import annotations

import argparse
import functools
import logging
import signal
import sys
import threading
import webbrowser
from typing import TYPE_CHECKING, Any

from minicb.server.guard import LOOPBACK, Guard

if TYPE_CHECKING:
    from fastapi import FastAPI

    from minicb.driver.engine_loop import EngineLoop
    from minicb.server.lesson import Lesson
    from minicb.telemetry.trace_reader import Trace

DEFAULT_HOST = "127.0.0.1"  # local only by default: the demo has controls anyone could use
DEFAULT_PORT = 8000
WS_MAX_BYTES = 2 << 20  # the largest WebSocket frame uvicorn reads
# On Ctrl-C or SIGTERM, requests in flight have this long to finish; then the engine thread
# stops and each ends with an error saying so (a stream: an error chunk, then [DONE]).
SHUTDOWN_GRACE_S = 5.0
CUT_AFTER_S = 2.0  # then a connection still open (a client that stopped reading) is cut


# ---- the command line ------------------------------------------------------------------
def add_server_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("server")
    g.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})")
    g.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    g.add_argument("--open", action="store_true", help="open the page in a browser")
    g.add_argument("--api-key", help="the controller's key: /v1 (Bearer), /ws, /metrics")
    g.add_argument("--viewer-key", help="a read-only key for the page (needs --api-key)")
    g.add_argument(
        "--tenant-key",
        action="append",
        default=[],
        metavar="KEY",
        help="a key for /v1 only whose requests share cached prefixes with no other key's "
        "(a cache salt from the key; repeat for each tenant; needs --api-key)",
    )
    g.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="another origin whose pages may open /ws (e.g. https://course.example.org)",
    )
    g.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a name this server is reached by, beyond localhost and IP addresses (e.g. "
        "teacher.local); requests naming any other Host are refused",
    )
    g.add_argument("--show-text", action="store_true", help="viewers see prompts and outputs")
    g.add_argument("--metrics-public", action="store_true", help="/metrics without a key")
    g.add_argument(
        "--insecure-public",
        action="store_true",
        help="listen beyond loopback with no key (anyone who can reach the port can drive it)",
    )


def server_guard(args: argparse.Namespace) -> Guard:
    """The guard the options ask for; ValueError, saying why, for a host it would leave
    open to the network."""
    if args.viewer_key and not args.api_key:
        raise ValueError("--viewer-key needs --api-key (with no key the server has no door)")
    if args.viewer_key and args.viewer_key == args.api_key:
        raise ValueError("--viewer-key must differ from --api-key")
    if not args.api_key and args.host not in LOOPBACK and not args.insecure_public:
        raise ValueError(
            f"refusing to listen on {args.host} without --api-key: anyone who can reach the "
            "port could read every prompt and output and pause, step or rebuild the engine. "
            "Give --api-key KEY (and --viewer-key for a room), or --insecure-public on a "
            "network you trust"
        )
    return Guard(
        api_key=args.api_key,
        viewer_key=args.viewer_key,
        allowed_origins=tuple(args.allowed_origin),
        allowed_hosts=tuple(args.allowed_host),
        metrics_public=args.metrics_public,
        show_text=args.show_text,
        tenant_keys=tuple(args.tenant_key),
    )


def run_server(
    app: Any, args: argparse.Namespace, what: str, loop: EngineLoop | None = None
) -> None:
    """Serve ``app`` (and run ``loop``'s thread) until Ctrl-C or SIGTERM, after printing
    where to look; uvicorn logs at ``--log-level`` where the command has one. On the
    signal, new connections are refused, requests in flight get SHUTDOWN_GRACE_S to finish,
    then the engine thread stops (each request still in flight ends with an error) and
    whatever connection is still open CUT_AFTER_S later is cut."""
    import uvicorn

    host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    url = f"http://{host}:{args.port}/"
    print(f"{what}: open {url} in a browser (Ctrl-C to stop)", flush=True)
    if args.api_key:
        print("  behind a key: the page asks for it once; a link can carry it as ?key=KEY")
    if args.open:
        webbrowser.open(url)
    # uvicorn shuts down gracefully on SIGTERM, then raises it again under the handler it
    # found; with the default one the process would die there, before the caller's finally
    # blocks stop the engine thread and close the trace files. So the handler only notes
    # it (raising there, inside uvicorn's event loop, would throw into the requests it has
    # just cut), and the server exits with SystemExit once uvicorn has returned.
    terminated: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: terminated.append(signum))
    log_level = getattr(args, "log_level", "warning")
    keep_keys_out_of_logs()
    if loop is not None:
        loop.start()
    try:
        # A control is at most 16 KiB (viewer_socket.MAX_MESSAGE_CHARS, answered with an error); a
        # frame far beyond that closes its connection without being buffered whole. No
        # permessage-deflate: the broadcast compresses each frame once for every browser.
        config = uvicorn.Config(
            app, host=args.host, port=args.port, log_level=log_level, ws_max_size=WS_MAX_BYTES,
            ws_per_message_deflate=False,
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S + CUT_AFTER_S,
        )  # fmt: skip
        _serve(config, loop)
    finally:
        if loop is not None:
            loop.stop()
    if terminated:
        sys.exit(128 + terminated[0])


def _serve(config: Any, loop: EngineLoop | None) -> None:
    """uvicorn's server with ``config``, whose shutdown also stops ``loop`` SHUTDOWN_GRACE_S
    after it begins: the requests still in flight then end with an error, so their handlers
    finish before uvicorn's own deadline would cut them (with a traceback each)."""
    import uvicorn

    class EndingServer(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            if loop is not None:
                stop = functools.partial(loop.stop, why="the server is shutting down")
                timer = threading.Timer(SHUTDOWN_GRACE_S, stop)
                timer.daemon = True
                timer.start()
            await super().shutdown(sockets)

    EndingServer(config).run()


def hide_query(record: logging.LogRecord) -> bool:
    """A log filter: paths without their query, which may hold ``?key=KEY``. uvicorn logs
    each request (``uvicorn.access``) and each WebSocket (``uvicorn.error``) with the path
    and query as one of the record's arguments."""
    if isinstance(record.args, tuple):
        record.args = tuple(
            a.split("?", 1)[0] if isinstance(a, str) and a.startswith("/") else a
            for a in record.args
        )
    return True


def keep_keys_out_of_logs() -> None:
    """Log every request's path without its query (uvicorn's logging setup keeps it)."""
    for name in ("uvicorn.access", "uvicorn.error"):
        logging.getLogger(name).addFilter(hide_query)


def build_app(
    loop: EngineLoop,
    mode: str,
    engine: str,
    model_name: str,
    guard: Guard,
    lesson: Lesson | None = None,
    **api: Any,
) -> FastAPI:
    """The visualizer's app for ``loop`` (playing ``lesson``, if any) with the OpenAI
    routes aimed at ``engine``, both behind ``guard``."""
    from minicb.server.app import create_app
    from minicb.server.openai_api import install_openai_routes

    app = create_app(loop, mode=mode, model_name=model_name, guard=guard, lesson=lesson)
    install_openai_routes(app, loop, engine, model_name, guard=guard, **api)
    return app


# ---- replay ----------------------------------------------------------------------------
def serve_replay(traces: dict[str, Trace], args: argparse.Namespace) -> int:
    """The visualizer over recorded traces (panel name -> trace), until Ctrl-C."""
    from minicb.server.app import create_app

    app = create_app(None, mode="replay", replay=traces, guard=server_guard(args))
    run_server(app, args, "minicb replay")
    return 0
