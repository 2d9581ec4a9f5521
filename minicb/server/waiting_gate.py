"""The ``WaitingGate``: the OpenAI routes' bound on an engine's waiting queue, answered at
the door with 429 ``queue_full`` and ``Retry-After``."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from minicb.core.events import Event
from minicb.server.api_error import busy


class WaitingGate:
    """A bound on the engine's waiting queue, answered with 429 and ``Retry-After``.

    The scheduler refuses a request that could never fit, not *too many* that each fit
    (they would queue without limit): the gate gives a load generator back-pressure.
    It listens to the engine's bus and reads ``queue_sizes()`` on every arrival, abort and
    step (the engine looked up by name, so a rebuild needs no hook). Handlers add the
    submissions still on their way to the engine thread, so a burst cannot slip past the
    bound between two reads; each ticket is struck off in the engine thread just after its
    arrival made the count grow, so no request is counted twice.
    """

    KINDS = ("arrived", "aborted", "step")

    def __init__(self, engines: dict[str, Any], name: str, max_waiting: int) -> None:
        self.engines, self.name, self.max_waiting = engines, name, max_waiting
        self.waiting = 0  # written in the engine thread, read on the event loop (one int)
        self.in_transit: set[object] = set()  # tickets of submissions not queued yet
        engines[name].bus.subscribe(self, kinds=self.KINDS)

    def __call__(self, events: Sequence[Event]) -> None:
        self.waiting = self.engines[self.name].queue_sizes()["waiting"]

    @contextmanager
    def admit(self) -> Iterator[Callable[[], None]]:
        """Hold a place while a submission travels to the engine thread, or 429 if the
        queue is full. Yields the function that strikes the place off: hand it to
        ``EngineLoop.submit(on_queued=...)``."""
        if self.waiting + len(self.in_transit) >= self.max_waiting:
            raise busy(
                f"the server's queue is full ({self.max_waiting} requests waiting)", "queue_full"
            )
        ticket = object()
        self.in_transit.add(ticket)
        try:
            yield lambda: self.in_transit.discard(ticket)
        finally:
            self.in_transit.discard(ticket)  # refused by the engine, or already struck off
