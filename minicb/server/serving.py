"""Serving an app: the --host/--port options and the uvicorn run that prints the address."""

from __future__ import annotations

import argparse
import webbrowser
from typing import Any

DEFAULT_HOST = "127.0.0.1"  # local only by default: the demo has controls anyone could use
DEFAULT_PORT = 8000


def add_server_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("server")
    g.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})")
    g.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    g.add_argument("--open", action="store_true", help="open the page in a browser")


def address(args: argparse.Namespace) -> str:
    host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    return f"http://{host}:{args.port}/"


def run_server(app: Any, args: argparse.Namespace, what: str = "minicb") -> None:
    """Serve ``app`` until Ctrl-C, after printing where to look."""
    import uvicorn

    url = address(args)
    print(f"{what}: open {url} in a browser (Ctrl-C to stop)", flush=True)
    if getattr(args, "open", False):
        webbrowser.open(url)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
