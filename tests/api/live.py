"""A live server for the API tests: uvicorn on 127.0.0.1, a free port, a background thread.

The socket is bound before uvicorn starts (port 0, then handed over), so two servers in
one session never race for a port.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI

from minicb.driver.engine_loop import EngineLoop
from minicb.server.openai_api import install_openai_routes

# TestClient's base address: a Host the server accepts (its default, "testserver", is no
# name of this server: the Host check refuses it, as it would a DNS-rebinding page's).
LOCAL = "http://127.0.0.1"


@contextmanager
def live_server(app: FastAPI, log_level: str = "warning") -> Iterator[str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # no permessage-deflate, as launch.run_server: frames come compressed already
    config = uvicorn.Config(
        app, log_level=log_level, lifespan="off", timeout_graceful_shutdown=1,
        ws_per_message_deflate=False,
    )  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@contextmanager
def api_server(engine: Any, model_name: str = "tiny", **options: Any) -> Iterator[Any]:
    """A bare app with the OpenAI routes over ``engine`` (named "api"), served live.

    Yields a namespace with ``url``, ``loop``, ``engine``, ``bus`` and ``app``.
    """
    loop = EngineLoop({"api": engine})
    app = FastAPI()
    install_openai_routes(app, loop, "api", model_name, **options)
    loop.start()
    try:
        with live_server(app) as url:
            yield _Live(url=url, loop=loop, engine=engine, bus=engine.bus, app=app)
    finally:
        loop.stop()


class _Live:
    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def used_blocks(self) -> int:
        return self.loop.call(lambda: self.engine.kv_snapshot().num_used).result(5)


def metric(text: str, name: str) -> float:
    """The value of the first sample of ``name`` in a Prometheus exposition."""
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in " {":
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)
