"""The engine thread: commands run there, streams deliver every token, pause and single
step hold and advance exactly one round, aborts free blocks, a failing step is contained, a
flood of commands waits its turn between rounds.
The engines are real, on a FakeRunner (no model): token i of every request is 10 + i."""

import asyncio
from collections import Counter

import pytest

from minicb import SamplingParams
from minicb.core.request import RequestOutput
from minicb.driver.command_queue import MAX_COMMANDS_PER_ROUND
from minicb.driver.engine_loop import EngineLoop
from tests.server.conftest import fake_engine

PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.fixture
def loop():
    engines = {"continuous": fake_engine(), "static": fake_engine("static")}
    engine_loop = EngineLoop(engines).start()
    yield engine_loop
    engine_loop.stop()


def used_blocks(loop, name="continuous") -> int:
    return loop.call(lambda: loop.engines[name].kv_snapshot().num_used).result(5)


async def collect(stream):
    return [item async for item in stream]


def test_stream_delivers_every_token_then_the_output(loop):
    async def main():
        streams = [await loop.submit("continuous", [5, 6, i], PARAMS) for i in range(3)]
        return await asyncio.gather(*(collect(s) for s in streams))

    for items in asyncio.run(main()):
        deltas, final = items[:-1], items[-1]
        assert isinstance(final, RequestOutput) and final.finish_reason == "length"
        assert [d.token_id for d in deltas] == final.token_ids == list(range(10, 16))
        assert [d.index for d in deltas] == list(range(6))


def test_pause_holds_and_single_step_runs_exactly_one_round(loop):
    loop.pause()
    future = loop.call(lambda: loop.engines["static"].add_request([5, 6], PARAMS))
    rid = future.result(timeout=5)
    before = loop.rounds
    assert loop.call(lambda: loop.engines["static"].step_count).result() == 0
    assert loop.step_once() == before + 1
    assert loop.call(lambda: loop.engines["static"].step_count).result() == 1
    assert loop.rounds == before + 1
    loop.resume()
    assert rid == 0


def test_bad_request_raises_in_the_caller_and_the_loop_goes_on(loop):
    async def main():
        with pytest.raises(ValueError, match="outside the vocabulary"):
            await loop.submit("continuous", [999], PARAMS)
        stream = await loop.submit("continuous", [5], PARAMS)
        return await collect(stream)

    assert asyncio.run(main())[-1].finish_reason == "length"


def test_abort_frees_blocks_ends_its_stream_and_closes_nothing_else(loop):
    async def main():
        long = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
        loop.pause()  # a fake step is instant: hold the victim mid-generation
        victim = await loop.submit("continuous", [5] * 20, long)
        for _ in range(3):
            await asyncio.to_thread(loop.step_once)
        assert used_blocks(loop) > 0
        other = await loop.submit("continuous", [6] * 3, PARAMS)
        assert await loop.abort(victim)
        loop.resume()
        return await collect(victim), await collect(other)

    victim, other = asyncio.run(main())
    assert victim[-1].finish_reason == "abort"
    assert other[-1].finish_reason == "length"
    assert used_blocks(loop) == 0


def test_a_failing_step_ends_its_requests_and_the_loop_keeps_serving(loop):
    engine = loop.engines["continuous"]
    real_execute = engine.runner.execute
    calls = {"n": 0}

    def flaky(plan):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated kernel failure")
        return real_execute(plan)

    engine.runner.execute = flaky

    async def main():
        broken = await collect(await loop.submit("continuous", [5, 6], PARAMS))
        fine = await collect(await loop.submit("continuous", [5, 6], PARAMS))
        return broken, fine

    broken, fine = asyncio.run(main())
    assert broken[-1].finish_reason == "error" and "simulated kernel failure" in broken[-1].text
    assert fine[-1].finish_reason == "length"
    assert used_blocks(loop) == 0


def test_single_steps_never_wait_for_a_round_that_already_ran(loop):
    """Regression: step_once once read the round counter after the engine thread had
    already run the asked-for round, then waited forever for another while paused."""
    import threading

    loop.pause()
    rounds = []
    worker = threading.Thread(target=lambda: rounds.extend(loop.step_once() for _ in range(50)))
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "a single step hung"
    assert rounds == list(range(rounds[0], rounds[0] + 50))
    loop.resume()


def test_a_flood_of_commands_waits_its_turn_between_rounds():
    """1,000 commands queued at once (a flood from many pages) run at most
    MAX_COMMANDS_PER_ROUND between two rounds: the engine steps through them."""
    engine = fake_engine()
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=40, ignore_eos=True))
    loop = EngineLoop({"continuous": engine})
    seen = [loop.call(lambda: loop.rounds) for _ in range(1000)]  # queued before it starts
    loop.start()
    try:
        rounds = [future.result(10) for future in seen]
    finally:
        loop.stop()
    per_round = Counter(rounds)
    assert max(per_round.values()) == MAX_COMMANDS_PER_ROUND
    assert sorted(per_round) == list(range(len(per_round)))  # a step between every batch
    assert len(per_round) == -(-1000 // MAX_COMMANDS_PER_ROUND)
