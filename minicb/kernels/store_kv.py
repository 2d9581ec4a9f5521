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
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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


def store_kv(
    key: torch.Tensor,  # (T, num_kv_heads, head_dim)
    value: torch.Tensor,  # (T, num_kv_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (T,) int64; -1 marks tokens that are not stored
) -> None:
    """Write ``key``/``value`` rows into the cache slots named by ``slot_mapping``."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    assert value.shape == key.shape, (value.shape, key.shape)
    assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
    assert k_cache.shape[2:] == (num_kv_heads, head_dim), (k_cache.shape, key.shape)
    assert slot_mapping.shape == (num_tokens,) and slot_mapping.dtype == torch.int64
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
