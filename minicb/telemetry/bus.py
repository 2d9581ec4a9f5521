"""EventBus: the one path by which anyone hears what the engine did.

Every engine owns one bus (``engine.bus``) and publishes typed events on it
(minicb.telemetry.events). Whoever wants to know subscribes a listener, and a listener has
one shape: a callable that takes a sequence of events, ``listener(events)``. The engine
hands over a step's events at once (``emit_many``): each listener gets the step's events it
asked for, in order, in one call, before the next listener gets any (the per-event calls
of an earlier design were most of the bus's own cost at 16 running: docs/performance.md).

Listeners are called in the engine thread in the order they subscribed; keep them quick,
they are part of the step. Whoever reads from another thread or an asyncio loop (a
browser's WebSocket) subscribes a ``Subscription`` (``subscribe_async``): a listener of the
same shape whose call only queues the events, which never makes the engine wait.
minicb.telemetry.listener.HandlerListener makes a listener of ``_on_<kind>`` methods.

Subscribers may ask for some kinds of event only. The engine builds nothing for a kind
nobody asked for (``wants``), and when nobody listens at all it builds no event at all.

A ``Subscription`` is a bounded, thread-safe queue: the engine thread puts; a consumer
takes, by polling ``drain()``, blocking in ``get(timeout)``, or awaiting ``drain_async()``
from an asyncio loop. ``put`` never waits for the consumer: when the queue is full the
oldest event is dropped and counted in ``dropped``, so a consumer that stops reading costs
the engine one short lock per step and its memory stays bounded.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from minicb.telemetry.events import EVENT_KINDS, Event

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


class Subscription:
    def __init__(
        self,
        maxsize: int,
        kinds: frozenset[str] | None = None,
        on_close: Callable[[Subscription], None] | None = None,
    ) -> None:
        if not isinstance(maxsize, int) or maxsize < 1:
            raise ValueError(f"maxsize must be a positive integer, got {maxsize!r}")
        self.maxsize = maxsize
        self.kinds = kinds  # None: every kind of event
        self.dropped = 0  # events lost because the consumer fell behind
        self.received = 0  # events offered to this subscription, kept or not
        self.closed = False
        self._queue: deque[Event] = deque(maxlen=maxsize)  # full: append drops the oldest
        self._cond = threading.Condition(threading.Lock())
        self._getters = 0  # threads blocked in get(): put() notifies only when there are some
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None
        self._on_close = on_close

    # ---- the engine's side: a listener, as any other -------------------------------------
    def __call__(self, events: Sequence[Event]) -> None:
        self.put_many(events)

    def put(self, event: Event) -> None:
        """Queue ``event``; if full, drop the oldest. Never blocks on the consumer."""
        self.put_many((event,))

    def put_many(self, events: Sequence[Event]) -> None:
        """Queue ``events`` in order under one lock, as one ``put`` each would: the oldest
        beyond ``maxsize`` are dropped and counted. Never blocks on the consumer."""
        with self._cond:
            if self.closed:
                return
            self.received += len(events)
            self.dropped += max(len(self._queue) + len(events) - self.maxsize, 0)
            self._queue.extend(events)  # beyond maxlen, the deque drops from the left (C)
            if self._getters:
                self._cond.notify(len(events))
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            _wake(waiter)

    # ---- the consumer's side -------------------------------------------------------------
    def get(self, timeout: float | None = None) -> Event | None:
        """The oldest queued event; waits up to ``timeout`` s; None on timeout or when closed."""
        with self._cond:
            self._getters += 1
            try:
                self._cond.wait_for(lambda: self._queue or self.closed, timeout)
            finally:
                self._getters -= 1
            return self._queue.popleft() if self._queue else None

    def drain(self, max_items: int | None = None) -> list[Event]:
        """Every queued event (or the oldest ``max_items``), without waiting."""
        with self._cond:
            return self._take(max_items)

    async def drain_async(self, max_items: int | None = None) -> list[Event]:
        """Await at least one event, then return what is queued; [] once closed."""
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if self._queue or self.closed:
                    return self._take(max_items)
                future = loop.create_future()
                self._waiter = (loop, future)
            await future  # resolved from the engine thread by put() or close()

    def _take(self, max_items: int | None) -> list[Event]:
        """Pop up to ``max_items`` events (all if None); the caller holds the lock."""
        if max_items is None or max_items >= len(self._queue):
            items = list(self._queue)
            self._queue.clear()
            return items
        return [self._queue.popleft() for _ in range(max_items)]

    def __len__(self) -> int:
        return len(self._queue)

    def stats(self) -> dict[str, Any]:
        return {
            "queued": len(self._queue),
            "maxsize": self.maxsize,
            "received": self.received,
            "dropped": self.dropped,
        }

    def close(self) -> None:
        """Stop receiving; wakes any waiting consumer. The bus forgets this subscription."""
        with self._cond:
            if self.closed:
                return
            self.closed = True
            self._cond.notify_all()
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            _wake(waiter)
        if self._on_close is not None:
            self._on_close(self)


def _wake(waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future]) -> None:
    loop, future = waiter

    def resolve() -> None:
        if not future.done():  # the consumer may have been cancelled meanwhile
            future.set_result(None)

    try:
        loop.call_soon_threadsafe(resolve)
    except RuntimeError:  # the consumer's loop has closed: nobody is waiting any more
        pass
