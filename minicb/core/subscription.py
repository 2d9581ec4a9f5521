"""Subscription: a step's events queued for another thread or an asyncio loop.

A subscription is a bus listener of the one shape (``sub(events)``), made by
``EventBus.subscribe_async``, whose call only queues the events: the engine thread puts; a
consumer takes, by polling ``drain()``, blocking in ``get(timeout)``, or awaiting
``drain_async()`` from an asyncio loop (a browser's WebSocket). ``put`` never waits for the
consumer: when the queue is full the oldest event is dropped and counted in ``dropped``, so a
consumer that stops reading costs the engine one short lock per step and its memory stays
bounded.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from minicb.core.events import Event


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
