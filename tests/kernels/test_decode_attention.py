"""The Triton paged decode kernel agrees with the torch reference.

Contexts of 1, 37 and 300 tokens leave partial last blocks at both block sizes; the cache
rows no request owns hold poison, so reading past a context or a padded table entry shows.
"""

from __future__ import annotations

import pytest
import torch

from minicb.core.attention import reference
from minicb.kernels.decode_attention import paged_decode_attention
from minicb.kernels.triton_backend import TritonBackend

from . import GQA_SHAPES, TOLERANCES, make_paged_case


def _run(query, k_cache, v_cache, meta, num_splits):
    scale = query.shape[-1] ** -0.5
    out = paged_decode_attention(
        query,
        k_cache,
        v_cache,
        meta.block_tables,
        meta.context_lens,
        scale,
        meta.max_context_len,
        num_splits=num_splits,
    )
    return out, reference.paged_decode_attention(query, k_cache, v_cache, meta, scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", GQA_SHAPES, ids=lambda h: f"{h[0]}:{h[1]}")
def test_decode_matches_reference(heads, head_dim, block_size, dtype):
    num_heads, num_kv_heads = heads
    case = make_paged_case(
        [1, 1, 1], [1, 37, 300], num_heads, num_kv_heads, head_dim, block_size, dtype
    )
    out, ref = _run(*case, num_splits=1)
    assert out.dtype == dtype and out.shape == ref.shape
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("num_splits", [2, 5])
def test_split_context_matches_reference(num_splits, dtype):
    # 3 tokens with 5 splits leaves four splits empty; 250 tokens span several tiles each.
    case = make_paged_case([1, 1, 1], [3, 64, 250], 9, 3, 64, 16, dtype, seed=1)
    out, ref = _run(*case, num_splits=num_splits)
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_empty_context_row_gives_zeros(num_splits):
    # A batch padded with a context-0 row (as CUDA-graph batches are) must not make NaNs.
    query, k_cache, v_cache, meta = make_paged_case([1, 1], [1, 40], 4, 1, 64, 16, torch.float32)
    ref = reference.paged_decode_attention(query, k_cache, v_cache, meta, 0.125)
    meta.context_lens[0] = 0
    out = paged_decode_attention(
        query, k_cache, v_cache, meta.block_tables, meta.context_lens, 0.125, 40, num_splits
    )
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    torch.testing.assert_close(out[1], ref[1], atol=1e-4, rtol=1e-4)


def test_backend_takes_the_decode_kernel_for_decode_only_batches():
    query, k_cache, v_cache, meta = make_paged_case(
        [1, 1], [20, 90], 9, 3, 64, 16, torch.bfloat16, seed=2
    )
    assert meta.is_decode_only
    out = TritonBackend().attention(query, k_cache, v_cache, meta, 0.125)
    ref = reference.paged_attention(query, k_cache, v_cache, meta, 0.125)
    torch.testing.assert_close(out, ref, atol=1.6e-2, rtol=1.6e-2)
