"""Disaggregated prefill and decode, REAL (minicb.fleet.DisaggregatedFleet, issue 34), on the
tiny random model: one prefill and one decode engine process, the KV cache sent over gloo.

One fleet for the module (starting two engine processes is the costly part): the prefill
engine chunks prompts (16-token budget) and caches prefixes; the decode engine's pool is
small (8 blocks of 16), so requests wait on the prefill side for room (backpressure) and
running ones are preempted there. Greedy tokens equal one engine's, one request at a time
(the session's reference fixtures); every block is free at the end on both sides; aborts
free both sides; fleets of 1:2 and (slow) 2:1 engines, each its own, give the same tokens,
every engine on the wider side taking requests; and, last (it kills the decode engine), a decode
process killed mid-transfer makes the prefill side report an error naming it, within a
bounded time, and free the request's blocks. The default model's parity is in
test_disaggregate_real_default.py (slow).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from minicb.core.config import SamplingParams
from minicb.fleet import DisaggregatedFleet
from tests.helpers import MIXED, MIXED_MAX, SHARED, SHARED_MAX

# Real prefill and decode engines in their own processes: 2-10 s a test on an idle machine.
pytestmark = pytest.mark.slow

OPTIONS = dict(
    dtype="float32",
    device="cpu",
    block_size=16,
    num_kv_blocks=64,
    max_num_seqs=8,
    max_num_batched_tokens=16,  # prompts up to 40 tokens: chunked prefill
    enable_prefix_caching=True,
)
DECODE = dict(num_kv_blocks=8)  # room for one or two requests: waits and preemptions
KILL_BOUND_S = 30.0  # the prefill side reports a dead decode engine within this


def greedy(max_tokens: list[int]) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in max_tokens]


@pytest.fixture(scope="module")
def fleet(tiny_llama_dir):
    with DisaggregatedFleet(
        tiny_llama_dir, decode_options=DECODE, transfer_timeout_s=10.0, **OPTIONS
    ) as fleet:
        yield fleet


def listen(fleet: DisaggregatedFleet, kinds: list[str]) -> list:
    seen: list = []
    fleet.bus.subscribe(seen.extend, kinds=kinds)
    return seen


def test_greedy_tokens_equal_one_engines_with_chunks_waits_and_decode_preemption(
    fleet, mixed_reference
):
    prefill_steps: list = []
    fleet.engines["prefill0"].bus.subscribe(prefill_steps.extend, kinds=["step"])
    preempted = []
    fleet.engines["decode0"].bus.subscribe(preempted.extend, kinds=["preempted"])
    transfers = listen(fleet, ["kv_transfer"])

    outs = fleet.generate(MIXED, greedy(MIXED_MAX), timeout_s=240)

    assert [o.token_ids for o in outs] == mixed_reference
    assert all(o.error is None and o.finish_reason == "length" for o in outs)
    assert {(o.prefill, o.decode) for o in outs} == {("prefill0", "decode0")}
    # every request with more than one token moved its prompt's KV: one block per 16 tokens
    for out, prompt in zip(outs, MIXED, strict=True):
        assert out.transfer["blocks"] == -(-len(prompt) // 16)
        assert out.transfer["bytes"] > 0
    done = [t for t in transfers if t.status == "done"]
    assert len(done) == len(MIXED)
    assert all(t.from_engine == "prefill0" and t.to_engine == "decode0" for t in done)
    # what the small decode pool and the prefill budget made happen
    assert preempted, "the decode engine's small pool should have preempted someone"
    waits = [o.waited for o in outs if o.waited]
    assert waits and all("waits on the prefill side" in w for w in waits)
    assert max(s.plan.budget_used for s in prefill_steps) <= 16  # chunks
    assert any(
        r.num_tokens < r.context_len
        for s in prefill_steps
        for r in s.plan.scheduled
        if r.start_position > 0
    )
    assert fleet.kv_used() == {"prefill0": 0, "decode0": 0}


def test_greedy_tokens_with_prefix_caching_on_the_prefill_side(fleet, shared_reference):
    steps: list = []
    fleet.engines["prefill0"].bus.subscribe(steps.extend, kinds=["step"])
    outs = fleet.generate(SHARED, greedy(SHARED_MAX), timeout_s=240)
    assert [o.token_ids for o in outs] == shared_reference
    cached = sum(d.num_cached_tokens for s in steps for d in s.plan.admitted)
    assert cached > 0, "prompts sharing a prefix should have found it cached"
    assert fleet.kv_used() == {"prefill0": 0, "decode0": 0}


def test_aborts_free_both_sides(fleet):
    params = greedy([30] * 6)
    numbers = [fleet.submit(p, sp) for p, sp in zip(MIXED[:6], params, strict=True)]
    # step until some request decodes and others still wait (held on the prefill side)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        fleet.step()
        states = {fleet.journeys[n].state for n in numbers}
        if "decoding" in states and states & {"handed_off", "prefill"}:
            break
    assert "decoding" in states, states
    assert sum(fleet.kv_used().values()) > 0
    # On a slow machine the first request may have finished its 30 tokens while others
    # still wait: aborting a finished request is refused, every other one is taken.
    unfinished = [n for n in numbers if not fleet.journeys[n].finished]
    assert len(unfinished) >= 2, states  # one decoding, one still waiting at least
    for n in numbers:
        assert fleet.abort_request(n) is (n in unfinished), fleet.journeys[n].state
    for _ in range(20):  # frees reach the pools' maps as the engines take the commands
        fleet.step()
    assert {fleet.journeys[n].state for n in unfinished} == {"aborted"}
    assert fleet.kv_used() == {"prefill0": 0, "decode0": 0}
    # and the fleet still serves
    again = fleet.generate(MIXED[:1], greedy([3]), timeout_s=60)
    assert again[0].error is None and len(again[0].token_ids) == 3


# Each fleet's start costs about 20 s on the shared two-core machine: 1:2 in the default
# run (a decode engine past the first: its rank, its routing, a stream moved to it), 2:1
# with the slow tests (a prefill engine past the first as the sender).
@pytest.mark.parametrize(
    "prefill, decode",
    [pytest.param(2, 1, id="2:1", marks=pytest.mark.slow), pytest.param(1, 2, id="1:2")],
)
def test_greedy_tokens_equal_one_engines_with_two_engines_on_a_side(
    tiny_llama_dir, mixed_reference, prefill, decode
):
    """P:D other than 1:1, a fleet of its own (the module's stays 1:1), on the first
    prompts (starting the processes is the cost): every engine on the wider side takes
    requests (the router spreads them), a prefill engine's rank past the first, or a decode
    engine's, meets its peer in the right transfers, and no engine keeps a block at the end."""
    count = 6
    with DisaggregatedFleet(
        tiny_llama_dir, prefill, decode, transfer_timeout_s=10.0, **OPTIONS
    ) as wide:
        transfers = listen(wide, ["kv_transfer"])
        outs = wide.generate(MIXED[:count], greedy(MIXED_MAX[:count]), timeout_s=240)
        assert [o.token_ids for o in outs] == mixed_reference[:count]
        assert all(o.error is None and o.finish_reason == "length" for o in outs)
        names = {f"prefill{i}" for i in range(prefill)}, {f"decode{i}" for i in range(decode)}
        assert {o.prefill for o in outs} == names[0], "every prefill engine should take some"
        assert {o.decode for o in outs} == names[1], "every decode engine should take some"
        done = [t for t in transfers if t.status == "done"]
        assert sorted((t.from_engine, t.to_engine) for t in done) == sorted(
            (o.prefill, o.decode) for o in outs
        )
        assert wide.kv_used() == dict.fromkeys(wide.engines, 0)


def test_decode_killed_mid_transfer_is_reported_and_frees_the_prefill_side(fleet):
    """Last in the file: it kills the decode engine. The prefill engine pauses 2 s after
    each layer sent (the fleet's test hook); the kill lands 1 s after the fleet began the
    send (the request's state turned "receiving"), between the first layer and the second."""
    decode = fleet.engines["decode0"]
    fleet.handoffs.send_delay_s = 2.0
    sent: list[float] = []

    def kill_mid_transfer() -> None:
        deadline = time.monotonic() + KILL_BOUND_S
        while time.monotonic() < deadline:
            if any(j.state == "receiving" for j in list(fleet.journeys.values())):
                sent.append(time.monotonic())
                time.sleep(1.0)
                os.kill(decode.process.pid, signal.SIGKILL)
                return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_mid_transfer, daemon=True)
    killer.start()
    start = time.monotonic()
    outs = fleet.generate(MIXED[:1], greedy([8]), timeout_s=KILL_BOUND_S)
    elapsed = time.monotonic() - start
    killer.join(5)
    assert sent, "the transfer never started"
    assert elapsed < KILL_BOUND_S
    assert outs[0].finish_reason == "error"
    assert "decode0 (rank 1)" in outs[0].error, outs[0].error
    assert "failed after" in outs[0].error  # mid-transfer: some bytes had gone
    assert fleet.kv_used() == {"prefill0": 0}  # the decode engine is gone; nothing held here
