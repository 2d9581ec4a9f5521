"""Triton chunked-prefill attention: a ragged batch of query chunks over paged contexts.

Math: request ``b`` brings ``Q`` query tokens (a prompt chunk, or 1 for a decode row mixed
into the batch) and has context length ``L`` including them, so its query ``t`` sits at
absolute position ``p_t = L - Q + t``. Query head ``h`` reads KV head ``h // G``:

    out[t, h] = sum_{j <= p_t} softmax_j(scale * q[t, h] . k[j]) * v[j]

i.e. the chunk sees the whole cached prefix and is causal within itself; a chunk that
starts mid-context is just ``L > Q``. The sum runs as an online softmax over tiles of
BLOCK_N keys with fp32 running max ``m``, denominator ``denom`` and accumulator ``acc``;
exp2 is used, with log2(e) folded into the scale.

Memory layout:
  query      (T, num_heads, head_dim), the chunks of all requests back to back;
             request b owns tokens ``query_start[b] .. query_start[b+1]-1``
  k/v cache  (num_blocks, block_size, num_kv_heads, head_dim); position ``j`` of request
             ``b`` is row ``j % block_size`` of block ``block_tables[b, j // block_size]``.
             This step's K/V are already stored, so the chunk reads itself from the cache.
  out        (T, num_heads, head_dim), query dtype.
  8-bit KV   ``QuantizedCache(data, scale)`` caches are dequantised tile by tile as in
             decode_attention.py (``QUANT``: each row's value x its token's scale).

GQA packing: the G query heads of one KV head share every K/V tile, so a program stacks
them into its rows: row ``r`` of a BLOCK_M-row tile is query token ``r // G`` and head
``kv_head*G + r % G`` (``BLOCK_M // G`` tokens per tile). K/V are read once per group and
the scores are a single (BLOCK_M, D) x (D, BLOCK_N) ``tl.dot``.

Launch grid: ``(B, cdiv(max_query_len, BLOCK_M // G), num_kv_heads)``, one launch for the
whole ragged batch. Programs whose query tile starts past their request's chunk return at
once. Each program stops reading keys after the last position its tile can see, and one
mask ``(j <= p_t) & (j < end)`` covers both causality and the partial last block.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from minicb.kernels.store_kv import cache_operands
from minicb.quant.kv import QuantizedCache

LOG2E = math.log2(math.e)


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,  # (num_blocks, block_size, num_kv_heads) fp32 when QUANT, else unused
    v_scale_ptr,
    block_tables_ptr,
    context_lens_ptr,
    query_start_ptr,
    out_ptr,
    qk_scale,  # softmax scale * log2(e)
    q_stride_t,
    q_stride_h,
    out_stride_t,
    out_stride_h,
    cache_stride_block,
    cache_stride_row,
    cache_stride_head,
    scale_stride_block,
    scale_stride_row,
    table_stride_b,
    GROUP: tl.constexpr,  # query heads per KV head
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # KV-cache block size
    BLOCK_M: tl.constexpr,  # rows per tile = TOKENS query tokens x GROUP heads (+ padding)
    TOKENS: tl.constexpr,  # BLOCK_M // GROUP
    BLOCK_N: tl.constexpr,  # keys per tile
    QUANT: tl.constexpr,  # 8-bit K/V: dequantise each tile with its per-token scales
    UPCAST: tl.constexpr,  # do the math in fp32 (the interpreter cannot do bf16 arithmetic)
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs, so no TF32 rounding
):
    req = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(query_start_ptr + req)
    q_len = tl.load(query_start_ptr + req + 1) - q_start
    first_token = tile * TOKENS
    if first_token >= q_len:
        return
    ctx_len = tl.load(context_lens_ptr + req)
    prefix = ctx_len - q_len  # context cached before this chunk

    r = tl.arange(0, BLOCK_M)
    token = first_token + r // GROUP  # (M,) index within the chunk
    head = kv_head * GROUP + r % GROUP  # (M,)
    row_ok = (r < TOKENS * GROUP) & (token < q_len)
    q_pos = prefix + token  # (M,) absolute position of each row's query
    dims = tl.arange(0, DIM_PAD)
    dim_ok = dims < HEAD_DIM
    q_mask = row_ok[:, None] & dim_ok[None, :]
    q_ptrs = q_ptr + (q_start + token)[:, None] * q_stride_t + head[:, None] * q_stride_h
    # Padded rows/dims must be 0, not garbage: padded dims enter every dot product.
    q = tl.load(q_ptrs + dims[None, :], q_mask, 0.0)
    if not QUANT:  # a plain cache: compute in its dtype; an 8-bit one is read as q's
        q = q.to(k_cache_ptr.dtype.element_ty)
    if UPCAST:
        q = q.to(tl.float32)

    # Keys this tile can see: up to its last query token's position.
    end = prefix + tl.minimum(first_token + TOKENS, q_len)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)  # running max of the log2 scores
    denom = tl.zeros((BLOCK_M,), tl.float32)  # running sum of 2^(s - m)
    acc = tl.zeros((BLOCK_M, DIM_PAD), tl.float32)  # running sum of 2^(s - m) * v
    for tile_start in range(0, end, BLOCK_N):
        pos = tile_start + tl.arange(0, BLOCK_N)  # (N,) context positions
        pos_ok = pos < end
        block = tl.load(block_tables_ptr + req * table_stride_b + pos // BLOCK_SIZE, pos_ok, 0)
        row_off = (
            block.to(tl.int64) * cache_stride_block
            + (pos % BLOCK_SIZE) * cache_stride_row
            + kv_head * cache_stride_head
        )
        kv_mask = pos_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_cache_ptr + row_off[:, None] + dims[None, :], kv_mask, 0.0)  # (N, D)
        v = tl.load(v_cache_ptr + row_off[:, None] + dims[None, :], kv_mask, 0.0)  # (N, D)
        if QUANT:  # dequantise on read: value x its token's scale, in q's dtype
            scale_off = (
                block.to(tl.int64) * scale_stride_block
                + (pos % BLOCK_SIZE) * scale_stride_row
                + kv_head
            )
            k_scale = tl.load(k_scale_ptr + scale_off, pos_ok, 0.0)  # (N,)
            v_scale = tl.load(v_scale_ptr + scale_off, pos_ok, 0.0)
            k = (k.to(tl.float32) * k_scale[:, None]).to(q.dtype)
            v = (v.to(tl.float32) * v_scale[:, None]).to(q.dtype)
        elif UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)

        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # (M, N)
        # Every row sees position 0, so no row is fully masked and m is finite after tile 1.
        visible = (pos[None, :] <= q_pos[:, None]) & pos_ok[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)  # rescales what was summed under the old max
        p = tl.exp2(s - m_new[:, None])  # (M, N)
        denom = denom * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        acc += tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new

    out = acc / tl.where(denom == 0.0, 1.0, denom)[:, None]
    out_ptrs = out_ptr + (q_start + token)[:, None] * out_stride_t + head[:, None] * out_stride_h
    tl.store(out_ptrs + dims[None, :], out.to(out_ptr.dtype.element_ty), q_mask)


def paged_prefill_attention(
    query: torch.Tensor,  # (T, num_heads, head_dim)
    k_cache: torch.Tensor | QuantizedCache,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor | QuantizedCache,
    block_tables: torch.Tensor,  # (B, max_blocks) int32
    context_lens: torch.Tensor,  # (B,) int32, this step's tokens included
    query_start: torch.Tensor,  # (B+1,) int32, cumulative query lengths
    scale: float,
    max_query_len: int,
) -> torch.Tensor:
    """Causal attention of each request's chunk over its paged context, in one launch."""
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
    k_data, v_data, k_scale, v_scale = cache_operands(k_cache, v_cache)
    quantized = isinstance(k_cache, QuantizedCache)
    compute = query.dtype if quantized else k_data.dtype  # the dtype the dots run in
    assert query.stride(-1) == 1
    out = torch.empty_like(query)
    batch = context_lens.shape[0]
    if num_tokens == 0 or batch == 0:
        return out
    group = num_heads // num_kv_heads
    block_m = max(64, triton.next_power_of_2(group))
    tokens = block_m // group
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    grid = (batch, triton.cdiv(max_query_len, tokens), num_kv_heads)
    _prefill_kernel[grid](
        query,
        k_data,
        v_data,
        k_scale,
        v_scale,
        block_tables,
        context_lens,
        query_start,
        out,
        scale * LOG2E,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        k_data.stride(0),
        k_data.stride(1),
        k_data.stride(2),
        k_scale.stride(0),
        k_scale.stride(1),
        block_tables.stride(0),
        GROUP=group,
        HEAD_DIM=head_dim,
        DIM_PAD=dim_pad,
        BLOCK_SIZE=block_size,
        BLOCK_M=block_m,
        TOKENS=tokens,
        BLOCK_N=64,
        QUANT=quantized,
        # The interpreter stores bf16 as raw uint16 and cannot compute with it.
        UPCAST=compute == torch.bfloat16 and not isinstance(_prefill_kernel, JITFunction),
        DOT_PRECISION="ieee" if compute == torch.float32 else "tf32",
        num_warps=4,
    )
    return out
