"""The disaggregated fleet's hand-offs under the server, fast: ``DisaggregatedFleet`` and the
server's ``EngineLoop`` as they are, over scripted engines in this process instead of
engine processes (issue 54: the review's H1 and M3).

A scripted engine publishes what its requests did at each turn (``step``) and, as a real
replica does, during every round trip before its reply: a prefill engine gives each
request one token and ends it by length; a decode engine says "receiving", then, once the
prefill engine has sent that request's KV, "done", the rest of the tokens and the end.
Events that arrive during a round trip to another engine are what cut concurrent requests
to one token before the fix (the prefill side's end reached the stream before it moved).

1,000 requests go through, up to 16 at once: each stream gets exactly its ``max_tokens``
tokens, the ones its engines gave, and the journeys the fleet holds once it has acted on
the events so far never exceed the requests in flight (it held every one before), and
none are left once it has acted on the last ends.
"""

from __future__ import annotations

import asyncio
import itertools
import time

from minicb.core.bus import EventBus
from minicb.core.config import SamplingParams
from minicb.core.request import RequestOutput
from minicb.core.request_events import KVTransfer, RequestAborted, RequestFinished, StepTokens
from minicb.fleet import disagg_fleet
from minicb.fleet.disagg_fleet import DisaggregatedFleet
from minicb.fleet.fleet import FLEET
from tests.helpers import wait_for

REQUESTS = 1000
AT_ONCE = 16


def token(prompt: list[int], index: int) -> int:
    """The scripted engines' token ``index`` of a request: a function of its prompt."""
    return (sum(prompt) * 7 + index * 13) % 1000


class Scripted:
    """An engine process's stand-in, shaped as the fleet uses a Replica."""

    def __init__(self, name: str, sent: set[int]) -> None:
        self.name, self.sent = name, sent  # sent: tags whose KV a prefill engine has sent
        self.bus = EventBus()
        self.dead: str | None = None
        self.calling = False
        self.in_flight: set[int] = set()
        self.load = {"waiting": 0, "running": 0, "swapped": 0}
        self.on_death = self.after_call = None
        self.tokenizer = None
        self.clock = time.time
        self._ids = itertools.count()
        self.todo: dict[int, tuple] = {}  # request id -> what it still has to say

    def tokenize(self, prompt: list[int]) -> list[int]:
        return list(prompt)

    def has_unfinished(self) -> bool:
        return bool(self.in_flight)

    def step(self) -> None:
        self._publish()

    def _round_trip(self, answer):  # noqa: ANN001, ANN202
        """What came before the reply is published first, then the reply: as Replica._call."""
        self.calling = True
        try:
            self._publish()
            return answer()
        finally:
            self.calling = False
            if self.after_call is not None:
                self.after_call()

    def _new(self, what: tuple) -> int:
        rid = next(self._ids)
        self.todo[rid] = what
        self.in_flight.add(rid)
        return rid

    def _end(self, rid: int, tokens: StepTokens, n: int) -> list:
        del self.todo[rid]
        self.in_flight.discard(rid)
        finished = RequestFinished(time=0.0, request_id=rid, step=0, finish_reason="length",
                                   reason="finished (length)", num_prompt_tokens=1,
                                   num_output_tokens=n, num_preemptions=0)  # fmt: skip
        return [tokens, finished]

    def abort_request(self, rid: int) -> bool:
        def abort() -> bool:
            if self.todo.pop(rid, None) is None:
                return False
            self.in_flight.discard(rid)
            self.bus.emit(RequestAborted(time=0.0, request_id=rid, num_output_tokens=0))
            return True

        return self._round_trip(abort)

    def ask_to_stop(self) -> None:
        pass

    def close(self) -> None:
        pass


class ScriptedPrefill(Scripted):
    def __init__(self, name: str, sent: set[int]) -> None:
        super().__init__(name, sent)
        self.held: set[int] = set()  # requests whose KV it holds after their first token

    def add_request(self, prompt, params, priority=0, arrival_time=None, prompt_token_ids=None):  # noqa: ANN001, ANN201
        return self._round_trip(lambda: self._new((list(prompt_token_ids),)))

    def command(self, *msg):  # noqa: ANN002, ANN201
        self.held.discard(msg[1])  # "send_kv" or "release": its KV leaves this pool
        if msg[0] == "send_kv":
            tag = msg[3]
            return self._round_trip(lambda: self.sent.add(tag) or {"seconds": 0.0})
        return self._round_trip(lambda: 0)  # "release"

    def _publish(self) -> None:
        for rid, (prompt,) in list(self.todo.items()):
            tokens = StepTokens(time=0.0, step=0, request_ids=[rid],
                                token_ids=[token(prompt, 0)], indexes=[0], texts=[""])  # fmt: skip
            self.held.add(rid)
            self.bus.emit_many(self._end(rid, tokens, 1))


class ScriptedDecode(Scripted):
    def command(self, kind, ids, params, arrival, source, tag):  # noqa: ANN001, ANN201
        assert kind == "add_prefilled"
        return self._round_trip(lambda: self._new((ids[:-1], params.max_tokens, tag, "new")))

    def _transfer(self, rid: int, status: str) -> KVTransfer:
        return KVTransfer(time=0.0, request_id=rid, from_engine="prefill0", to_engine=self.name,
                          blocks=1, bytes=0, seconds=0.0, status=status, reason="")  # fmt: skip

    def _publish(self) -> None:
        for rid, (prompt, n, tag, state) in list(self.todo.items()):
            if state == "new":
                self.todo[rid] = (prompt, n, tag, "receiving")
                self.bus.emit(self._transfer(rid, "receiving"))
            elif tag in self.sent:
                indexes = list(range(1, n + 1))
                tokens = StepTokens(time=0.0, step=0, request_ids=[rid] * n,
                                    token_ids=[token(prompt, i) for i in indexes],
                                    indexes=indexes, texts=[""] * n)  # fmt: skip
                self.bus.emit_many([self._transfer(rid, "done"), *self._end(rid, tokens, n)])


