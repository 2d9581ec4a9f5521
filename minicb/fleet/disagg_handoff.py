"""The disaggregated fleet's hand-offs: each request's journey from a prefill engine to a
decode engine, driven by the engines' events.

A request is prefilled on a prefill engine, told ``max_tokens=1``. Its first token
("finished", by length) means the prefill engine now holds its KV: ``_hand_off`` gives the
request, prompt plus that token, to a decode engine (the fleet's ``Router``, least
loaded). The decode engine's ``kv_transfer`` "receiving" (its blocks are allocated, its
receives posted) makes ``_send`` tell the prefill engine to send; "done" records the
transfer's blocks, bytes and seconds; "waiting" the reason it once waited for room. An
abort on either side frees both (``release``); an engine that dies or fails a step ends
its requests with an error naming it (``_end``), and a hand-off's stream on the server
moves from the prefill engine to the decode engine with its first token.

The events are acted on in the caller's thread after the batch that carried them has
reached every listener (``_heard`` queues them; ``handle`` drains the queue: after each
round trip, each of the server's rounds, each ``step``), never during a round trip to an
engine (a round trip inside one would take its reply), nor while a request is being added
(``holding``: its first token may come back before it is on record). One thing cannot
wait: the prefill side's end of a request that goes on to a decode engine. ``_heard``,
the first listener on every engine's bus, holds its stream open at once
(``EngineLoop.streams.hold``), so the server's stream feed, a later listener on the same
bus, gives the stream its first token but never that end; the hand-off then moves the
stream to the decode engine, where the rest of its tokens and its true end come.

A journey the server opened (``streamed``) is forgotten once it has finished: its stream
has had its end by then (the decode engine's, an error's or an abort's), and nothing that
can still come needs it. ``generate`` forgets its own after reading their outputs; the
fleet holds only what is in flight.
"""

from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass, field, replace
from typing import Any

from minicb.core.config import SamplingParams
from minicb.fleet.disagg_engines import loads
from minicb.fleet.replica import Replica, ReplicaDied
from minicb.fleet.router import Router

KINDS = ("tokens", "finished", "aborted", "kv_transfer")  # the events a hand-off needs


@dataclass
class Journey:
    """One request across the two engines (``state``: prefill, handed_off, receiving,
    decoding, done, error, aborted)."""

    id: int
    prompt: list[int]
    params: SamplingParams
    prefill: Replica
    prefill_id: int
    decode: Replica | None = None
    decode_id: int | None = None
    tag: int = 0  # its transfer's tag: the decode engine's receives match the sends by it
    token_ids: list[int] = field(default_factory=list)
    state: str = "prefill"
    held: bool = False  # its KV waits on the prefill side (sent or released: False)
    finish_reason: str | None = None
    error: str | None = None
    waiting: str | None = None  # why it once waited for room on the decode side
    transfer: dict[str, Any] | None = None  # the "done" event's blocks, bytes, seconds
    send_s: float | None = None  # the prefill engine's sends of its KV, seconds
    streamed: bool = False  # the server opened it: forgotten once finished (module doc)

    @property
    def finished(self) -> bool:
        return self.state in ("done", "error", "aborted")


