"""Who may come in: the ``Guard``, one Host check before any route (``HostCheck``), one
key check (roles: controller or viewer; 401 otherwise, and wrong keys slowed down per
client) and, for WebSockets, one Origin check, shared by the OpenAI routes, ``/ws``,
``/metrics``, ``/viz/info`` and a replay's traces.

Tenant keys (``--tenant-key``) open /v1 and nothing else (not /ws, /metrics, the page),
and each is its own tenant of the prefix cache: every request it makes is salted with its
identity (``tenant``: an HMAC of the key under a random per-server secret, never the key
itself), so one tenant cannot learn from cached-token counts or timings what another sent.
Named tenants (``serve --tenant NAME:KEY:PRIORITY``) are tenant keys with a name: the
fair queue (tenant_gate.py) queues their requests under it; an unnamed tenant key's
requests queue under its identity, and the controller's (or, with no key, anyone's)
under ``default``.

``LOOPBACK`` names the hosts a server with no key may listen on (launch.server_guard).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request

from minicb.fleet.tenancy.tenant import DEFAULT_TENANT
from minicb.server.api_error import APIError

CONTROLLER, VIEWER = "controller", "viewer"
LOOPBACK = ("127.0.0.1", "::1", "localhost")
# Wrong keys a client (an address) may show in a burst, then one per GUESS_INTERVAL_S: a
# key of 16 random characters then takes longer than the universe's age to guess.
GUESS_BURST, GUESS_INTERVAL_S = 10, 1.0
KEEP_GUESSERS = 4096  # addresses whose wrong keys are counted (the oldest are forgotten)


@dataclass
class GuessLimit:
    """Wrong keys per client address, as a token bucket: while one is out of guesses,
    every key it shows is refused unread, the right one too, so guessing faster than
    one key a second teaches it nothing. Other addresses are not slowed."""

    burst: int = GUESS_BURST
    interval_s: float = GUESS_INTERVAL_S
    # address -> (guesses left, when counted)
    _left: OrderedDict[str, tuple[float, float]] = field(default_factory=OrderedDict)

    def _now_left(self, who: str) -> float:
        left, then = self._left.get(who, (self.burst, 0.0))
        return min(self.burst, left + (time.monotonic() - then) / self.interval_s)

    def blocked(self, who: str) -> bool:
        return self._now_left(who) < 1

    def wrong(self, who: str) -> None:
        self._left[who] = (self._now_left(who) - 1, time.monotonic())
        self._left.move_to_end(who)
        while len(self._left) > KEEP_GUESSERS:
            self._left.popitem(last=False)


@dataclass(frozen=True)
class Guard:
    """The one door for everything that shows traffic or changes state: /v1, /ws, /metrics
    (unless ``metrics_public``), /viz/info and the replay's traces.

    With no ``api_key`` there is no door (the server then listens on loopback only, see
    launch.server_guard) and every connection is a controller. With one, a connection
    shows a key: ``api_key`` makes it a controller (the API, pause, step, settings,
    prompts), ``viewer_key`` a read-only viewer of the timeline; anything else is refused.
    ``show_text`` lets viewers (and, in serve mode, everyone) see prompts and outputs.
    ``tenant_keys`` open /v1 only, each a tenant of its own in the prefix cache (``tenant``).
    """

    api_key: str | None = None
    viewer_key: str | None = None
    allowed_origins: tuple[str, ...] = ()
    metrics_public: bool = False
    show_text: bool = False
    allowed_hosts: tuple[str, ...] = ()  # names beyond loopback and IP addresses
    guesses: GuessLimit = field(default_factory=GuessLimit, compare=False)
    tenant_keys: tuple[str, ...] = ()
    # (key, name) of the named tenants; their keys are among tenant_keys
    tenant_names: tuple[tuple[str, str], ...] = ()
    # Keys the tenants' identities: random per server, so nobody can compute one.
    _tenant_secret: bytes = field(
        default_factory=lambda: secrets.token_bytes(32), compare=False, repr=False
    )

    def __post_init__(self) -> None:
        if self.tenant_keys and self.api_key is None:
            raise ValueError("--tenant-key needs --api-key (with no key the server has no door)")
        if {self.api_key, self.viewer_key} & set(self.tenant_keys) or "" in self.tenant_keys:
            raise ValueError("each --tenant-key must be non-empty and differ from the other keys")

    def tenant(self, key: str | None, who: str | None = None) -> str | None:
        """The tenant a tenant key names, "key:" and 32 hex digits of its HMAC (never the
        key in clear: it goes into each request's cache salt, and traces record that);
        None for any other key, and for a client out of guesses."""
        if key is None or (who is not None and self.guesses.blocked(who)):
            return None
        given = key.encode("utf-8", "replace")
        for secret in self.tenant_keys:
            if hmac.compare_digest(given, secret.encode("utf-8")):
                digest = hmac.new(self._tenant_secret, given, hashlib.sha256).hexdigest()
                return "key:" + digest[:32]
        return None

    def tenant_name(self, key: str | None, identity: str | None) -> str:
        """The name the fair queue knows a request by: a named tenant's name, else the
        tenant key's ``identity`` (Guard.tenant), else DEFAULT_TENANT."""
        if identity is None or key is None:
            return DEFAULT_TENANT
        given = key.encode("utf-8", "replace")
        for secret, name in self.tenant_names:
            if hmac.compare_digest(given, secret.encode("utf-8")):
                return name
        return identity

    def role(self, key: str | None, who: str | None = None) -> str | None:
        """CONTROLLER, VIEWER, or None for a key that opens nothing. ``who``: the client's
        address, whose wrong keys are counted; one out of guesses gets None, unread."""
        if self.api_key is None:
            return CONTROLLER
        if who is not None and self.guesses.blocked(who):
            return None
        given = (key or "").encode("utf-8", "replace")
        # compare_digest: the time taken does not tell how much of a guess was right
        for role, secret in ((CONTROLLER, self.api_key), (VIEWER, self.viewer_key)):
            if secret and hmac.compare_digest(given, secret.encode("utf-8")):
                return role
        if who is not None and key is not None:  # no key at all is no guess
            self.guesses.wrong(who)
        return None

    def host_ok(self, host: str | None) -> bool:
        """Whether a request's ``Host`` header names this server. A page of a foreign site
        whose name its DNS points at 127.0.0.1 (DNS rebinding) sends that name: refusing
        it keeps such a page from reading and driving a server on loopback. An IP address
        cannot be rebound, so any is accepted (a class reaches the teacher's machine by
        its address); other names only if listed with ``--allowed-host``."""
        name = _host_name(host or "").lower()
        if name == "localhost" or name in (h.lower() for h in self.allowed_hosts):
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True

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
            who = request.client.host if request.client else None
            if self.role(self.key_of(request), who) not in roles:
                raise APIError(
                    "missing or incorrect API key; send the header Authorization: Bearer <key>",
                    status=401,
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )

        return check

    def api_check(self) -> Callable[[Request], Awaitable[None]]:
        """The /v1 dependency: a tenant key (its tenant put in ``request.state.tenant``)
        or the controller's key; 401 otherwise."""
        controller = self.http_check(CONTROLLER)

        async def check(request: Request) -> None:
            who = request.client.host if request.client else None
            key = self.key_of(request)
            request.state.tenant = self.tenant(key, who)
            request.state.tenant_name = self.tenant_name(key, request.state.tenant)
            if request.state.tenant is None:
                await controller(request)

        return check


def _host_name(host: str) -> str:
    """The name in a Host header, without its port: "[::1]:8000" -> "::1"."""
    if host.startswith("["):
        return host[1 : host.find("]")]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class HostCheck:
    """ASGI middleware: a request (HTTP or WebSocket) whose Host the guard does not accept
    is answered 403 before any route runs."""

    def __init__(self, app: Any, guard: Guard) -> None:
        self.app, self.guard = app, guard

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        host = dict(scope.get("headers") or ()).get(b"host", b"").decode("latin-1")
        if self.guard.host_ok(host):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            await receive()  # the connect message; closing before accept answers 403
            return await send({"type": "websocket.close", "code": 1008})
        why = (
            f"Host {host!r} is not a name of this server; give it with --allowed-host "
            "(localhost and IP addresses need none)"
        )
        body = APIError(why, 403, code="host_not_allowed").body()
        await send(
            {
                "type": "http.response.start",
                "status": 403,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": json.dumps(body).encode()})


def check_hosts(app: FastAPI, guard: Guard) -> None:
    """Put ``HostCheck`` in front of ``app`` (once, whoever asks first)."""
    if not getattr(app.state, "host_check", False):
        app.add_middleware(HostCheck, guard=guard)
        app.state.host_check = True
