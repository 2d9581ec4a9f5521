"""Property tests (hypothesis) of prefix caching, on the real engine over FakeRunner.

Random prompts drawn from a few shared prefixes, random arrivals, aborts, and pools small
enough to preempt (by recompute or swap) must never free a block a request still holds,
never leak one, keep every reference count equal to the number of tables holding the
block, and end with every block free or evictable. A shadow of the KV pool checks the
point of it all: every row attends only to slots that hold its own tokens, so a shared
or reused block never carries another prompt's KV. And the step events' KV changes,
replayed, give the engine's own map after every step (what the page and a replay draw).
"""

import pytest
from hypothesis import given, settings, target
from hypothesis import strategies as st

from minicb import SamplingParams
from minicb.core.runner.fake import FAKE_TOKEN
from minicb.core.scheduler import RequestRejected
from minicb.telemetry.kv_state import KVState
from tests.helpers import ShadowKV, fake_engine

request_st = st.tuples(
    st.integers(0, 2),  # which shared prefix
    st.integers(0, 30),  # how much of it
    st.integers(0, 8),  # a tail of its own
    st.integers(1, 12),  # max_tokens
    st.integers(0, 6),  # arrival step
    st.booleans(),  # aborted at some point
)

config_st = st.fixed_dictionaries(
    {
        "policy": st.sampled_from(["fcfs", "priority"]),
        "max_num_seqs": st.integers(1, 6),
        "max_num_batched_tokens": st.integers(1, 48),
        "block_size": st.sampled_from([1, 2, 4, 16]),
        "enable_chunked_prefill": st.booleans(),
        "preemption_mode": st.sampled_from(["recompute", "swap"]),
        "num_swap_blocks": st.integers(0, 40),
    }
)

PREFIXES = [[3 + (i * 7 + j * 5) % 200 for j in range(30)] for i in range(3)]


@pytest.mark.slow  # 150 random workloads over shared prefixes
@settings(max_examples=150, deadline=None)
@given(
    config=config_st,
    pool_tokens=st.integers(16, 120),
    requests=st.lists(request_st, min_size=1, max_size=12),
)
def test_shared_prefixes_keep_every_block_accounted(config, pool_tokens, requests):
    bs = config["block_size"]
    num_blocks = max(1, pool_tokens // bs)
    engine = fake_engine(
        num_kv_blocks=num_blocks, max_model_len=1024, enable_prefix_caching=True, **config
    )
    sched, shadow = engine.scheduler, ShadowKV(bs)
    pending = sorted(enumerate(requests), key=lambda x: x[1][4])
    prompts: dict[int, list[int]] = {}
    step = hits = 0
    state = KVState.from_snapshot(engine.kv_snapshot_event())
    while pending or engine.has_unfinished():
        while pending and pending[0][1][4] <= step:
            i, (family, keep, tail, max_tokens, _, abort) = pending.pop(0)
            prompt = PREFIXES[family][:keep] + [250 - i] * tail or [1]
            try:
                params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
                rid = engine.add_request(prompt, params, arrival_time=step + i / 100)
            except RequestRejected:
                continue
            prompts[rid] = prompt
            if abort and i % 2:
                engine.abort_request(rid)
        plan = engine.step().plan
        shadow.run(plan, lambda r: prompts[r.request_id] + [FAKE_TOKEN] * r.num_output_tokens)
        hits += plan.prefix_hit_tokens
        step += 1
        assert step < 5000, "the scheduler stopped making progress"
        assert plan.kv_used + plan.kv_free == num_blocks
        # The step event's changes, applied to the map before it, give the map after it:
        # a viewer that started from any snapshot draws exactly what the engine holds.
        state.apply(plan.kv_ops)
        kv = engine.kv_snapshot()
        assert state.as_tuple() == (kv.block_tables, kv.swap_tables, kv.cached_blocks)
        assert plan.kv_cached == len(state.cached) <= plan.kv_free
        sched.blocks.check()  # references == tables holding; no held block free; no leak
        if step % 5 == 0 and sched.running:
            engine.abort_request(sched.running[-1].request_id)
    kv = engine.kv_snapshot()
    assert kv.num_used == 0 and kv.num_swapped == 0  # every block free or evictable
    assert kv.num_free == num_blocks and len(kv.cached_blocks) <= num_blocks
    sched.blocks.check()
    target(float(hits), label="prefix hit tokens")  # steer the search towards sharing
