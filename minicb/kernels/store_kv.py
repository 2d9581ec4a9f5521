"""Triton kernel that writes this step's keys and values into the paged KV cache.

Math: none, it is a scatter. Token ``t`` owns cache slot ``s = slot_mapping[t]``; the slot
names block ``s // block_size`` and row ``s % block_size`` of that block. ``s = -1`` means
"do not store" (padding tokens, or tokens whose K/V are already cached).

Memory layout:
  key, value        (T, num_kv_heads, head_dim), any token/head strides, last dim contiguous
                    (they are often views into a fused qkv projection)
  k_cache, v_cache  (num_blocks, block_size, num_kv_heads, head_dim), last dim contiguous;
                    when contiguous, one token's heads x dims form one run of
                    ``num_kv_heads * head_dim`` elements, so each program writes one row.

Launch grid: ``(T,)``, one program per token. A program moves the token's whole
``num_kv_heads * head_dim`` row of K and of V as a single wide tile (padded to a power of
two and masked), which keeps stores coalesced on a GPU and the program count small under
the interpreter. A program whose slot is -1 returns before touching memory.

8-bit KV cache (minicb/quant/kv.py): the caches are ``QuantizedCache(data, scale)`` with
``scale`` of shape (num_blocks, block_size, num_kv_heads), one fp32 per token and KV head.
The program then holds its token as a (heads, dims) tile, takes each head's largest
magnitude, writes ``scale = amax / QMAX`` beside the block row and the values divided by
it in 8 bits (int8 rounded half away from zero, as the torch reference does; fp8 rounded
onto e4m3's grid, ties away from zero where torch rounds them to even). The token's
scale is final when it is written: no later token changes it, nothing is re-quantised.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minicb.quant.kv import MIN_AMAX, QuantizedCache, qmax_of

_MIN_AMAX = tl.constexpr(MIN_AMAX)  # a kernel may read a module global only as a constexpr


@triton.jit
def _store_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    key_stride_t,
    key_stride_h,
    value_stride_t,
    value_stride_h,
    cache_stride_block,
    cache_stride_row,
    cache_stride_head,
    BLOCK_SIZE: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    TILE: tl.constexpr,  # next power of two >= NUM_KV_HEADS * HEAD_DIM
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)  # int64
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    row = slot % BLOCK_SIZE

    # The token's (head, dim) pairs, flattened into one tile.
    offs = tl.arange(0, TILE)
    head = offs // HEAD_DIM
    dim = offs % HEAD_DIM
    valid = offs < NUM_KV_HEADS * HEAD_DIM

    dst = block * cache_stride_block + row * cache_stride_row + head * cache_stride_head + dim
    k = tl.load(key_ptr + token * key_stride_t + head * key_stride_h + dim, mask=valid)
    v = tl.load(value_ptr + token * value_stride_t + head * value_stride_h + dim, mask=valid)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=valid)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=valid)


@triton.jit
def _quantize_head_rows(src_ptrs, data_ptrs, scale_ptrs, mask, head_ok, QMAX, IS_INT):
    """One token's (heads, dims) tile -> 8-bit values and one scale per head."""
    x = tl.load(src_ptrs, mask, 0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=1), _MIN_AMAX) / QMAX  # (heads,)
    y = tl.minimum(tl.maximum(x / scale[:, None], -QMAX), QMAX)
    if IS_INT:  # the int conversion truncates: adding +-0.5 first rounds half away from 0
        y = tl.where(y >= 0, y + 0.5, y - 0.5)
    else:
        # Round onto e4m3's grid here (3 mantissa bits; below 2^-6 the subnormals' fixed
        # step 2^-9), so the conversion below only has to copy an exact value: Triton's CPU
        # interpreter converts some values just under a power of two to half of it.
        step = tl.exp2(tl.floor(tl.log2(tl.maximum(tl.abs(y), 0.015625))) - 3.0)
        y = tl.where(y >= 0, 1.0, -1.0) * tl.floor(tl.abs(y) / step + 0.5) * step
    tl.store(data_ptrs, y.to(data_ptrs.dtype.element_ty), mask)
    tl.store(scale_ptrs, scale, head_ok)


