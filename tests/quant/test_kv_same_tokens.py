"""The oracle in its own form under an 8-bit KV cache: with the same quantisation, greedy
tokens are equal across batching modes, chunk sizes, block sizes, preemption modes (swap
carries the scales with the blocks) and prefix caching (a shared block is read with its
scales); no block leaks. Tiny random Llama, fp32 compute. Agreement with the unquantised
cache is measured, not asserted (perflab/kv_quant_agreement.py)."""

from __future__ import annotations

import pytest
import torch

from minicb import LLM, SamplingParams
from minicb.core.runner import kv_setup
from minicb.core.runner.kv_pool import KVPool, copy_blocks
from tests.helpers import MIXED, MIXED_MAX, SHARED, SHARED_MAX, greedy_tokens

# Each bends the schedule its own way (tests/test_same_tokens_everywhere.py has them all).
CONFIGS = {
    "static": dict(batching="static"),
    "chunk-1": dict(max_num_batched_tokens=1),
    "chunk-7": dict(max_num_batched_tokens=7),
    "no-chunking": dict(enable_chunked_prefill=False, max_num_batched_tokens=80),
    "block-1": dict(block_size=1, num_kv_blocks=400),
    "block-4": dict(block_size=4, num_kv_blocks=100),
}


def llm(model_dir: str, kv: str, **options) -> LLM:
    base = dict(dtype="float32", num_kv_blocks=256, block_size=16, kv_cache_dtype=kv)
    return LLM(model=model_dir, **(base | options))


def steps(engine) -> list:
    plans: list = []
    engine.bus.subscribe(lambda es: plans.extend(e.plan for e in es), kinds=["step"])
    return plans


def no_leaks(engine) -> None:
    engine.scheduler.blocks.check()
    assert engine.kv_snapshot().num_used == 0


@pytest.fixture(scope="module", params=["int8", "fp8"])
def kv(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def one_at_a_time(tiny_llama_dir, kv) -> list[list[int]]:
    """No batching at all, same quantisation: what every mode must reproduce."""
    return greedy_tokens(llm(tiny_llama_dir, kv, max_num_seqs=1), MIXED, MIXED_MAX)


@pytest.mark.parametrize("name", CONFIGS)
def test_same_tokens_in_every_mode(name, kv, tiny_llama_dir, one_at_a_time):
    engine_llm = llm(tiny_llama_dir, kv, **CONFIGS[name])
    assert greedy_tokens(engine_llm, MIXED, MIXED_MAX) == one_at_a_time
    no_leaks(engine_llm.engine)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_same_tokens_under_preemption(mode, kv, tiny_llama_dir, one_at_a_time):
    """A pool of 72 tokens for 16 requests: preemption is forced; swapped-out blocks come
    back from host memory with their scales, or the tokens would differ."""
    engine_llm = llm(
        tiny_llama_dir,
        kv,
        num_kv_blocks=18,
        block_size=4,
        num_swap_blocks=18,
        preemption_mode=mode,
        max_num_batched_tokens=32,
    )
    plans = steps(engine_llm.engine)
    assert greedy_tokens(engine_llm, MIXED, MIXED_MAX) == one_at_a_time
    # Swap falls back to recompute when the swap space is full; recompute never swaps.
    modes = {d.mode for p in plans for d in p.preempted}
    assert mode in modes and (mode == "swap" or modes == {"recompute"})
    swapped_in = [pair for p in plans for pair in p.swap_in_map]
    assert bool(swapped_in) == (mode == "swap")
    no_leaks(engine_llm.engine)


def test_same_tokens_with_prefix_caching(kv, tiny_llama_dir):
    """Cached blocks are read with the scales their first owner wrote."""
    off = llm(tiny_llama_dir, kv, max_num_seqs=1, enable_prefix_caching=False)
    expected = greedy_tokens(off, SHARED, SHARED_MAX)
    on = llm(tiny_llama_dir, kv, max_num_seqs=4, enable_prefix_caching=True)
    plans = steps(on.engine)
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in SHARED_MAX]
    assert [o.token_ids for o in on.generate(SHARED, params)] == expected
    assert sum(p.prefix_hit_tokens for p in plans) > 0
    no_leaks(on.engine)


def test_copy_blocks_moves_values_and_scales(kv):
    """The one block copy (device pool <-> host pool) carries every layer's values and
    scales, keys and values, and touches no other block."""
    block = (4, 2, 8)
    src = KVPool.allocate(3, block, 5, kv, torch.float32, "cpu")
    dst = KVPool.allocate(3, block, 4, kv, torch.float32, "cpu")
    gen = torch.Generator().manual_seed(0)
    for layer_k, layer_v in src.layers():
        for cache in (layer_k, layer_v):
            cache.data.copy_(torch.randn(cache.data.shape, generator=gen).to(cache.data.dtype))
            cache.scale.copy_(torch.rand(cache.scale.shape, generator=gen))
    copy_blocks(src, dst, [(4, 0), (1, 2)])
    for s, d in ((4, 0), (1, 2)):
        assert torch.equal(dst.values[:, :, d].float(), src.values[:, :, s].float())
        assert torch.equal(dst.parts[1][:, :, d], src.parts[1][:, :, s])  # the scales
    for untouched in (1, 3):
        assert dst.values[:, :, untouched].float().abs().max() == 0
        assert dst.parts[1][:, :, untouched].abs().max() == 0


def test_the_pool_holds_more_blocks_in_the_same_memory(tiny_llama_dir, monkeypatch):
    """Sized from free memory under a byte budget, the 8-bit pool holds as many more blocks
    as its block is smaller: (head_dim + 4 scale bytes) against 4 x head_dim in fp32."""
    monkeypatch.setattr(kv_setup, "CPU_KV_POOL_BYTES", 1 << 20)
    runners = {
        kv: llm(tiny_llama_dir, kv, num_kv_blocks=None, max_num_seqs=512).engine.runner
        for kv in ("auto", "int8")
    }
    auto, int8 = runners["auto"], runners["int8"]
    cfg = auto.model_config
    per_token_head = {"auto": 4 * cfg.head_dim, "int8": cfg.head_dim + 4}
    for kv, runner in runners.items():
        per_block = 2 * cfg.num_layers * 16 * cfg.num_kv_heads * per_token_head[kv]
        assert runner.bytes_per_block() == per_block
        assert runner.num_kv_blocks == (1 << 20) // per_block
        assert runner.describe()["kv_cache_dtype"].startswith(kv if kv != "auto" else "float32")
    assert int8.num_kv_blocks >= 2 * auto.num_kv_blocks
    assert int8.kv_cache.dtype == torch.int8 and auto.kv_cache.dtype == torch.float32
