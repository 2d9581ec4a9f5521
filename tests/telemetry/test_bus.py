"""EventBus and Subscription: who hears what, nothing built for nobody, and consumers in
other threads that can fall behind without ever holding the engine up."""

from __future__ import annotations

import asyncio
import threading
from collections import deque

import pytest

import minicb.core.request_events as request_events
from minicb.core.bus import EventBus
from minicb.core.engine import LLMEngine
from minicb.core.request_events import RequestAborted
from minicb.core.subscription import Subscription
from tests.helpers import add, fake_engine, wait_for


def busy_engine(n_requests: int = 6, max_tokens: int = 20) -> LLMEngine:
    engine = fake_engine(block_size=4, step_time=0.01)
    for i in range(n_requests):
        add(engine, 3 + i, max_tokens, token=1)
    return engine


def event(i: int) -> RequestAborted:
    return RequestAborted(time=float(i), request_id=i, num_output_tokens=0)


def test_nothing_is_built_when_nobody_listens(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("an event was built with nobody listening")

    # The StepEvent is the StepResult's own content (plan and timings), so it exists anyway;
    # every request event, and every emit, must not.
    for name in ("arrived", "step_request_events", "RequestAborted", "StepTokens"):
        monkeypatch.setattr(request_events, name, fail)
    monkeypatch.setattr(EventBus, "emit", fail)
    monkeypatch.setattr(EventBus, "emit_many", fail)
    engine = busy_engine()
    assert not engine.bus.listening
    engine.abort_request(add(engine, 2, 2))
    engine.run_until_done()


def test_a_step_with_nothing_wanted_delivers_nothing(monkeypatch):
    engine = busy_engine()
    engine.bus.subscribe(lambda es: pytest.fail("a reset came"), kinds=["reset"])
    monkeypatch.setattr(EventBus, "emit_many", lambda self, events: pytest.fail("delivered"))
    assert engine.bus.listening
    engine.run_until_done()


def test_only_the_kinds_asked_for_are_built(monkeypatch):
    engine = busy_engine()
    bus = engine.bus
    steps = []
    bus.subscribe(steps.extend, kinds=["step"])
    monkeypatch.setattr(request_events, "StepTokens", lambda **kw: pytest.fail("tokens built"))
    engine.run_until_done()
    assert steps and all(e.kind == "step" for e in steps)
    with pytest.raises(ValueError, match="unknown event kind"):
        bus.subscribe(print, kinds=["stepp"])


def test_sync_subscribers_are_called_in_order_and_can_leave():
    bus = EventBus()
    calls = []
    first = bus.subscribe(lambda es: calls.extend(("first", e.request_id) for e in es))
    bus.subscribe(lambda es: calls.extend(("second", e.request_id) for e in es))
    bus.emit(event(1))
    bus.unsubscribe(first)
    bus.emit(event(2))
    assert calls == [("first", 1), ("second", 1), ("second", 2)]


def test_the_engine_owns_one_bus_and_uses_the_one_it_is_given():
    engine = busy_engine()
    assert isinstance(engine.bus, EventBus) and fake_engine().bus is not engine.bus
    bus = EventBus()
    seen = []
    bus.subscribe(seen.extend, kinds=["arrived"])
    given = LLMEngine(
        config=engine.config, runner=engine.runner.with_config(engine.config), bus=bus
    )
    assert given.bus is bus
    add(given, 3, 1)
    assert [e.request_id for e in seen] == [0]


def test_a_full_queue_drops_the_oldest_and_counts_it():
    sub = Subscription(maxsize=3)
    for i in range(10):
        sub.put(event(i))
    assert len(sub) == 3 and sub.dropped == 7 and sub.received == 10
    assert [e.request_id for e in sub.drain()] == [7, 8, 9]
    assert sub.drain() == [] and sub.get(timeout=0.01) is None


def test_a_consumer_that_never_reads_does_not_block_the_engine():
    engine = busy_engine(n_requests=8, max_tokens=40)
    bus = engine.bus
    counted = []
    bus.subscribe(counted.extend)
    stalled = bus.subscribe_async(maxsize=16)  # nobody ever reads it
    lengths = []
    bus.subscribe(lambda es: lengths.extend(len(stalled) for _ in es))
    runner = threading.Thread(target=engine.run_until_done, daemon=True)
    runner.start()
    runner.join(timeout=30)
    assert not runner.is_alive(), "the engine was held up by a consumer that never reads"
    assert max(lengths) <= 16
    assert stalled.received == len(counted) and stalled.dropped == len(counted) - 16


class EndsOnly(deque):
    """A deque that, while ``armed``, fails every operation that walks it (O(n))."""

    armed = False

    def _walk(self, name: str) -> None:
        if self.armed:
            raise AssertionError(f"put used deque.{name}, which is O(n)")

    def __iter__(self):
        self._walk("__iter__")
        return super().__iter__()

    def __getitem__(self, index):
        self._walk("__getitem__")
        return super().__getitem__(index)

    def __delitem__(self, index):
        self._walk("__delitem__")
        super().__delitem__(index)

    def __contains__(self, item):
        self._walk("__contains__")
        return super().__contains__(item)

    def remove(self, item):
        self._walk("remove")
        super().remove(item)

    def insert(self, index, item):
        self._walk("insert")
        super().insert(index, item)

    def rotate(self, n=1):
        self._walk("rotate")
        super().rotate(n)


def test_putting_into_a_full_queue_stays_cheap():
    # No stopwatch: a put into a full queue may touch only the queue's ends (O(1)), so it
    # costs the same whether 10 or 100 000 events are queued.
    sub = Subscription(maxsize=100_000)
    sub._queue = EndsOnly(maxlen=100_000)
    for i in range(100_000):
        sub.put(event(i))
    sub._queue.armed = True
    for i in range(100_000, 120_000):
        sub.put(event(i))
    sub._queue.armed = False
    assert len(sub) == 100_000 and sub.dropped == 20_000
    assert [e.request_id for e in sub.drain(max_items=1)] == [20_000]  # the oldest went


def test_a_consumer_thread_gets_every_event_in_order():
    engine = busy_engine()
    bus = engine.bus
    sub = bus.subscribe_async(maxsize=100_000)
    expected = []
    bus.subscribe(expected.extend)
    got = []

    def consume():
        while True:
            e = sub.get(timeout=5)
            if e is None:
                return
            got.append(e)

    consumer = threading.Thread(target=consume)
    consumer.start()
    engine.run_until_done()
    sub.close()  # wakes the consumer, which takes what is still queued, then stops
    consumer.join(timeout=5)
    assert got == expected and sub.dropped == 0


def test_drain_async_is_woken_from_the_engine_thread():
    engine = busy_engine()
    bus = engine.bus
    sub = bus.subscribe_async(maxsize=100_000)
    expected = []
    bus.subscribe(expected.extend)

    async def consume():
        got = []
        while True:
            batch = await sub.drain_async()
            if not batch:  # closed
                return got
            got += batch

    async def main():
        task = asyncio.create_task(consume())
        # One turn of the event loop runs the consumer up to its first await: it is now
        # waiting on an empty queue, to be woken from the engine thread.
        await asyncio.sleep(0)
        assert not task.done() and sub.received == 0
        await asyncio.to_thread(engine.run_until_done)
        await asyncio.to_thread(sub.close)  # what is still queued is drained before []
        return await asyncio.wait_for(task, timeout=5)

    assert asyncio.run(main()) == expected


def test_closing_a_subscription_removes_it_from_the_bus():
    bus = EventBus()
    sub = bus.subscribe_async(maxsize=4, kinds=["aborted"])
    assert bus.wants("aborted") and not bus.wants("step")
    sub.close()
    assert not bus.listening
    bus.emit(event(1))
    assert sub.received == 0
    with pytest.raises(ValueError, match="maxsize"):
        bus.subscribe_async(maxsize=0)


# ---- a step's events at once ------------------------------------------------------------
class Batched:
    """A listener that keeps each call's events: the bus hands it a step's in one call."""

    def __init__(self) -> None:
        self.calls: list[list] = []

    def __call__(self, events):
        self.calls.append(list(events))


def test_each_listener_gets_a_steps_events_in_one_call_in_order():
    engine = busy_engine()
    bus, order = engine.bus, []
    plain = bus.subscribe(lambda es: order.extend(("plain", e.kind) for e in es))
    batched = bus.subscribe(Batched())
    tokens = bus.subscribe(Batched(), kinds=["tokens"])
    queue = bus.subscribe_async(maxsize=100_000)
    bus.subscribe(lambda es: order.extend(("last", e.kind) for e in es))
    steps = 0
    while engine.has_unfinished():
        order.clear()
        engine.step()
        steps += 1
        mine = [kind for who, kind in order if who == "plain"]
        # the first listener had every event of the step before the last one had any
        assert order == [("plain", k) for k in mine] + [("last", k) for k in mine]
        assert [e.kind for e in batched.calls[-1]] == mine and mine[0] == "step"
    assert len(batched.calls) == steps  # one call a step
    with_tokens = [[e for e in call if e.kind == "tokens"] for call in batched.calls]
    assert tokens.calls == [call for call in with_tokens if call]  # none for a step without
    assert queue.drain() == [e for call in batched.calls for e in call]
    bus.unsubscribe(plain)


def test_put_many_keeps_and_drops_what_one_put_each_would():
    for maxsize, queued, batch in ((3, 0, 10), (5, 4, 3), (8, 2, 3), (4, 4, 4)):
        one, many = Subscription(maxsize), Subscription(maxsize)
        for sub in (one, many):
            for i in range(queued):
                sub.put(event(i))
        for i in range(queued, queued + batch):
            one.put(event(i))
        many.put_many([event(i) for i in range(queued, queued + batch)])
        assert (many.received, many.dropped) == (one.received, one.dropped)
        assert [e.request_id for e in many.drain()] == [e.request_id for e in one.drain()]


def test_every_waiting_getter_is_woken_by_a_batch():
    sub, got = Subscription(maxsize=16), []
    getters = [threading.Thread(target=lambda: got.append(sub.get(timeout=60))) for _ in range(3)]
    for thread in getters:
        thread.start()
    wait_for(lambda: sub._getters == 3)
    sub.put_many([event(i) for i in range(3)])
    wait_for(lambda: len(got) == 3)  # woken, not timed out: wait_for gives up long before
    assert sorted(e.request_id for e in got) == [0, 1, 2]
    for thread in getters:
        thread.join()
