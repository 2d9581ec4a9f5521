"""The Triton chunked-prefill kernel agrees with the torch reference on ragged batches.

Each batch mixes a fresh 70-token prompt (several query tiles), a 45-token chunk that
starts mid-context after 155 cached tokens (mid-block at both block sizes), and a decode
row with one query token; contexts end in partial blocks, unowned rows hold poison.
"""

from __future__ import annotations

import pytest
import torch

from minicb.core.attention import reference
from minicb.kernels.prefill_attention import paged_prefill_attention
from minicb.kernels.triton_backend import TritonBackend

from . import GQA_SHAPES, POISON, TOLERANCES, make_paged_case

QUERY_LENS = [70, 45, 1]
CONTEXT_LENS = [70, 200, 33]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", GQA_SHAPES, ids=lambda h: f"{h[0]}:{h[1]}")
def test_prefill_matches_reference(heads, head_dim, block_size, dtype):
    num_heads, num_kv_heads = heads
    query, k_cache, v_cache, meta = make_paged_case(
        QUERY_LENS, CONTEXT_LENS, num_heads, num_kv_heads, head_dim, block_size, dtype
    )
    scale = head_dim**-0.5
    out = paged_prefill_attention(
        query,
        k_cache,
        v_cache,
        meta.block_tables,
        meta.context_lens,
        meta.query_start,
        scale,
        meta.max_query_len,
    )
    ref = reference.paged_prefill_attention(query, k_cache, v_cache, meta, scale)
    assert out.dtype == dtype and out.shape == ref.shape
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_backend_stores_then_attends_like_the_reference(dtype):
    # The runner's order: store this step's K/V, then attend over the cache that holds them.
    query, k_cache, v_cache, meta = make_paged_case([30, 1, 12], [30, 17, 50], 9, 3, 64, 16, dtype)
    gen = torch.Generator().manual_seed(3)
    new_k = torch.randn((query.shape[0], 3, 64), generator=gen).to(query.device, dtype)
    new_v = torch.randn((query.shape[0], 3, 64), generator=gen).to(query.device, dtype)
    # Poison this step's slots first, so attention that ran before the store would show.
    for cache in (k_cache, v_cache):
        cache.view(-1, 3, 64)[meta.slot_mapping] = POISON
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    backend = TritonBackend()
    backend.store_kv(new_k, new_v, k_cache, v_cache, meta.slot_mapping)
    out = backend.attention(query, k_cache, v_cache, meta, 0.125)
    reference.store_kv(new_k, new_v, k_ref, v_ref, meta.slot_mapping)
    ref = reference.paged_attention(query, k_ref, v_ref, meta, 0.125)
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)
