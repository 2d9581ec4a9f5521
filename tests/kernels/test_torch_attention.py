"""The torch backend (one gather index per step, decode-only or mixed) agrees with the reference.

Partial last blocks, block size 1, GQA groups, and poison in every row no request owns; a
second layer's cache read through the same step's index must give its own answer.
"""

from __future__ import annotations

import pytest
import torch

from minicb.core.attention import reference
from minicb.core.attention.backend import TorchBackend
from minicb.core.attention.torch_attention import (
    DecodeIndex,
    StepIndex,
    decode_attention,
    step_attention,
)

from . import GQA_SHAPES, make_paged_case


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("heads", GQA_SHAPES, ids=lambda h: f"{h[0]}:{h[1]}")
def test_decode_index_matches_reference(heads, block_size, dtype):
    case = make_paged_case([1, 1, 1, 1], [1, 5, 37, 64], *heads, 32, block_size, dtype)
    query, k_cache, v_cache, meta = case
    scale = 32**-0.5
    index = DecodeIndex.build(meta, block_size)
    out = decode_attention(query, k_cache, v_cache, index, scale)
    ref = reference.paged_decode_attention(query, k_cache, v_cache, meta, scale)
    # Same gathered values and the same SDPA call: equal, bar the kernel's own rounding.
    torch.testing.assert_close(out, ref, atol=1e-6 if dtype == torch.float32 else 1e-2, rtol=0)


def test_backend_builds_the_index_once_per_step_and_each_layer_reads_its_own_cache():
    query, k0, v0, meta = make_paged_case([1, 1], [9, 30], 4, 2, 16, 4, torch.float32)
    _, k1, v1, _ = make_paged_case([1, 1], [9, 30], 4, 2, 16, 4, torch.float32, seed=7)
    backend, scale = TorchBackend(), 0.25
    first = backend.attention(query, k0, v0, meta, scale)
    index = backend._step[1]
    second = backend.attention(query, k1, v1, meta, scale)
    assert backend._step[1] is index  # the same step: reused, not rebuilt
    torch.testing.assert_close(first, reference.paged_attention(query, k0, v0, meta, scale))
    torch.testing.assert_close(second, reference.paged_attention(query, k1, v1, meta, scale))
    other = make_paged_case([1], [3], 4, 2, 16, 4, torch.float32, seed=3)
    backend.attention(*other, scale)
    assert backend._step[1] is not index  # a new step's metadata: a new index


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("heads", GQA_SHAPES, ids=lambda h: f"{h[0]}:{h[1]}")
def test_mixed_step_index_matches_reference(heads, block_size, dtype):
    # Decodes beside prompt chunks: a first chunk (context = chunk), chunks after a cached
    # prefix (ending mid-block and on a block edge), and a step of chunks only.
    scale = 32**-0.5
    for query_lens, context_lens in (
        ([1, 7, 1, 5, 1], [9, 7, 33, 37, 1]),
        ([16, 3], [32, 3]),
    ):
        query, k_cache, v_cache, meta = make_paged_case(
            query_lens, context_lens, *heads, 32, block_size, dtype
        )
        index = StepIndex.build(meta, block_size)
        assert len(index.chunks) == sum(q > 1 for q in query_lens)
        out = step_attention(query, k_cache, v_cache, index, scale)
        ref = reference.paged_attention(query, k_cache, v_cache, meta, scale)
        tol = 1e-6 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(out, ref, atol=tol, rtol=0)


def test_backend_stores_as_the_reference_asking_once_per_step_which_tokens_store():
    backend = TorchBackend()
    caches = [torch.zeros(4, 2, 2, 3) for _ in range(4)]  # two layers, k and v, 8 slots
    key, value = torch.randn(3, 2, 3), torch.randn(3, 2, 3)
    padded = torch.tensor([5, -1, 2])  # a static padding row stores nothing
    for k_cache, v_cache in (caches[:2], caches[2:]):  # two layers of one step
        backend.store_kv(key, value, k_cache, v_cache, padded)
    assert backend._stores[0] is padded and backend._stores[1].tolist() == [True, False, True]
    for k_cache, v_cache in (caches[:2], caches[2:]):
        k_ref, v_ref = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
        reference.store_kv(key, value, k_ref, v_ref, padded)
        assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
        assert torch.equal(k_cache.view(8, 2, 3)[5], key[0]) and not k_cache.view(8, 2, 3)[7].any()
    every = torch.tensor([7, 1, 0])  # the next step's slots: asked again, all store
    backend.store_kv(key, value, caches[0], caches[1], every)
    assert backend._stores == (every, None)
    assert torch.equal(caches[0].view(8, 2, 3)[every], key)
