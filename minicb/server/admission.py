"""Admission control at the door: a bound on the engine's waiting queue, answered with 429,
and the optional API key, answered with 401.

The scheduler already refuses a request that could never fit (longer than the context,
larger than the whole KV pool). What it cannot refuse is *too many* requests that each
fit: they would queue without limit, and every one of them would wait longer. The gate
counts the engine's waiting requests and turns new ones away, with ``Retry-After``, once
``max_waiting`` are queued, so a load generator sees back-pressure instead of a
growing latency.

The count is read where it lives: the gate is an engine observer, refreshed in the engine
thread on every arrival, abort and step (the queue also holds requests that did not come
through the API, e.g. a demo workload). Handlers on the event loop add the submissions
they have sent to the engine thread but that have not arrived yet, so a burst of
concurrent requests cannot all slip past the bound between two refreshes. A submission
is known by its SamplingParams object, which the engine keeps as the request's own: the
engine thread strikes it off at arrival, in the same moment the queue count grows, so a
request is never counted twice (which would refuse requests below the bound).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import Request

from minicb.config import SamplingParams
from minicb.server.openai_errors import APIError

RETRY_AFTER_S = 1


class WaitingGate:
    def __init__(self, engine: Any, max_waiting: int) -> None:
        if max_waiting < 1:
            raise ValueError(f"max_waiting must be at least 1, got {max_waiting}")
        self.max_waiting = max_waiting
        self.waiting = 0  # written in the engine thread, read on the event loop (one int)
        # ids of the SamplingParams of submissions on their way to the engine thread
        self.in_transit: set[int] = set()
        self.refused = 0
        self.attach(engine)

    def attach(self, engine: Any) -> None:
        """Watch ``engine`` (again after the demo rebuilds its engines with new settings)."""
        self._scheduler = engine.scheduler
        engine.add_observer(self)
        self._refresh()

    # ---- engine observer (engine thread) -------------------------------------------------
    def _refresh(self, *_: Any) -> None:
        self.waiting = len(self._scheduler.waiting)

    request_aborted = step_done = _refresh

    def request_arrived(self, req: Any) -> None:
        self._refresh()  # count it as waiting first, then as no longer in transit
        self.in_transit.discard(id(req.params))

    # ---- the door (event loop) -----------------------------------------------------------
    @contextmanager
    def admit(self, params: SamplingParams) -> Iterator[None]:
        """Hold a place while a submission (known by its ``params``) travels to the engine;
        429 if the queue is full. Keep ``params`` alive meanwhile: its id is the ticket."""
        if self.waiting + len(self.in_transit) >= self.max_waiting:
            self.refused += 1
            raise APIError(
                f"the server's queue is full ({self.max_waiting} requests waiting); "
                f"retry in {RETRY_AFTER_S} s",
                status=429,
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        ticket = id(params)
        self.in_transit.add(ticket)
        try:
            yield
        finally:
            self.in_transit.discard(ticket)  # refused by the engine, or already struck off


def bearer_check(api_key: str) -> Callable[[Request], Awaitable[None]]:
    """A route dependency: 401 unless the request sends ``Authorization: Bearer <api_key>``."""
    expected = api_key.encode("utf-8")

    async def check(request: Request) -> None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        given = token.strip().encode("utf-8", "replace")
        # compare_digest: the time taken does not tell how much of a guess was right
        if scheme.lower() != "bearer" or not hmac.compare_digest(given, expected):
            raise APIError(
                "missing or incorrect API key; send the header Authorization: Bearer <key>",
                status=401,
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return check
