"""Plain-torch reference for every kernel: the definition the Triton kernels must match.

Cache layout (per layer): ``k_cache, v_cache`` of shape
``(num_blocks, block_size, num_kv_heads, head_dim)``; slot ``s`` is block ``s // block_size``,
row ``s % block_size``. In a KV format other than the plain tensor each is a layer object
(kv_layer.py; the 8-bit one, minicb/quant/kv.py, holds 8-bit values of that shape and one
fp32 scale per token and KV head): stores go through its ``write``, reads through its
``read_blocks`` in the query's dtype, and the attention is the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from minicb.core.attention.kv_layer import KVCache
from minicb.core.attention.kv_slots import read_blocks, storing, write_kv

if TYPE_CHECKING:
    from minicb.core.attention.backend import AttentionMetadata


def store_kv(
    key: torch.Tensor,  # (T, num_kv_heads, head_dim)
    value: torch.Tensor,  # (T, num_kv_heads, head_dim)
    k_cache: KVCache,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: KVCache,
    slot_mapping: torch.Tensor,  # (T,) int64; -1 marks tokens that are not stored
) -> None:
    """Write token i's key and value to cache slot ``slot_mapping[i]``; a static padding
    row (slot -1) recomputes a token and stores nothing (kv_slots.py: the cache viewed as
    one long row of slots, so a flat index addresses any token)."""
    write_kv(key, value, k_cache, v_cache, slot_mapping, storing(slot_mapping))


def gather_kv(
    cache: KVCache, blocks: torch.Tensor, length: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The first ``length`` tokens of one request: (length, num_kv_heads, head_dim).
    ``dtype``: what a layer in another format is read back as; a plain one comes as it is."""
    return read_blocks(cache, blocks, dtype).flatten(0, 1)[:length]


def paged_attention(
    query: torch.Tensor,  # (T, num_heads, head_dim)
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Causal attention of each request's query tokens over its paged context: (T, H, D)."""
    if meta.is_decode_only:
        return paged_decode_attention(query, k_cache, v_cache, meta, scale)
    return paged_prefill_attention(query, k_cache, v_cache, meta, scale)


def paged_decode_attention(
    query: torch.Tensor,  # (B, num_heads, head_dim): one query token per request
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """All requests at once: gather every block table, mask past each context length."""
    return _one_token_attention(
        query, k_cache, v_cache, meta.block_tables, meta.context_lens, meta.max_context_len, scale
    )


def _one_token_attention(
    query: torch.Tensor,  # (B, num_heads, head_dim)
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (B, max_blocks)
    context_lens: torch.Tensor,  # (B,)
    max_len: int,
    scale: float,
) -> torch.Tensor:
    batch = query.shape[0]
    # Gather each request's blocks into one padded context: (B, Hkv, L, D).
    tables = block_tables.long()
    k = read_blocks(k_cache, tables, query.dtype).flatten(1, 2)[:, :max_len].transpose(1, 2)
    v = read_blocks(v_cache, tables, query.dtype).flatten(1, 2)[:, :max_len].transpose(1, 2)
    positions = torch.arange(max_len, device=query.device)
    visible = positions[None, :] < context_lens.long()[:, None]  # (B, L)
    out = torch.nn.functional.scaled_dot_product_attention(
        query.unsqueeze(2),  # (B, H, 1, D)
        k,
        v,
        attn_mask=visible[:, None, None, :],
        scale=scale,
        enable_gqa=True,  # each group of query heads reads its shared KV head
    )
    return out.reshape(batch, *query.shape[1:])


def paged_prefill_attention(
    query: torch.Tensor,  # (T, num_heads, head_dim)
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """One chunk at a time: it attends to its cached prefix and causally to itself.

    Single-token rows (decodes sharing the iteration) are done together, as in decode.
    """
    out = torch.empty_like(query)
    one_token_rows = [i for i, q_len in enumerate(meta.query_lens_host) if q_len == 1]
    if one_token_rows:
        rows = torch.tensor(one_token_rows, device=query.device)
        tokens = meta.query_start[rows].long()
        max_len = max(meta.context_lens_host[i] for i in one_token_rows)
        out[tokens] = _one_token_attention(
            query[tokens],
            k_cache,
            v_cache,
            meta.block_tables[rows],
            meta.context_lens[rows],
            max_len,
            scale,
        )
    start = 0
    for i, (q_len, ctx_len) in enumerate(
        zip(meta.query_lens_host, meta.context_lens_host, strict=True)
    ):
        if q_len == 1:
            start += 1
            continue
        blocks = meta.block_tables[i].long()
        k = gather_kv(k_cache, blocks, ctx_len, query.dtype).transpose(0, 1)  # (Hkv, L, D)
        v = gather_kv(v_cache, blocks, ctx_len, query.dtype).transpose(0, 1)
        q = query[start : start + q_len].transpose(0, 1)  # (H, q_len, D)
        # Query j sits at position ctx_len - q_len + j and may see keys up to there.
        q_pos = torch.arange(ctx_len - q_len, ctx_len, device=query.device)
        k_pos = torch.arange(ctx_len, device=query.device)
        allowed = k_pos[None, :] <= q_pos[:, None]  # (q_len, L)
        # As a batch of one (4-D): the fused kernel's shape, as the torch backend calls it.
        o = torch.nn.functional.scaled_dot_product_attention(
            q[None], k[None], v[None], attn_mask=allowed, scale=scale, enable_gqa=True
        )
        out[start : start + q_len] = o[0].transpose(0, 1)
        start += q_len
    return out
