"""One bus over a fleet's replicas, for listeners that count the whole fleet.

Each replica re-publishes its engine's events on its own bus (replica.py), and each numbers
its own requests; a fleet (fleet.py's, disagg_fleet.py's) has no bus of its own but this
fan-out, which subscribes a listener on every replica's bus at once.
"""

from __future__ import annotations

from collections.abc import Iterable

from minicb.core.bus import Listener
from minicb.fleet.replica import Replica


class FleetBus:
    """Subscribing here subscribes on every replica's bus: for listeners that count the
    whole fleet (the API's waiting-queue gate), never ones that key on request ids (each
    replica numbers its own)."""

    def __init__(self, replicas: Iterable[Replica]) -> None:
        self.replicas = list(replicas)

    def subscribe(self, listener: Listener, kinds: Iterable[str] | None = None) -> Listener:
        kinds = None if kinds is None else list(kinds)
        for replica in self.replicas:
            replica.bus.subscribe(listener, kinds)
        return listener

    def unsubscribe(self, listener: Listener) -> None:
        for replica in self.replicas:
            replica.bus.unsubscribe(listener)
