"""Real replicas (minicb.fleet.Fleet) on the default model, fp32: greedy tokens through two
replicas, under every router, equal one engine's; an abort frees KV in the pool of the
replica that holds the request; a replica killed mid-run ends its requests with an error
within a bounded time while the other finishes its own.

Two replica processes are started once for the whole module (each loads the model: the
costly part on two cores) and the tests run in file order: the kill is the last one.
Slow: the module's set-up (the reference engine and two replica processes loading the
model) took 90 s on the shared two-core machine; tests/fleet/test_replicas_serve.py runs the
same checks through the server on the tiny model in the fast tier.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from minicb import LLM, SamplingParams
from minicb.core.request import RequestOutput, TokenDelta
from minicb.fleet import Fleet
from minicb.fleet.fleet import FLEET
from minicb.fleet.router import POLICIES

PROMPTS = ["The capital of France is", "Hello, my name is", "1, 2, 3, 4,", "Once upon a time"]
MAX_TOKENS = 8
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
OPTIONS = dict(dtype="float32", num_kv_blocks=64, max_num_seqs=4)
DEATH_BOUND_S = 10.0  # a killed replica's requests end within this

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    llm = LLM(**OPTIONS)
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.fixture(scope="module")
def fleet():
    # not restarted: the kill test checks that the survivor takes every request
    with Fleet(replicas=2, threads=1, restart_replicas=False, **OPTIONS) as fleet:
        yield fleet


def routed_events(fleet: Fleet) -> list:
    seen: list = []
    fleet.bus.subscribe(seen.extend, kinds=["routed"])
    return seen


@pytest.mark.parametrize("policy", POLICIES)
def test_greedy_tokens_through_two_replicas_equal_one_engines(fleet, reference, policy):
    fleet.set_policy(policy)
    seen = routed_events(fleet)
    outs = fleet.generate(PROMPTS, GREEDY)
    fleet.bus.unsubscribe(seen.extend)
    assert [o.token_ids for o in outs] == reference
    assert [o.finish_reason for o in outs] == ["length"] * len(PROMPTS)
    assert [e.policy for e in seen] == [policy] * len(PROMPTS)
    assert all(e.reason.startswith(f"replica {e.replica}: ") for e in seen)
    if policy == "round-robin":
        assert [e.replica for e in seen] == [0, 1, 0, 1]


def test_an_abort_frees_kv_on_the_replica_that_holds_the_request(fleet):
    loop = fleet.engine_loop()
    free_before = {n: loop.call(r.kv_snapshot).result().num_free for n, r in fleet.replicas.items()}

    async def run() -> tuple:
        stream = await loop.submit(FLEET, "Tell me a long story.", SamplingParams(max_tokens=200))
        async for item in stream:  # until its first token: it holds blocks now
            assert isinstance(item, TokenDelta)
            break
        holder = fleet.replicas[stream.engine]
        held = await loop.acall(holder.kv_snapshot)
        aborted = await loop.abort(stream)
        async for item in stream:
            last = item
        after = {n: await loop.acall(r.kv_snapshot) for n, r in fleet.replicas.items()}
        return stream, held, aborted, last, after

    stream, held, aborted, last, after = asyncio.run(run())
    assert stream.request_id in held.block_tables
    assert aborted
    assert isinstance(last, RequestOutput) and last.finish_reason == "abort"
    assert stream.request_id not in after[stream.engine].block_tables
    for name, kv in after.items():  # every block back in its pool, on both replicas
        assert kv.num_free == free_before[name], name


def test_a_killed_replica_ends_its_requests_with_an_error_and_the_other_goes_on(fleet, reference):
    fleet.set_policy("round-robin")  # prompts 0, 2 to replica 0; 1, 3 to replica 1
    loop = fleet.engine_loop()
    victim = fleet.replicas["replica1"]
    long = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)

    async def run() -> tuple[list[RequestOutput], float]:
        streams = [
            await loop.submit(FLEET, p, GREEDY if i % 2 == 0 else long)
            for i, p in enumerate(PROMPTS)
        ]
        assert [s.engine for s in streams] == ["replica0", "replica1"] * 2
        async for _token in streams[1]:  # the victim is mid-run: it has sent a token
            break
        os.kill(victim.process.pid, signal.SIGKILL)
        killed = time.monotonic()
        outs, ends = [], []
        for stream in streams:
            async for item in stream:
                if isinstance(item, RequestOutput):
                    outs.append(item)
                    if stream.engine == "replica1":
                        ends.append(time.monotonic() - killed)
        return outs, max(ends)

    outs, ended_after = asyncio.run(asyncio.wait_for(run(), 120))
    assert ended_after < DEATH_BOUND_S
    for out in (outs[1], outs[3]):
        assert out.finish_reason == "error"
        assert "replica1" in out.text and "killed by signal 9" in out.text
    assert [outs[0].token_ids, outs[2].token_ids] == [reference[0], reference[2]]
    assert 1 in fleet.router.removed
    # the fleet goes on: every new request goes to the survivor, with the same tokens
    seen = routed_events(fleet)
    again = fleet.generate(PROMPTS[:2], GREEDY)
    assert [o.token_ids for o in again] == reference[:2]
    assert [e.replica for e in seen] == [0, 0]
