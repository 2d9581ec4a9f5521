"""Disaggregated prefill and decode, REAL, on the DEFAULT model (SmolLM2-135M, fp32, gloo):
greedy tokens through one prefill and one decode engine process equal one LLMEngine's (the
session's ``default_llm``); then, on the same two engines, with chunked prefill (16-token
budget) and prefix caching on the prefill side and a decode pool small enough to wait and
to preempt. Every block is free on both sides after each run.

Slow: two processes load the default model (51 s for the file on a quiet two-core
machine, several minutes under the shared load); tests/fleet/test_disaggregate_real.py
runs the same checks on the tiny model.
"""

from __future__ import annotations

import pytest

from minicb.core.config import SamplingParams
from minicb.fleet import DisaggregatedFleet

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "Hello, my name is", "1, 2, 3, 4,", "Once upon a time"]
SYSTEM = (
    "You are a helpful assistant who answers questions about geography, history and "
    "science in short, clear sentences. "
)
SHARED = [SYSTEM + q for q in ("Where is Paris?", "What is a volcano?", "Who was Newton?")]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
OPTIONS = dict(
    dtype="float32",
    device="cpu",
    block_size=16,
    num_kv_blocks=64,
    max_num_batched_tokens=16,  # the shared prompts (~40 tokens) are prefilled in chunks
    enable_prefix_caching=True,
)
DECODE = dict(num_kv_blocks=6)  # two of the shared prompts' requests at most: waits, preemption


@pytest.fixture(scope="module")
def fleet():
    with DisaggregatedFleet(decode_options=DECODE, transfer_timeout_s=60.0, **OPTIONS) as fleet:
        yield fleet


def test_greedy_tokens_through_1_to_1_equal_one_engines(fleet, default_llm):
    reference = [o.token_ids for o in default_llm.generate(PROMPTS, GREEDY)]
    outs = fleet.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == reference
    assert all(o.transfer and o.transfer["bytes"] > 0 for o in outs)
    assert fleet.kv_used() == {"prefill0": 0, "decode0": 0}


def test_greedy_tokens_with_chunks_prefix_cache_and_decode_preemption(fleet, default_llm):
    reference = [o.token_ids for o in default_llm.generate(SHARED * 2, GREEDY)]
    steps: list = []
    preempted: list = []
    fleet.engines["prefill0"].bus.subscribe(steps.extend, kinds=["step"])
    fleet.engines["decode0"].bus.subscribe(preempted.extend, kinds=["preempted"])
    outs = fleet.generate(SHARED * 2, GREEDY)
    assert [o.token_ids for o in outs] == reference
    assert max(s.plan.budget_used for s in steps) <= 16  # chunked
    assert sum(d.num_cached_tokens for s in steps for d in s.plan.admitted) > 0
    assert preempted, "the small decode pool should have preempted a running request"
    assert any(o.waited for o in outs), "and made a request wait on the prefill side"
    assert fleet.kv_used() == {"prefill0": 0, "decode0": 0}
