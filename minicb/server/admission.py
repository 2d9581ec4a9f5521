"""Admission control at the door: a bound on the engine's waiting queue, answered with 429.

The scheduler already refuses a request that could never fit (longer than the context,
larger than the whole KV pool). What it cannot refuse is *too many* requests that each
fit: they would queue without limit, and every one of them would wait longer. The gate
counts the engine's waiting requests and turns new ones away, with ``Retry-After``, once
``max_waiting`` are queued, so a load generator sees back-pressure instead of a
growing latency.

The count is read where it lives: the gate is an engine observer, refreshed in the engine
thread on every arrival, abort and step (the queue also holds requests that did not come
through the API, e.g. a demo workload). Handlers on the event loop read it, plus the
submissions they have sent to the engine thread but not yet seen arrive, so a burst of
concurrent requests cannot all slip past the bound between two refreshes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from minicb.server.openai_errors import APIError

RETRY_AFTER_S = 1


class WaitingGate:
    def __init__(self, engine: Any, max_waiting: int) -> None:
        if max_waiting < 1:
            raise ValueError(f"max_waiting must be at least 1, got {max_waiting}")
        self.max_waiting = max_waiting
        self.waiting = 0  # written in the engine thread, read on the event loop (one int)
        self.in_transit = 0  # submissions on their way to the engine (event loop only)
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

    request_arrived = request_aborted = step_done = _refresh

    # ---- the door (event loop) -----------------------------------------------------------
    @contextmanager
    def admit(self) -> Iterator[None]:
        """Hold a place while a submission travels to the engine; 429 if the queue is full."""
        if self.waiting + self.in_transit >= self.max_waiting:
            self.refused += 1
            raise APIError(
                f"the server's queue is full ({self.max_waiting} requests waiting); "
                f"retry in {RETRY_AFTER_S} s",
                status=429,
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        self.in_transit += 1
        try:
            yield
        finally:
            self.in_transit -= 1