@triton.jit
def _store_kv_quant_kernel(
    key_ptr,
    value_ptr,
    k_data_ptr,
    v_data_ptr,
    k_scale_ptr,
    v_scale_ptr,
    slot_mapping_ptr,
    key_stride_t,
    key_stride_h,
    value_stride_t,
    value_stride_h,
    cache_stride_block,
    cache_stride_row,
    cache_stride_head,
    scale_stride_block,
    scale_stride_row,
    BLOCK_SIZE: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    DIM_PAD: tl.constexpr,
    QMAX: tl.constexpr,  # the format's largest magnitude: 127 (int8), 448 (e4m3)
    IS_INT: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)  # int64
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    row = slot % BLOCK_SIZE
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, DIM_PAD)
    head_ok = heads < NUM_KV_HEADS
    mask = head_ok[:, None] & (dims < HEAD_DIM)[None, :]
    dst = block * cache_stride_block + row * cache_stride_row
    dst = dst + heads[:, None] * cache_stride_head + dims[None, :]
    scale_dst = block * scale_stride_block + row * scale_stride_row + heads
    k_src = key_ptr + token * key_stride_t + heads[:, None] * key_stride_h + dims[None, :]
    v_src = value_ptr + token * value_stride_t + heads[:, None] * value_stride_h + dims[None, :]
    _quantize_head_rows(
        k_src, k_data_ptr + dst, k_scale_ptr + scale_dst, mask, head_ok, QMAX, IS_INT
    )
    _quantize_head_rows(
        v_src, v_data_ptr + dst, v_scale_ptr + scale_dst, mask, head_ok, QMAX, IS_INT
    )


def store_kv(
    key: torch.Tensor,  # (T, num_kv_heads, head_dim)
    value: torch.Tensor,  # (T, num_kv_heads, head_dim)
    k_cache: torch.Tensor | QuantizedCache,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor | QuantizedCache,
    slot_mapping: torch.Tensor,  # (T,) int64; -1 marks tokens that are not stored
) -> None:
    """Write ``key``/``value`` rows into the cache slots named by ``slot_mapping``
    (quantised, with their scales, when the caches are 8-bit)."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    assert value.shape == key.shape, (value.shape, key.shape)
    assert k_cache.shape == v_cache.shape, (k_cache.shape, v_cache.shape)
    assert k_cache.shape[2:] == (num_kv_heads, head_dim), (k_cache.shape, key.shape)
    assert slot_mapping.shape == (num_tokens,) and slot_mapping.dtype == torch.int64
    if isinstance(k_cache, QuantizedCache):
        _store_quantized(key, value, k_cache, v_cache, slot_mapping)
        return
    assert k_cache.stride() == v_cache.stride()
    for t in (key, value, k_cache):
        assert t.stride(-1) == 1, "the head_dim axis must be contiguous"
    _store_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        BLOCK_SIZE=k_cache.shape[1],
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        TILE=triton.next_power_of_2(num_kv_heads * head_dim),
    )


def _store_quantized(key, value, k_cache: QuantizedCache, v_cache: QuantizedCache, slots) -> None:
    data, scale = k_cache
    assert data.stride() == v_cache.data.stride() and scale.stride() == v_cache.scale.stride()
    for t in (key, value, data):
        assert t.stride(-1) == 1, "the head_dim axis must be contiguous"
    assert scale.stride(-1) == 1, "a block row's scales must be contiguous"
    num_tokens, num_kv_heads, head_dim = key.shape
    _store_kv_quant_kernel[(num_tokens,)](
        key,
        value,
        data,
        v_cache.data,
        scale,
        v_cache.scale,
        slots,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        data.stride(0),
        data.stride(1),
        data.stride(2),
        scale.stride(0),
        scale.stride(1),
        BLOCK_SIZE=data.shape[1],
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        DIM_PAD=triton.next_power_of_2(head_dim),
        QMAX=qmax_of(data.dtype),
        IS_INT=data.dtype == torch.int8,
    )


def cache_operands(k_cache, v_cache) -> tuple[torch.Tensor, ...]:
    """(k values, v values, k scales, v scales) as the attention kernels take them, checked:
    a plain cache passes its values as the (unread) scales, so one kernel serves both."""
    if isinstance(k_cache, QuantizedCache):
        (k_data, k_scale), (v_data, v_scale) = k_cache, v_cache
        assert k_scale.stride() == v_scale.stride() and k_scale.stride(-1) == 1
    else:
        k_data, v_data, k_scale, v_scale = k_cache, v_cache, k_cache, v_cache
    assert k_data.stride() == v_data.stride() and k_data.stride(-1) == 1
    return k_data, v_data, k_scale, v_scale
