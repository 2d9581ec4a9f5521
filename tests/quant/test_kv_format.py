"""The 8-bit KV formats: a store then a read gives back every key and value within the
format's error bound, with one scale per token and KV head, and a plain cache is untouched
by all of it."""

from __future__ import annotations

import pytest
import torch

from minicb.core.attention import reference
from minicb.core.attention.backend import AttentionMetadata, TorchBackend
from minicb.core.attention.kv_slots import read_slots
from minicb.quant.kv import FORMATS, QuantizedCache, dequantize, quantize

SHAPE = (6, 4, 3, 32)  # (num_blocks, block_size, num_kv_heads, head_dim)


def empty_cache(fmt: str) -> QuantizedCache:
    return QuantizedCache(torch.zeros(SHAPE, dtype=FORMATS[fmt][0]), torch.zeros(SHAPE[:-1]))


def error_bound(fmt: str, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The largest error the format allows, element by element (minicb/quant/kv.py)."""
    s = scale.unsqueeze(-1)
    if fmt == "int8":
        return s / 2 * (1 + 1e-5) + 1e-7
    # e4m3 rounded to nearest: 2^-4 relative; its subnormal step is 2^-9 of the scale.
    return x.abs() * 2**-4 + s * 2**-10 + 1e-7


def keys(seed: int, n: int = 10) -> torch.Tensor:
    """Values of very different sizes per token and head, one outlier, one all-zero head."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((n, *SHAPE[2:]), generator=gen) * torch.logspace(-2, 2, n)[:, None, None]
    x[3, 1, 7] = 300.0  # an outlier costs precision on its own token and head only
    x[5, 2] = 0.0
    return x


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_then_dequantize_is_within_the_bound(fmt):
    x = keys(0)
    data, scale = quantize(x, FORMATS[fmt][0])
    assert data.dtype == FORMATS[fmt][0] and scale.shape == x.shape[:-1]
    # One scale per token and head: the largest magnitude maps onto the format's largest.
    amax = x.abs().amax(-1)
    torch.testing.assert_close(scale[amax > 0], amax[amax > 0] / FORMATS[fmt][1])
    back = dequantize(data, scale, torch.float32)
    assert ((back - x).abs() <= error_bound(fmt, x, scale)).all()
    assert back[5, 2].abs().max() == 0  # an all-zero head reads back as zeros, not NaN
    # The outlier's own head is coarse, its neighbour head on the same token is not.
    assert (back[3, 0] - x[3, 0]).abs().max() < (back[3, 1] - x[3, 1]).abs().max()


def test_int8_rounds_half_away_from_zero():
    x = torch.tensor([[127.0, 0.5, -0.5, 1.5, -2.5, 0.49]])
    data, scale = quantize(x, torch.int8)
    assert scale.item() == 1.0
    assert data.tolist() == [[127, 1, -1, 2, -3, 0]]


@pytest.mark.parametrize("fmt", FORMATS)
def test_store_then_read_through_the_reference(fmt):
    key, value = keys(1), keys(2)
    slots = torch.tensor([5, 0, 23, 9, 17, 1, 2, 12, 3, 20])
    k_cache, v_cache = empty_cache(fmt), empty_cache(fmt)
    reference.store_kv(key, value, k_cache, v_cache, slots)
    for cache, x in ((k_cache, key), (v_cache, value)):
        back = read_slots(cache, slots, torch.float32)
        assert ((back - x).abs() <= error_bound(fmt, x, cache.scale.flatten(0, 1)[slots])).all()
        untouched = torch.ones(SHAPE[0] * SHAPE[1], dtype=torch.bool)
        untouched[slots] = False
        assert cache.scale.flatten(0, 1)[untouched].abs().max() == 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_torch_backend_stores_what_the_reference_stores(fmt):
    key, value = keys(3), keys(4)
    slots = torch.tensor([5, 0, 23, -1, 17, 1, 2, -1, 3, 20])  # -1: not stored
    ours, ref = (empty_cache(fmt), empty_cache(fmt)), (empty_cache(fmt), empty_cache(fmt))
    TorchBackend().store_kv(key, value, *ours, slots)
    reference.store_kv(key, value, *ref, slots)
    for a, b in zip(ours, ref, strict=True):
        assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8))
        assert torch.equal(a.scale, b.scale)


@pytest.mark.parametrize("fmt", FORMATS)
def test_attention_over_an_8bit_cache_is_attention_over_its_dequantized_values(fmt):
    """Both torch paths (reference, torch backend) dequantise on read and then attend as
    over a plain cache: the same result as attending over the dequantised copy."""
    gen = torch.Generator().manual_seed(5)
    query_lens, context_lens, tables = [1, 5, 1], [7, 9, 3], [[1, 4], [2, 5, 0], [3]]
    slots = [tables[0][6 // 4] * 4 + 6 % 4]
    slots += [tables[1][p // 4] * 4 + p % 4 for p in range(4, 9)]
    slots += [tables[2][2 // 4] * 4 + 2 % 4]
    meta = AttentionMetadata.build(query_lens, context_lens, tables, slots, "cpu")
    k_cache, v_cache = empty_cache(fmt), empty_cache(fmt)
    everything = torch.arange(SHAPE[0] * SHAPE[1])
    reference.store_kv(
        keys(6, len(everything)), keys(7, len(everything)), k_cache, v_cache, everything
    )
    plain_k = read_slots(k_cache, everything, torch.float32).view(SHAPE)
    plain_v = read_slots(v_cache, everything, torch.float32).view(SHAPE)
    query = torch.randn((sum(query_lens), 6, SHAPE[-1]), generator=gen)
    expected = reference.paged_attention(query, plain_k, plain_v, meta, 0.2)
    torch.testing.assert_close(
        reference.paged_attention(query, k_cache, v_cache, meta, 0.2), expected
    )
    torch.testing.assert_close(
        TorchBackend().attention(query, k_cache, v_cache, meta, 0.2), expected
    )