class Handoffs:
    """The journeys and what each engine's event calls for: DisaggregatedFleet's
    collaborator, which adds each request (``register``) and hands it the server's loop."""

    def __init__(
        self, prefill: list[Replica], decode: list[Replica], block_size: int, send_delay_s: float
    ) -> None:
        """``send_delay_s``: a test's hook, a pause after each layer sent (so a kill can
        land mid-transfer)."""
        self.prefill, self.decode = prefill, decode
        self.send_delay_s = send_delay_s
        self._events: list[tuple[Replica, Any]] = []
        self._handling = False
        self.holding = False  # a request is being added: act once it is on record
        self.loop: Any = None  # the server's EngineLoop, once the fleet has built it
        self.route_prefill = Router("least-loaded", len(prefill), block_size=block_size)
        self.route_decode = Router("least-loaded", len(decode), block_size=block_size)
        self.journeys: dict[int, Journey] = {}
        self._by_engine: dict[tuple[str, int], Journey] = {}
        self._tags = itertools.count(1)
        for engine in (
            prefill + decode
        ):  # before any other listener: a stream moves before it is fed
            engine.bus.subscribe(functools.partial(self._heard, engine), KINDS)
            engine.on_death = self._died
            engine.after_call = self.handle

    def register(self, journey: Journey) -> None:
        """A request just added on its prefill engine: on record, its events are acted on."""
        self.journeys[journey.id] = journey
        self._by_engine[(journey.prefill.name, journey.prefill_id)] = journey

    def _heard(self, engine: Replica, batch: list) -> None:
        """An engine's events, as they are published (in the thread that steps it), queued
        for ``handle``; a prefill side's end that is a hand-off holds its stream at once."""
        for event in batch:
            if event.kind == "finished" and self.loop is not None:
                journey = self._by_engine.get((engine.name, event.request_id))
                if journey is not None and self._goes_on(journey, engine, event.finish_reason):
                    self.loop.streams.hold(engine.name, event.request_id)
        self._events.extend((engine, event) for event in batch)

    def _goes_on(self, journey: Journey, engine: Replica, finish_reason: str | None) -> bool:
        """Whether this end on ``engine`` is the prefill side's hand-off: its first token,
        stopped by length (the prefill engine is told ``max_tokens=1``), with more to come."""
        return (
            engine is journey.prefill
            and journey.decode is None
            and journey.state != "aborted"
            and finish_reason == "length"
            and journey.params.max_tokens > 1
        )

    def handle(self) -> None:
        if self._handling or self.holding:
            return
        self._handling = True
        try:
            while self._events:
                self._act(*self._events.pop(0))
        finally:
            self._handling = False

    def _act(self, engine: Replica, event: Any) -> None:
        if event.kind == "tokens":
            for delta in event.deltas():
                journey = self._by_engine.get((engine.name, delta.request_id))
                if journey is not None and journey.state != "aborted":
                    journey.token_ids.append(delta.token_id)
            return
        journey = self._by_engine.get((engine.name, event.request_id))
        if journey is None:  # not ours, or forgotten
            return
        if event.kind == "aborted":  # by the server (a client hung up): free both
            if not journey.finished:
                journey.state = "aborted"
                self.release(journey)
        elif event.kind == "finished":
            self._finished(journey, engine, event.finish_reason)
        else:
            self._transfer(engine, event)
        self._settled(journey)

    def _finished(self, journey: Journey, engine: Replica, finish_reason: str | None) -> None:
        if engine is journey.decode:
            if journey.state != "aborted":
                journey.state, journey.finish_reason = "done", finish_reason
            return
        # Its first token: a prefill engine holds the KV of a request stopped by length.
        journey.held = finish_reason == "length"
        if self._goes_on(journey, engine, finish_reason):
            return self._hand_off(journey)
        if journey.state != "aborted":
            journey.state, journey.finish_reason = "done", finish_reason
        self.release(journey)

    def _hand_off(self, journey: Journey) -> None:
        live = [e for e in self.decode if e.dead is None]
        if not live:
            return self._end(journey, "every decode engine has died")
        route = self.route_decode.route(journey.id, journey.prompt, loads(self.decode))
        engine = self.decode[route.replica]
        ids = journey.prompt + journey.token_ids[:1]
        params = replace(journey.params, max_tokens=journey.params.max_tokens - 1)
        source = self.prefill.index(journey.prefill)
        journey.tag = next(self._tags)
        try:
            rid = engine.command("add_prefilled", ids, params, time.time(), source, journey.tag)
        except (ValueError, ReplicaDied) as err:
            return self._end(journey, f"{engine.name} refused it: {err}")
        journey.decode, journey.decode_id, journey.state = engine, rid, "handed_off"
        self._by_engine[(engine.name, rid)] = journey
        engine.in_flight.add(rid)  # the server's loop steps an engine that holds requests
        if self.loop is not None:  # its held stream goes on there (no event of rid yet)
            self.loop.streams.move(journey.prefill.name, journey.prefill_id, engine.name, rid)

    def _transfer(self, engine: Replica, event: Any) -> None:
        journey = self._by_engine.get((engine.name, event.request_id))
        if journey is None:
            return
        if event.status == "waiting":
            journey.waiting = event.reason
        elif event.status == "receiving":  # its blocks are allocated there: send now
            if journey.state != "aborted":
                journey.state = "receiving"
            self._send(journey, engine)
        elif event.status == "done":
            # seconds: from the receives' posting to the landing (the wait for the prefill
            # engine's turn included); send_seconds: the prefill engine's sends alone
            journey.transfer = {
                "blocks": event.blocks,
                "bytes": event.bytes,
                "seconds": event.seconds,
                "send_seconds": journey.send_s,
            }
            if journey.state == "receiving":
                journey.state = "decoding"
        elif event.status == "failed":
            self._end(journey, f"{engine.name}: {event.reason}")

    def _send(self, journey: Journey, decode: Replica) -> None:
        rank = len(self.prefill) + self.decode.index(decode)
        tokens = len(journey.prompt)
        try:
            sent = journey.prefill.command(
                "send_kv", journey.prefill_id, rank, journey.tag, tokens, self.send_delay_s
            )
            journey.send_s = sent["seconds"]
        except (ValueError, ReplicaDied) as err:
            journey.held = False  # the prefill engine freed them (or died with them)
            self._end(journey, str(err))
            if decode.dead is None and journey.decode_id is not None:
                try:
                    decode.abort_request(journey.decode_id)
                except RuntimeError:
                    pass
            return
        journey.held = False

    def release(self, journey: Journey) -> None:
        if journey.held and journey.prefill.dead is None:
            journey.prefill.command("release", journey.prefill_id)
        journey.held = False

    def _end(self, journey: Journey, why: str) -> None:
        if not journey.finished:
            journey.state, journey.error = "error", why
            if self.loop is not None:
                where = journey.decode or journey.prefill
                rid = journey.decode_id if journey.decode else journey.prefill_id
                self.loop.streams.end(where.name, rid, why)
        self.release(journey)
        self._settled(journey)

    def _settled(self, journey: Journey) -> None:
        """Forget a finished journey the server opened: its stream has ended."""
        if journey.streamed and journey.finished:
            self.forget(journey.id)

    def forget(self, number: int) -> None:
        """Drop a journey's record (a finished one's: its outputs were read or streamed)."""
        journey = self.journeys.pop(number, None)
        if journey is not None:
            self._by_engine.pop((journey.prefill.name, journey.prefill_id), None)
            if journey.decode is not None:
                self._by_engine.pop((journey.decode.name, journey.decode_id), None)

    def _died(self, engine: Replica) -> None:
        """Its requests end with its words; those whose KV it was to receive are freed on
        the prefill side."""
        side, router = (
            (self.decode, self.route_decode) if engine in self.decode
            else (self.prefill, self.route_prefill)
        )  # fmt: skip
        router.remove(side.index(engine))
        for journey in list(self.journeys.values()):
            if journey.finished:
                continue
            on_it = journey.decode is engine or (journey.prefill is engine and not journey.decode)
            if on_it:
                self._end(journey, engine.dead or f"{engine.name} died")

    def failed(self, engine: Replica, why: str) -> None:
        for journey in list(self.journeys.values()):
            here = journey.decode is engine or (journey.prefill is engine and not journey.decode)
            if here and not journey.finished:
                self._end(journey, why)

    def state(self) -> str:
        return ", ".join(f"{j.id}: {j.state}" for j in self.journeys.values() if not j.finished)
