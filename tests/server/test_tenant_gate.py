"""The TenantGate on its own (minicb/server/tenant_gate.py): a request waits for room, a
handler cancelled while waiting leaves the queue, one cancelled just as its turn came
gives its place back, and a place is given back once however many paths end a reply."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from minicb.fleet.tenancy.fair_queue import FairQueue
from minicb.server.api_error import APIError
from minicb.server.tenant_gate import TenantGate


class Connected:
    """A request whose client stays (its receive never says disconnect) or leaves."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def receive(self) -> dict:
        await self.gone.wait()
        return {"type": "http.disconnect"}


def gate(max_in_flight: int = 1) -> TenantGate:
    loop = SimpleNamespace(fleets={}, engines={})
    return TenantGate(loop, "api", FairQueue(), max_in_flight)  # type: ignore[arg-type]


def test_a_request_waits_for_room_and_a_place_is_given_back_once():
    async def run() -> None:
        g = gate()
        release_a = await g.enter(Connected(), "a", [1, 2], 4)  # type: ignore[arg-type]
        b = asyncio.ensure_future(g.enter(Connected(), "b", [3], 4))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        assert not b.done() and g.snapshot()["tenants"]["b"]["queued"] == 1
        release_a()
        release_a()  # a second path ending the same reply changes nothing
        release_b = await asyncio.wait_for(b, 1)
        assert g.in_flight == 1
        release_b()
        assert g.in_flight == 0 and len(g.queue) == 0

    asyncio.run(run())


def test_a_handler_cancelled_while_queued_leaves_the_queue():
    async def run() -> None:
        g = gate()
        release = await g.enter(Connected(), "a", [1], 4)  # type: ignore[arg-type]
        b = asyncio.ensure_future(g.enter(Connected(), "b", [2], 4))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        b.cancel()
        with pytest.raises(asyncio.CancelledError):
            await b
        assert len(g.queue) == 0 and not g._waiters
        release()
        assert g.in_flight == 0

    asyncio.run(run())


def test_a_client_gone_while_queued_is_a_499_and_leaves_nothing():
    async def run() -> None:
        g = gate()
        release = await g.enter(Connected(), "a", [1], 4)  # type: ignore[arg-type]
        leaving = Connected()
        b = asyncio.ensure_future(g.enter(leaving, "b", [2], 4))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        leaving.gone.set()
        with pytest.raises(APIError) as err:
            await b
        assert err.value.status == 499
        assert len(g.queue) == 0 and not g._waiters
        release()
        assert g.in_flight == 0

    asyncio.run(run())


def test_a_turn_that_comes_as_the_handler_is_cancelled_is_given_back():
    async def run() -> None:
        g = gate()
        release = await g.enter(Connected(), "a", [1], 4)  # type: ignore[arg-type]
        b = asyncio.ensure_future(g.enter(Connected(), "b", [2], 4))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        release()  # b's turn is set ...
        b.cancel()  # ... and its handler cancelled before it ran again
        with pytest.raises(asyncio.CancelledError):
            await b
        assert g.in_flight == 0 and len(g.queue) == 0

    asyncio.run(run())
