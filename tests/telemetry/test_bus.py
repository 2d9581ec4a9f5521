"""EventBus and Subscription: who hears what, nothing built for nobody, and consumers in
other threads that can fall behind without ever holding the engine up."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import minicb.telemetry.bus as event_bus
from minicb.config import EngineConfig
from minicb.telemetry.bus import EventBus, attach
from minicb.telemetry.events import RequestAborted
from minicb.telemetry.bus import Subscription
from tests.fake_engine import FakeEngine


def busy_engine(n_requests: int = 6, max_tokens: int = 20) -> FakeEngine:
    engine = FakeEngine(EngineConfig(block_size=4), [0.01] * 1000)
    for i in range(n_requests):
        engine.add_request([1] * (3 + i), max_tokens=max_tokens)
    return engine


def event(i: int) -> RequestAborted:
    return RequestAborted(time=float(i), request_id=i, num_output_tokens=0)


def test_nothing_is_built_when_nobody_listens(monkeypatch):
    def fail(*args):
        raise AssertionError("an event was built with nobody listening")

    monkeypatch.setattr(event_bus, "step_event", fail)
    for name in ("RequestArrived", "RequestToken", "RequestAdmitted", "RequestFinished"):
        monkeypatch.setattr(event_bus, name, fail)
    engine = busy_engine()
    bus = attach(engine)
    assert not bus.listening
    engine.run()


def test_only_the_kinds_asked_for_are_built(monkeypatch):
    engine = busy_engine()
    bus = attach(engine)
    steps = []
    bus.subscribe(steps.append, kinds=["step"])
    monkeypatch.setattr(event_bus, "RequestToken", lambda **kw: pytest.fail("token built"))
    engine.run()
    assert steps and all(e.kind == "step" for e in steps)
    with pytest.raises(ValueError, match="unknown event kind"):
        bus.subscribe(print, kinds=["stepp"])


def test_sync_subscribers_are_called_in_order_and_can_leave():
    bus = EventBus(block_size=4)
    calls = []
    first = bus.subscribe(lambda e: calls.append(("first", e.request_id)))
    bus.subscribe(lambda e: calls.append(("second", e.request_id)))
    bus.emit(event(1))
    bus.unsubscribe(first)
    bus.emit(event(2))
    assert calls == [("first", 1), ("second", 1), ("second", 2)]


def test_attach_reuses_the_bus_already_there():
    engine = busy_engine()
    assert attach(engine) is attach(engine)
    assert sum(isinstance(o, EventBus) for o in engine.observers) == 1


def test_a_full_queue_drops_the_oldest_and_counts_it():
    sub = Subscription(maxsize=3)
    for i in range(10):
        sub.put(event(i))
    assert len(sub) == 3 and sub.dropped == 7 and sub.received == 10
    assert [e.request_id for e in sub.drain()] == [7, 8, 9]
    assert sub.drain() == [] and sub.get(timeout=0.01) is None


def test_a_consumer_that_never_reads_does_not_block_the_engine():
    engine = busy_engine(n_requests=8, max_tokens=40)
    bus = attach(engine)
    counted = []
    bus.subscribe(counted.append)
    stalled = bus.subscribe_async(maxsize=16)  # nobody ever reads it
    lengths = []
    bus.subscribe(lambda e: lengths.append(len(stalled)))
    runner = threading.Thread(target=engine.run, daemon=True)
    runner.start()
    runner.join(timeout=30)
    assert not runner.is_alive(), "the engine was held up by a consumer that never reads"
    assert max(lengths) <= 16
    assert stalled.received == len(counted) and stalled.dropped == len(counted) - 16


def test_putting_into_a_full_queue_stays_cheap():
    # Not a benchmark: a bound 100x looser than what is measured, to catch an O(n) put.
    sub = Subscription(maxsize=100_000)
    for i in range(100_000):
        sub.put(event(i))
    start = time.perf_counter()
    for i in range(20_000):
        sub.put(event(i))
    per_put = (time.perf_counter() - start) / 20_000
    assert per_put < 1e-4 and len(sub) == 100_000


def test_a_consumer_thread_gets_every_event_in_order():
    engine = busy_engine()
    bus = attach(engine)
    sub = bus.subscribe_async(maxsize=100_000)
    expected = []
    bus.subscribe(expected.append)
    got = []

    def consume():
        while True:
            e = sub.get(timeout=5)
            if e is None:
                return
            got.append(e)

    consumer = threading.Thread(target=consume)
    consumer.start()
    engine.run()
    time.sleep(0.05)
    sub.close()  # wakes the consumer, which then stops
    consumer.join(timeout=5)
    assert got == expected and sub.dropped == 0


def test_drain_async_is_woken_from_the_engine_thread():
    engine = busy_engine()
    bus = attach(engine)
    sub = bus.subscribe_async(maxsize=100_000)
    expected = []
    bus.subscribe(expected.append)

    async def consume():
        got = []
        while True:
            batch = await sub.drain_async()
            if not batch:  # closed
                return got
            got += batch

    async def main():
        task = asyncio.create_task(consume())
        await asyncio.sleep(0.01)  # the consumer is now waiting on an empty queue
        await asyncio.to_thread(engine.run)
        await asyncio.sleep(0.01)
        await asyncio.to_thread(sub.close)
        return await asyncio.wait_for(task, timeout=5)

    assert asyncio.run(main()) == expected


def test_closing_a_subscription_removes_it_from_the_bus():
    bus = EventBus(block_size=4)
    sub = bus.subscribe_async(maxsize=4, kinds=["aborted"])
    assert bus.wants("aborted") and not bus.wants("step")
    sub.close()
    assert not bus.listening
    bus.emit(event(1))
    assert sub.received == 0
    with pytest.raises(ValueError, match="maxsize"):
        bus.subscribe_async(maxsize=0)
