"""The ``TenantGate``: the fair queue (minicb/fleet/tenancy/) at the API's door.

With ``serve --tenant ...`` (or ``--fair-queue``), a request that passed every check waits
here, in its tenant's lane, until the fleet has room: fewer than ``max_in_flight`` (a
replica's slots, by default) times its serving replicas in flight. Then the router picks
among the replicas holding fewer than ``max_in_flight`` (Fleet.limit_in_flight; one
always does, as requests leave a replica before they give their place back here), so
the replicas' own waiting queues stay short and the order in which requests start is the
fair queue's, not each engine's first come, first served. A request holds its place from
dispatch until its reply ends (finished, aborted, failed, or its client gone), then the
next one goes.

It lives on the event loop, beside the handlers: waiting is an awaited future, so a
queued request costs no thread, and a client that hangs up while queued leaves the queue
at once (its tokens go back to its bucket). Refusals are 429s naming the limit: a full
tenant queue (``tenant_queue_full``), a tenant over its token rate
(``tenant_rate_limited``, with ``Retry-After``: the seconds until its bucket holds the
request), or a request larger than the tenant's whole burst (``tenant_request_too_large``,
a 400: waiting would never help).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from minicb.core.latency import percentile
from minicb.driver.engine_loop import EngineLoop
from minicb.fleet.tenancy.fair_queue import REFUSAL_REASONS, FairQueue, Queued, Refused
from minicb.fleet.tenancy.uncached import uncached_tokens
from minicb.server.api_error import APIError

KEEP_WAITS = 1000  # waits remembered per tenant, for its percentiles


class TenantGate:
    def __init__(
        self, loop: EngineLoop, engine_name: str, queue: FairQueue, max_in_flight: int
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"--max-in-flight must be at least 1, got {max_in_flight}")
        self.loop, self.engine_name = loop, engine_name
        self.queue, self.max_in_flight = queue, max_in_flight
        limit = getattr(loop.fleets.get(engine_name), "limit_in_flight", None)
        if limit is not None:  # a fleet of replicas routes only where there is room
            limit(max_in_flight)
        self.in_flight = 0
        # each tenant's latest waits in the queue (seconds): what the queue itself costs it
        self.waits: dict[str, deque[float]] = {}
        self._waiters: dict[Queued, asyncio.Future[None]] = {}

    def capacity(self) -> int:
        """Requests the fleet takes at once: ``max_in_flight`` per serving replica (at
        least one replica's worth, so a fleet whose replicas all restart still queues)."""
        fleet = self.loop.fleets.get(self.engine_name)
        if fleet is None:
            return self.max_in_flight
        serving = sum(bool(getattr(r, "serving", True)) for r in fleet.replicas.values())
        return self.max_in_flight * max(1, serving)

    def cost(self, token_ids: list[int]) -> int:
        """Uncached prompt tokens, as the fleet's router expects them (no router: all)."""
        router = getattr(self.loop.fleets.get(self.engine_name), "router", None)
        return len(token_ids) if router is None else uncached_tokens(router, token_ids)

    async def enter(
        self, request: Request, tenant: str, token_ids: list[int], max_tokens: int
    ) -> Callable[[], None]:
        """Wait for this request's turn; returns the function that gives its place back
        (call it once its reply has ended). APIError 429/400 if refused; a client that
        hangs up while waiting leaves the queue (APIError 499, never sent)."""
        now = asyncio.get_running_loop().time()
        asked = len(token_ids) + max_tokens
        try:
            entry = self.queue.push(None, tenant, self.cost(token_ids), asked, now)
        except Refused as refused:
            raise _refusal(refused) from None
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[entry] = turn
        self._dispatch()
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({turn, gone}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the handler was cancelled
            self._leave(entry, turn)
            raise
        finally:
            gone.cancel()
        if not turn.done():
            self._leave(entry, turn)
            raise APIError("the client went away while queued", 499, code="client_closed")
        return _once(self._release)

    def _leave(self, entry: Queued, turn: asyncio.Future[None]) -> None:
        """A request that will not run leaves: out of the queue, or, if its turn came
        as it left, its place given back at once."""
        if turn.done() and not turn.cancelled():
            self._release()
            return
        self._waiters.pop(entry, None)
        self.queue.remove(entry)
        turn.cancel()

    def _dispatch(self) -> None:
        while self.in_flight < self.capacity():
            entry = self.queue.pop()
            if entry is None:
                return
            self.in_flight += 1
            self._waiters.pop(entry).set_result(None)
            waited = asyncio.get_running_loop().time() - entry.arrival
            self.waits.setdefault(entry.tenant, deque(maxlen=KEEP_WAITS)).append(waited)

    def _release(self) -> None:
        self.in_flight -= 1
        self._dispatch()

    def snapshot(self) -> dict[str, Any]:
        """The queue by tenant (with the p50 and p99 of its latest waits in it), and the
        fleet's room (the page and /metrics read it)."""
        tenants = self.queue.snapshot()
        for name, waits in self.waits.items():
            ordered = sorted(waits)
            tenants[name]["wait_p50_s"] = percentile(ordered, 50)
            tenants[name]["wait_p99_s"] = percentile(ordered, 99)
        return {"in_flight": self.in_flight, "capacity": self.capacity(), "tenants": tenants}


def install_tenant_route(app: FastAPI, gate: TenantGate | None, reader: list[Any]) -> None:
    """``GET /fleet/tenants``: the snapshot as JSON, for the page's tenants panel
    (viz/tenants.js), behind the same key as /metrics (``reader``: its dependencies);
    ``{"tenants": null}`` from a server with no fair queue. Tenant names only, never keys."""

    async def tenants() -> JSONResponse:
        body = {"tenants": None} if gate is None else gate.snapshot()
        return JSONResponse(body, headers={"Cache-Control": "no-store"})

    app.add_api_route("/fleet/tenants", tenants, methods=["GET"], dependencies=reader)


def prometheus_lines(gate: TenantGate) -> bytes:
    """The fair queue in the Prometheus text format, per tenant: requests and uncached
    prompt tokens queued, requests dispatched, and refusals by reason."""
    snap = gate.snapshot()
    families = {
        "minicb:tenant_queued_requests": ("gauge", "queued"),
        "minicb:tenant_queued_tokens": ("gauge", "queued_tokens"),
        "minicb:tenant_dispatched_total": ("counter", "dispatched"),
    }
    lines = []
    for name, (kind, key) in families.items():
        lines.append(f"# TYPE {name} {kind}")
        lines += [f'{name}{{tenant="{_label(t)}"}} {v[key]}' for t, v in snap["tenants"].items()]
    lines.append("# TYPE minicb:tenant_rejected_total counter")
    for t, v in snap["tenants"].items():
        for reason in REFUSAL_REASONS:
            count = v["rejected"].get(reason, 0)
            labels = f'tenant="{_label(t)}",reason="{reason}"'
            lines.append(f"minicb:tenant_rejected_total{{{labels}}} {count}")
    for name in ("in_flight", "capacity"):
        metric = f"minicb:fair_queue_{name}"
        lines += [f"# TYPE {metric} gauge", f"{metric} {snap[name]}"]
    return ("\n".join(lines) + "\n").encode()


def _label(value: str) -> str:
    """A Prometheus label value, escaped as its text format wants."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


async def released_after(
    body: AsyncIterator[Any], release: Callable[[], None]
) -> AsyncIterator[Any]:
    """A streamed reply that gives its place back when it ends (or its client leaves)."""
    try:
        async for chunk in body:
            yield chunk
    finally:
        release()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _once(fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` callable many times, run the first only: a reply may end on several paths."""
    done = itertools.count()
    return lambda: None if next(done) else fn()


def _refusal(refused: Refused) -> APIError:
    if refused.retry_after_s is None:
        return APIError(refused.message, 400, code="tenant_request_too_large", param="max_tokens")
    return APIError(
        f"{refused.message}; retry in {refused.retry_after_s} s",
        status=429,
        type="rate_limit_error",
        code=f"tenant_{refused.reason}",
        headers={"Retry-After": str(refused.retry_after_s)},
    )
