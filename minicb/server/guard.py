"""Who may come in: the ``Guard``, one key check (roles: controller or viewer; 401
otherwise) and, for WebSockets, one Origin check, shared by the OpenAI routes, ``/ws``,
``/metrics``, ``/viz/info`` and a replay's traces.

``LOOPBACK`` names the hosts a server with no key may listen on (launch.server_guard).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import Request

from minicb.server.api_error import APIError

CONTROLLER, VIEWER = "controller", "viewer"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class Guard:
    """The one door for everything that shows traffic or changes state: /v1, /ws, /metrics
    (unless ``metrics_public``), /viz/info and the replay's traces.

    With no ``api_key`` there is no door (the server then listens on loopback only, see
    launch.server_guard) and every connection is a controller. With one, a connection
    shows a key: ``api_key`` makes it a controller (the API, pause, step, settings,
    prompts), ``viewer_key`` a read-only viewer of the timeline; anything else is refused.
    ``show_text`` lets viewers (and, in serve mode, everyone) see prompts and outputs.
    """

    api_key: str | None = None
    viewer_key: str | None = None
    allowed_origins: tuple[str, ...] = ()
    metrics_public: bool = False
    show_text: bool = False

    def role(self, key: str | None) -> str | None:
        """CONTROLLER, VIEWER, or None for a key that opens nothing."""
        if self.api_key is None:
            return CONTROLLER
        given = (key or "").encode("utf-8", "replace")
        # compare_digest: the time taken does not tell how much of a guess was right
        for role, secret in ((CONTROLLER, self.api_key), (VIEWER, self.viewer_key)):
            if secret and hmac.compare_digest(given, secret.encode("utf-8")):
                return role
        return None

    def origin_ok(self, origin: str | None, host: str | None) -> bool:
        """Whether a WebSocket from a page at ``origin`` may connect. Browsers send Origin
        on every WebSocket and apply no same-origin rule to them, so this check is what
        keeps a page of any other site from reading and driving the server; a client
        that is no browser sends none."""
        if origin is None:
            return True
        own = {f"http://{host}", f"https://{host}"} if host else set()
        return origin.rstrip("/") in own | {o.rstrip("/") for o in self.allowed_origins}

    @staticmethod
    def key_of(request: Request) -> str | None:
        """The key an HTTP request shows: ``Authorization: Bearer`` or, for a browser's
        address bar, ``?key=``."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return token.strip() if scheme.lower() == "bearer" else request.query_params.get("key")

    def http_check(self, *roles: str) -> Callable[[Request], Awaitable[None]]:
        """A route dependency: 401 unless the request's key has one of ``roles``."""

        async def check(request: Request) -> None:
            if self.role(self.key_of(request)) not in roles:
                raise APIError(
                    "missing or incorrect API key; send the header Authorization: Bearer <key>",
                    status=401,
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )

        return check
