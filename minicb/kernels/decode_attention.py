"""Triton paged decode attention: one new query token per request, over its whole context.

Math: for request ``b`` with context length ``L`` and query head ``h`` (which reads KV head
``h // G``, ``G = num_heads // num_kv_heads``):

    out[b, h] = sum_j softmax_j(scale * q[b, h] . k[b, j]) * v[b, j],   j = 0 .. L-1

computed with the online softmax: walk the context in tiles of BLOCK_N keys, keeping a
running max ``m``, running denominator ``denom`` and running weighted sum ``acc`` (all fp32);
when a tile raises the max, rescale ``denom`` and ``acc`` by ``exp(m_old - m_new)``. Powers are
taken with exp2, so the scale is multiplied by log2(e) once.

Memory layout:
  query      (B, num_heads, head_dim); heads of one KV group are adjacent, so the G query
             heads of KV head ``kh`` are rows ``kh*G .. kh*G+G-1``
  k/v cache  (num_blocks, block_size, num_kv_heads, head_dim); context position ``j`` of
             request ``b`` lives in block ``block_tables[b, j // block_size]``, row
             ``j % block_size``. A tile gathers its block ids per position, so BLOCK_N need
             not equal block_size and the last, partial block is just masked.
  out        (B, num_heads, head_dim), query dtype.
  8-bit KV   (minicb/quant/kv.py) the caches come as ``QuantizedCache(data, scale)``: int8
             or fp8 values in the layout above and an fp32 scale per (block, row, KV head).
             Each tile loads its N rows' scales beside their values and multiplies them in
             (``QUANT``), so the cache is dequantised on read and never copied; the dots
             then run in the query's dtype.

Launch grid: ``(B, num_kv_heads, num_splits)``. One program serves all G query heads of a
KV head: it reads each K/V row once and uses it G times, which is the whole point of GQA
(decode is bound by reading the cache). The G heads are the rows of a small matrix, so the
scores are one ``tl.dot`` of (G, D) by (D, BLOCK_N).

Split context (flash-decoding): with few requests the grid has too few programs to fill
the GPU, so each request's context is cut into ``num_splits`` ranges handled by separate
programs. Each writes its partial (m, denom, acc) to fp32 scratch, and a second kernel, grid
``(B, num_heads)``, merges them: ``out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) denom_s``
with ``M = max_s m_s``. The ranges are computed in the kernel from the context length, so
the grid depends only on (B, num_kv_heads, num_splits) and is safe to capture in a CUDA
graph.
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
def _decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,  # (num_blocks, block_size, num_kv_heads) fp32 when QUANT, else unused
    v_scale_ptr,
    block_tables_ptr,
    context_lens_ptr,
    out_ptr,
    part_m_ptr,  # (B, H, NUM_SPLITS) fp32, only used when NUM_SPLITS > 1
    part_l_ptr,  # (B, H, NUM_SPLITS) fp32
    part_acc_ptr,  # (B, H, NUM_SPLITS, DIM_PAD) fp32
    qk_scale,  # softmax scale * log2(e)
    q_stride_b,
    q_stride_h,
    out_stride_b,
    out_stride_h,
    cache_stride_block,
    cache_stride_row,
    cache_stride_head,
    scale_stride_block,
    scale_stride_row,
    table_stride_b,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # >= 16 so the rows fill a tl.dot tile
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # KV-cache block size
    BLOCK_N: tl.constexpr,  # keys per tile
    NUM_SPLITS: tl.constexpr,
    QUANT: tl.constexpr,  # 8-bit K/V: dequantise each tile with its per-token scales
    UPCAST: tl.constexpr,  # do the math in fp32 (the interpreter cannot do bf16 arithmetic)
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs, so no TF32 rounding
):
    req = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    ctx_len = tl.load(context_lens_ptr + req)

    g = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + g  # (G,) query heads of this KV head
    head_ok = g < GROUP
    dims = tl.arange(0, DIM_PAD)
    dim_ok = dims < HEAD_DIM
    q_mask = head_ok[:, None] & dim_ok[None, :]
    q_ptrs = q_ptr + req * q_stride_b + heads[:, None] * q_stride_h + dims[None, :]
    # Padded rows/dims must be 0, not garbage: padded dims enter every dot product.
    q = tl.load(q_ptrs, q_mask, 0.0)  # (G, D)
    if not QUANT:  # a plain cache: compute in its dtype; an 8-bit one is read as q's
        q = q.to(k_cache_ptr.dtype.element_ty)
    if UPCAST:
        q = q.to(tl.float32)

    # This program's share of the context, cut on tile boundaries.
    tiles_per_split = tl.cdiv(tl.cdiv(ctx_len, BLOCK_N), NUM_SPLITS)
    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, ctx_len)

    m = tl.full((GROUP_PAD,), float("-inf"), tl.float32)  # running max of the log2 scores
    denom = tl.zeros((GROUP_PAD,), tl.float32)  # running sum of 2^(s - m)
    acc = tl.zeros((GROUP_PAD, DIM_PAD), tl.float32)  # running sum of 2^(s - m) * v
    for tile_start in range(start, end, BLOCK_N):
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

        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # (G, N)
        s = tl.where(pos_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)  # rescales what was summed under the old max
        p = tl.exp2(s - m_new[:, None])  # (G, N)
        denom = denom * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        acc += tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new

    if NUM_SPLITS == 1:
        # denom is 0 only for an empty context (a padded batch row): write zeros, not NaN.
        out = acc / tl.where(denom == 0.0, 1.0, denom)[:, None]
        out_ptrs = out_ptr + req * out_stride_b + heads[:, None] * out_stride_h + dims[None, :]
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), q_mask)
    else:
        part = (req * NUM_HEADS + heads) * NUM_SPLITS + split  # (G,)
        tl.store(part_m_ptr + part, m, head_ok)
        tl.store(part_l_ptr + part, denom, head_ok)
        tl.store(part_acc_ptr + part[:, None] * DIM_PAD + dims[None, :], acc, head_ok[:, None])


@triton.jit
def _combine_splits_kernel(
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    out_ptr,
    out_stride_b,
    out_stride_h,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    req = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    split_ok = splits < NUM_SPLITS
    dims = tl.arange(0, DIM_PAD)
    part = (req * NUM_HEADS + head) * NUM_SPLITS + splits  # (S,)
    m = tl.load(part_m_ptr + part, split_ok, float("-inf"))  # (S,)
    denom = tl.load(part_l_ptr + part, split_ok, 0.0)
    acc = tl.load(part_acc_ptr + part[:, None] * DIM_PAD + dims[None, :], split_ok[:, None], 0.0)

    m_max = tl.max(m, axis=0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # every split empty: avoid inf - inf
    w = tl.exp2(m - m_max)  # (S,) empty splits have m = -inf and weigh 0
    total = tl.sum(denom * w, axis=0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.where(total == 0.0, 1.0, total)  # (D,)
    out_ptrs = out_ptr + req * out_stride_b + head * out_stride_h + dims
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), dims < HEAD_DIM)


def default_num_splits(batch: int, num_kv_heads: int, max_context_len: int, device) -> int:
    """Enough context splits to give every SM a program, but none shorter than 256 keys."""
    if torch.device(device).type != "cuda":
        return 1
    programs = batch * num_kv_heads
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    if programs >= num_sms:
        return 1
    return max(1, min(triton.cdiv(num_sms, programs), max_context_len // 256, 32))


def paged_decode_attention(
    query: torch.Tensor,  # (B, num_heads, head_dim): one query token per request
    k_cache: torch.Tensor | QuantizedCache,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor | QuantizedCache,
    block_tables: torch.Tensor,  # (B, max_blocks) int32
    context_lens: torch.Tensor,  # (B,) int32, this step's token included
    scale: float,
    max_context_len: int,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Decode attention for every request in one launch (two with context splits)."""
    batch, num_heads, head_dim = query.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
    k_data, v_data, k_scale, v_scale = cache_operands(k_cache, v_cache)
    quantized = isinstance(k_cache, QuantizedCache)
    compute = query.dtype if quantized else k_data.dtype  # the dtype the dots run in
    assert query.stride(-1) == 1
    group = num_heads // num_kv_heads
    out = torch.empty_like(query)
    if batch == 0:
        return out
    if num_splits is None:
        num_splits = default_num_splits(batch, num_kv_heads, max_context_len, query.device)
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    if num_splits > 1:
        part_m = torch.empty((batch, num_heads, num_splits), device=query.device)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty((batch, num_heads, num_splits, dim_pad), device=query.device)
    else:
        part_m = part_l = part_acc = out  # never touched
    _decode_kernel[(batch, num_kv_heads, num_splits)](
        query,
        k_data,
        v_data,
        k_scale,
        v_scale,
        block_tables,
        context_lens,
        out,
        part_m,
        part_l,
        part_acc,
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
        NUM_HEADS=num_heads,
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        DIM_PAD=dim_pad,
        BLOCK_SIZE=block_size,
        BLOCK_N=128 if dim_pad <= 64 else 64,
        NUM_SPLITS=num_splits,
        QUANT=quantized,
        # The interpreter stores bf16 as raw uint16 and cannot compute with it.
        UPCAST=compute == torch.bfloat16 and not isinstance(_decode_kernel, JITFunction),
        DOT_PRECISION="ieee" if compute == torch.float32 else "tf32",
        num_warps=4,
    )
    if num_splits > 1:
        _combine_splits_kernel[(batch, num_heads)](
            part_m,
            part_l,
            part_acc,
            out,
            out.stride(0),
            out.stride(1),
            NUM_HEADS=num_heads,
            HEAD_DIM=head_dim,
            DIM_PAD=dim_pad,
            NUM_SPLITS=num_splits,
            SPLITS_PAD=triton.next_power_of_2(num_splits),
        )
    return out
