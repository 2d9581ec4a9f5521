"""The Triton kernels under an 8-bit KV cache: the store kernel writes the bytes and scales
the torch reference writes, both attention kernels dequantise on read and agree with the
reference over the same 8-bit cache, and the engine gives the torch backend's greedy
tokens (swap preemption included). Small cases: on CPU they run under the interpreter."""

from __future__ import annotations

import pytest
import torch

from minicb import LLM, SamplingParams
from minicb.core.attention import reference
from minicb.kernels.store_kv import store_kv
from minicb.kernels.triton_backend import TritonBackend
from minicb.quant.kv import FORMATS, QuantizedCache, quantize
from tests.helpers import mixed_prompts
from tests.kernels import DEVICE, TOLERANCES, make_paged_case


def quantized(cache: torch.Tensor, fmt: str) -> QuantizedCache:
    data, scale = quantize(cache, FORMATS[fmt][0])
    return QuantizedCache(data, scale)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("num_kv_heads", [3, 1])
def test_store_kernel_writes_the_reference_bytes(fmt, num_kv_heads):
    gen = torch.Generator().manual_seed(0)
    shape, dtype = (6, 4, num_kv_heads, 32), FORMATS[fmt][0]
    # key and value as views into one fused projection (the token stride is not Hkv * D).
    fused = (torch.randn((10, 2 * num_kv_heads, 32), generator=gen) * 5).to(DEVICE)
    key, value = fused[:, :num_kv_heads], fused[:, num_kv_heads:]
    slots = torch.tensor([5, 0, 23, -1, 17, 1, 2, -1, 3, 20], device=DEVICE)

    def empty() -> QuantizedCache:
        return QuantizedCache(
            torch.zeros(shape, dtype=dtype, device=DEVICE),
            torch.zeros(shape[:-1], device=DEVICE),
        )

    ours, ref = (empty(), empty()), (empty(), empty())
    store_kv(key, value, *ours, slots)
    reference.store_kv(key, value, *ref, slots)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.scale, b.scale, atol=0.0, rtol=1e-6)
        differ = a.data.view(torch.uint8) != b.data.view(torch.uint8)
        if DEVICE.type == "cuda":  # fast division may round a rare value the other way
            assert differ.float().mean() < 0.01
        else:
            assert not differ.any()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "query_lens, context_lens",
    [([1, 1, 1], [5, 40, 17]), ([1, 9, 1], [12, 30, 3])],
    ids=["decode", "mixed"],
)
def test_attention_kernels_read_the_8bit_cache_as_the_reference(
    fmt, dtype, query_lens, context_lens
):
    query, k_cache, v_cache, meta = make_paged_case(
        query_lens, context_lens, 6, 2, 32, 8, torch.float32, seed=2
    )
    k8, v8 = quantized(k_cache, fmt), quantized(v_cache, fmt)
    query = query.to(dtype)
    expected = reference.paged_attention(query.float(), k8, v8, meta, 0.17)
    out = TritonBackend().attention(query, k8, v8, meta, 0.17)
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(out.float(), expected, atol=atol, rtol=rtol)


PROMPTS = mixed_prompts(4, vocab=256, seed=9, min_len=3, max_len=30)
PARAMS = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (6, 3, 8, 5)]
CASES = {
    # Room for two requests of up to 38 tokens at a time: preemption by swap is forced.
    "block-4-swap": dict(
        block_size=4, num_kv_blocks=16, max_num_batched_tokens=8, preemption_mode="swap"
    ),
    "block-16-mixed": dict(block_size=16, num_kv_blocks=64, max_num_batched_tokens=12),
}


@pytest.fixture(scope="module")
def torch_int8_tokens(tiny_llama_dir) -> list[list[int]]:
    llm = LLM(
        model=tiny_llama_dir,
        dtype="float32",
        attention_backend="torch",
        kv_cache_dtype="int8",
        num_kv_blocks=64,
    )
    return [o.token_ids for o in llm.generate(PROMPTS, PARAMS)]


@pytest.mark.slow  # an engine on the Triton interpreter, per case
@pytest.mark.parametrize("name", CASES)
def test_engine_on_triton_gives_the_torch_tokens_under_int8(
    name, tiny_llama_dir, torch_int8_tokens
):
    options = CASES[name]
    llm = LLM(
        model=tiny_llama_dir,
        dtype="float32",
        attention_backend="triton",
        kv_cache_dtype="int8",
        **options,
    )
    plans: list = []
    llm.engine.bus.subscribe(lambda es: plans.extend(e.plan for e in es), kinds=["step"])
    assert [o.token_ids for o in llm.generate(PROMPTS, PARAMS)] == torch_int8_tokens
    if options.get("preemption_mode") == "swap":
        assert any(p.swap_in_map for p in plans), "nothing was swapped back in"
    llm.engine.scheduler.blocks.check()
    assert llm.engine.kv_snapshot().num_used == 0
