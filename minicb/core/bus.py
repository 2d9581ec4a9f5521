"""EventBus: the one path by which anyone hears what the engine did.

Every engine owns one bus (``engine.bus``) and publishes typed events on it
(minicb.core.events). Whoever wants to know subscribes a listener, and a listener has
one shape: a callable that takes a sequence of events, ``listener(events)``. The engine
hands over a step's events at once (``emit_many``): each listener gets the step's events it
asked for, in order, in one call, before the next listener gets any (the per-event calls
of an earlier design were most of the bus's own cost at 16 running: docs/performance.md).

Listeners are called in the engine thread in the order they subscribed; keep them quick,
they are part of the step. Whoever reads from another thread or an asyncio loop (a
browser's WebSocket) subscribes a ``Subscription`` (``subscribe_async``; its own file,
minicb.core.subscription): a listener of the same shape whose call only queues the
events in a bounded queue, which never makes the engine wait.
minicb.telemetry.listener.HandlerListener makes a listener of ``_on_<kind>`` methods.

Subscribers may ask for some kinds of event only. The engine builds nothing for a kind
nobody asked for (``wants``), and when nobody listens at all it builds no event at all.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from minicb.core.events import EVENT_KINDS, Event
from minicb.core.subscription import Subscription

log = logging.getLogger(__name__)

Listener = Callable[[Sequence[Event]], Any]  # takes a step's events, in order; read-only


class EventBus:
    def __init__(self) -> None:
        # Who gets events, in order, and which kinds (None: all): a copy-on-write tuple,
        # which the engine thread reads without a lock while other threads subscribe and
        # unsubscribe.
        self._listeners: tuple[tuple[Listener, frozenset[str] | None], ...] = ()
        self._wanted: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    # ---- subscribing ---------------------------------------------------------------------
    def subscribe(self, listener: Listener, kinds: Iterable[str] | None = None) -> Listener:
        """Call ``listener(events)`` in the engine thread with each step's events (of
        ``kinds``), and with each event emitted between steps; returns ``listener``."""
        with self._lock:
            self._listeners += ((listener, _kinds(kinds)),)
            self._refresh()
        return listener

    def unsubscribe(self, listener: Listener) -> None:
        with self._lock:
            self._listeners = tuple(s for s in self._listeners if s[0] is not listener)
            self._refresh()

    def subscribe_async(
        self, maxsize: int = 1024, kinds: Iterable[str] | None = None
    ) -> Subscription:
        """A bounded queue of events for another thread; ``close()`` it when done."""
        sub = Subscription(maxsize, _kinds(kinds), on_close=self.unsubscribe)
        return self.subscribe(sub, sub.kinds)

    def _refresh(self) -> None:
        wanted: set[str] = set()
        for _, kinds in self._listeners:
            wanted |= EVENT_KINDS if kinds is None else kinds
        self._wanted = frozenset(wanted)

    @property
    def listening(self) -> bool:
        return bool(self._wanted)

    def wants(self, kind: str) -> bool:
        return kind in self._wanted

    def emit(self, event: Event) -> None:
        self.emit_many((event,))

    def emit_many(self, events: Sequence[Event]) -> None:
        """Deliver ``events`` (a step's, in order): each listener gets those of its kinds in
        one call, before the next one; a listener that unsubscribes meanwhile still gets
        this call's events, and none after. A listener that raises (a trace on a full disk)
        is logged and unsubscribed: the engine's step and the other listeners go on."""
        events = tuple(events)  # one shared, read-only sequence for every listener
        for listener, kinds in self._listeners:
            share = events if kinds is None else [e for e in events if e.kind in kinds]
            if share:
                try:
                    listener(share)
                except Exception:
                    log.exception("event listener %r raised; it hears no more events", listener)
                    if isinstance(listener, Subscription):
                        listener.close()  # wakes its consumer too; the bus forgets it
                    else:
                        self.unsubscribe(listener)


def _kinds(kinds: Iterable[str] | None) -> frozenset[str] | None:
    if kinds is None:
        return None
    chosen = frozenset(kinds)
    unknown = sorted(chosen - EVENT_KINDS)
    if unknown:
        raise ValueError(
            f"unknown event kind(s) {unknown}; known: {', '.join(sorted(EVENT_KINDS))}"
        )
    return chosen
