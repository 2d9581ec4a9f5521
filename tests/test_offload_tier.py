"""The prefix cache's host tier on a real model (``kv_offload_blocks``).

The oracle: the same greedy tokens with and without the tier (fp32), on a multi-turn case
whose prefixes do not fit the device pool, so that turns find their history in host memory
and get it back by a copy; and a turn whose history came back computes only its new tokens.
The scheduler's side (keys, pins, undo, no leaks) is tests/scheduler/test_host_tier.py.
A tier larger than the host's available memory is refused when the runner is built, with
the limit in bytes and blocks.
"""

from __future__ import annotations

import os

import pytest

from minicb import SamplingParams
from minicb.core.config import EngineConfig
from minicb.core.engine import LLMEngine


def _conversations(n: int, length: int, vocab: int) -> list[list[int]]:
    return [[3 + (i * 37 + j * 11) % (vocab - 3) for j in range(length)] for i in range(n)]


def chat(runner, offload: int, turns: int, convs: list[list[int]], max_tokens: int, **options):
    """Every conversation's turns in rotation, one request at a time, on an engine over
    ``runner``'s weights: (each turn's tokens, prompt tokens computed, found on the host)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    config = EngineConfig.from_kwargs(kv_offload_blocks=offload, **options)
    engine = LLMEngine(config=config, runner=runner.with_config(config))
    steps: list = []
    engine.bus.subscribe(steps.extend, kinds=["step"])
    outs, convs = [], [list(c) for c in convs]
    for turn in range(turns):
        for c, prompt in enumerate(convs):
            rid = engine.add_request(prompt, params)
            out = engine.run_until_done()[0]
            assert out.request_id == rid
            outs.append(out.token_ids)
            convs[c] = prompt + out.token_ids + [100 + turn, 200 + c]  # the next user turn
    rows = [r for e in steps for r in e.plan.scheduled]
    computed = sum(r.num_tokens for r in rows if r.phase == "prefill")
    host = sum(e.plan.prefix_host_hit_tokens for e in steps)
    engine.scheduler.blocks.check()
    return outs, computed, host


def test_the_host_tier_keeps_greedy_tokens_and_saves_prefill(tiny_llama_dir):
    from minicb.core.runner.model_runner import ModelRunner

    config = EngineConfig(num_kv_blocks=8, block_size=4, dtype="float32")
    runner = ModelRunner(tiny_llama_dir, config)
    convs = _conversations(3, 14, runner.vocab_size)
    options = dict(num_kv_blocks=8, block_size=4, dtype="float32")
    plain, plain_computed, none = chat(runner, 0, 3, convs, 4, **options)
    tiered, tiered_computed, host = chat(runner, 32, 3, convs, 4, **options)
    assert tiered == plain
    assert none == 0 and host > 0
    assert tiered_computed == plain_computed - host  # every host hit is a token not computed


@pytest.mark.slow
def test_the_default_model_gives_the_same_tokens_with_the_host_tier(default_llm):
    """fp32 SmolLM2-135M: three conversations of two turns on a pool of 6 blocks of 8,
    too small to keep three histories (3 to 4 blocks each), with and without 24 host
    blocks."""
    runner = default_llm.engine.runner
    convs = _conversations(3, 20, runner.vocab_size)
    options = dict(num_kv_blocks=6, block_size=8, dtype="float32")
    plain, plain_computed, _ = chat(runner, 0, 2, convs, 2, **options)
    tiered, tiered_computed, host = chat(runner, 24, 2, convs, 2, **options)
    assert tiered == plain
    assert host > 0 and tiered_computed == plain_computed - host


@pytest.fixture(scope="module")
def small_runner(tiny_llama_dir):
    from minicb.core.runner.model_runner import ModelRunner

    return ModelRunner(tiny_llama_dir, EngineConfig(num_kv_blocks=8, block_size=4, dtype="float32"))


def test_a_host_tier_larger_than_the_available_memory_is_refused(small_runner):
    """Twice this host's whole memory: the mapping would be made at once and fail only as
    prefixes filled it; refused when the runner is built instead."""
    per_block = small_runner.describe()["bytes_per_block"]
    too_many = 2 * os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // per_block
    config = small_runner.config.with_(kv_offload_blocks=too_many)
    with pytest.raises(ValueError, match=r"kv_offload_blocks=\d+ needs [\d,]+ bytes") as refused:
        small_runner.with_config(config)
    assert "blocks fit (--kv-offload-blocks)" in str(refused.value)


def test_the_host_tiers_limit_is_what_is_available_less_the_other_host_pools(
    small_runner, monkeypatch
):
    """On CPU the device pool (8 blocks) and its swap twin (8) share the host's memory:
    with room for 10 more blocks and a half, 10 fit and 11 are refused, naming 10."""
    from minicb.core.runner import kv_setup

    per_block = small_runner.describe()["bytes_per_block"]
    available = (16 + 10) * per_block + per_block // 2
    monkeypatch.setattr(kv_setup, "host_available_bytes", lambda: available)
    fits = small_runner.with_config(small_runner.config.with_(kv_offload_blocks=10))
    assert fits.offload_pool.num_blocks == 10
    with pytest.raises(ValueError) as refused:
        small_runner.with_config(small_runner.config.with_(kv_offload_blocks=11))
    said = str(refused.value)
    assert (
        f"needs {11 * per_block:,} bytes" in said
        and f"limit of {10 * per_block + per_block // 2:,}" in said
    )
    assert f"{available:,} bytes available" in said and "at most 10 blocks fit" in said