def scripted_fleet(monkeypatch, tmp_path, prefill: int, decode: int) -> DisaggregatedFleet:
    sent: set[int] = set()
    engines = [ScriptedPrefill(f"prefill{i}", sent) for i in range(prefill)]
    engines += [ScriptedDecode(f"decode{i}", sent) for i in range(decode)]
    monkeypatch.setattr(disagg_fleet, "start_engines", lambda *a, **kw: (engines, str(tmp_path)))
    return DisaggregatedFleet(None, prefill, decode)


async def serve_all(fleet: DisaggregatedFleet) -> list[list[int]]:
    """Every request through the server's loop, AT_ONCE at a time."""
    loop = fleet.engine_loop()
    at_once = asyncio.Semaphore(AT_ONCE)

    async def one(i: int) -> list[int]:
        prompt = [i % 97, i % 89 + 1, 3]
        params = SamplingParams(max_tokens=1 + i % 6, temperature=0.0, ignore_eos=True)
        async with at_once:
            stream = await loop.submit(FLEET, prompt, params, token_ids=prompt)
            async for item in stream:
                if isinstance(item, RequestOutput):
                    assert item.finish_reason == "length", item
                    return list(item.token_ids)
        raise AssertionError("the stream ended without its output")

    return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(REQUESTS))), 60)


def test_every_stream_gets_its_tokens_and_finished_journeys_are_forgotten(monkeypatch, tmp_path):
    fleet = scripted_fleet(monkeypatch, tmp_path, prefill=2, decode=1)
    loop = fleet.engine_loop()
    held: list[int] = []  # journeys held once the fleet has acted, before each round
    acts = loop.feeder
    loop.feeder = lambda engines: (acts(engines), held.append(len(fleet.journeys)))
    loop.start()
    try:
        got = asyncio.run(serve_all(fleet))
        # A stream's output can reach its client before the fleet acts on the same end (it
        # is queued for the loop's next round): the last journeys go then, not before.
        wait_for(lambda: fleet.journeys == {} and fleet.handoffs._by_engine == {}, 10)
    finally:
        fleet.close()
    prompts = [[i % 97, i % 89 + 1, 3] for i in range(REQUESTS)]
    want = [[token(p, k) for k in range(1 + i % 6)] for i, p in enumerate(prompts)]
    assert got == want
    assert len(held) > 100 and max(held) <= AT_ONCE  # what is in flight, never the 1,000


def test_generate_forgets_the_journeys_it_read(monkeypatch, tmp_path):
    fleet = scripted_fleet(monkeypatch, tmp_path, prefill=1, decode=1)
    prompts = [[5, 6, 7], [8, 9]]
    params = [SamplingParams(max_tokens=4), SamplingParams(max_tokens=1)]
    outs = fleet.generate(prompts, params, timeout_s=10)
    want = [
        [token(p, k) for k in range(m.max_tokens)] for p, m in zip(prompts, params, strict=True)
    ]
    assert [o.token_ids for o in outs] == want
    assert fleet.journeys == {} and fleet.handoffs._by_engine == {}


def test_a_client_that_hangs_up_between_the_two_engines_ends_its_request_on_the_decode_side(
    monkeypatch, tmp_path
):
    """The prefill side has ended its part (the stream is held, moving) and the hand-off
    has not run yet when the abort comes: no engine holds the request. The abort waits on
    the stream and is applied on the decode engine once the request lands there; before,
    it went to the prefill engine, which no longer held it, and the decode engine finished
    the request for nobody."""
    fleet = scripted_fleet(monkeypatch, tmp_path, prefill=1, decode=1)
    prefill, decode = fleet.prefill[0], fleet.decode[0]
    loop = fleet.engine_loop().start()
    loop.pause()  # one round at a time: the abort lands between the two engines

    async def run() -> tuple[list, bool, bool]:
        params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
        stream = await loop.submit(FLEET, [1, 2, 3], params, token_ids=[1, 2, 3])
        await asyncio.to_thread(loop.step_once)  # the prefill engine's first token and end
        moving = stream.moving and stream.engine == prefill.name
        aborted = await loop.abort(stream)  # before the next round's hand-off
        await asyncio.to_thread(loop.step_once)  # the hand-off, then the decode engine
        await asyncio.to_thread(loop.step_once)
        items = [item async for item in stream]
        return items, moving, aborted

    try:
        items, moving, aborted = asyncio.run(asyncio.wait_for(run(), 10))
    finally:
        fleet.close()
    assert moving
    assert items[-1].finish_reason == "abort" and aborted
    assert [i.token_id for i in items[:-1]] == [token([1, 2, 3], 0)]  # the first token only
    assert decode.todo == {} and decode.in_flight == set()  # nothing decoded for nobody
    assert prefill.held == set()  # its held KV freed
    assert fleet.journeys == {} and fleet.handoffs._by_engine == {}
