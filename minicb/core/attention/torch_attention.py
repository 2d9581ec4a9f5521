"""The torch backend's attention: gather indices built once per step, not per layer.

The reference (``minicb.core.attention.reference``) gathers every block of every request into a
padded copy, and builds the masks, in every layer. Everything but the gather itself depends
only on the step's metadata, which all layers share: the flat cache slot of each context
token, and the masks. ``StepIndex`` holds those, built by the first layer and reused by the
rest (30 layers in the default model). Each layer then does one ``index_select`` of exactly
the context tokens (not whole blocks) from the cache viewed as a flat row of slots, and one
SDPA call for all the one-token rows (decodes) plus one per prompt chunk. The reference
stays the definition; tests/kernels/test_torch_attention.py checks they agree. In another
KV format (kv_layer.py) the gathers go through the layer's ``read``: an 8-bit one reads
values and scales and dequantises what it gathered, only the step's context, never the
whole cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from minicb.core.attention.kv_layer import KVCache
from minicb.core.attention.kv_slots import read_slots

if TYPE_CHECKING:
    from minicb.core.attention.backend import AttentionMetadata


@dataclass(frozen=True)
class DecodeIndex:
    """What every layer needs to read the contexts of B one-token rows."""

    slots: torch.Tensor  # (B * L,) int64: flat cache slot of context token j of request i
    visible: torch.Tensor  # (B, 1, 1, L) bool: j < context_lens[i] (L = longest context)
    batch: int
    length: int

    @classmethod
    def build(cls, meta: AttentionMetadata, block_size: int) -> DecodeIndex:
        """Every row of a decode-only step."""
        return cls.of_rows(meta.block_tables, meta.context_lens, meta.max_context_len, block_size)

    @classmethod
    def of_rows(
        cls,
        block_tables: torch.Tensor,  # (B, max_blocks) int32
        context_lens: torch.Tensor,  # (B,) int32
        length: int,  # the longest of context_lens
        block_size: int,
    ) -> DecodeIndex:
        positions = torch.arange(length, device=block_tables.device)  # (L,)
        blocks = block_tables.long()[:, positions // block_size]  # (B, L)
        slots = blocks * block_size + positions % block_size
        visible = positions[None, :] < context_lens.long()[:, None]  # (B, L)
        # Past a request's context the table is padded with block 0: a real slot whose
        # (masked) values are read, so the gather needs no bounds check.
        return cls(slots.flatten(), visible[:, None, None, :], len(block_tables), length)


@dataclass(frozen=True)
class ChunkIndex:
    """One prompt chunk of q tokens: where its queries sit and what they may read."""

    start: int  # its first query token in the step's token order
    length: int  # q
    slots: torch.Tensor  # (L,) int64: flat cache slots of its context, this chunk included
    allowed: torch.Tensor  # (q, L) bool: query i (position L - q + i) sees keys up to it


@dataclass(frozen=True)
class StepIndex:
    """The reads of one step: its one-token rows together, each prompt chunk alone."""

    decode: DecodeIndex | None  # the one-token rows; None if there are none
    decode_tokens: torch.Tensor | None  # (B,) their positions among the step's tokens
    chunks: tuple[ChunkIndex, ...]

    @classmethod
    def build(cls, meta: AttentionMetadata, block_size: int) -> StepIndex:
        if meta.is_decode_only:
            return cls(DecodeIndex.build(meta, block_size), None, ())
        rows = [i for i, q in enumerate(meta.query_lens_host) if q == 1]
        decode = tokens = None
        if rows:
            picked = torch.tensor(rows, device=meta.block_tables.device)
            longest = max(meta.context_lens_host[i] for i in rows)
            tables, lens = meta.block_tables[picked], meta.context_lens[picked]
            decode = DecodeIndex.of_rows(tables, lens, longest, block_size)
            tokens = meta.query_start[picked].long()
        return cls(decode, tokens, tuple(_chunks(meta, block_size)))


def _chunks(meta: AttentionMetadata, block_size: int) -> list[ChunkIndex]:
    chunks, start = [], 0
    for i, (q, ctx) in enumerate(zip(meta.query_lens_host, meta.context_lens_host, strict=True)):
        if q > 1:
            positions = torch.arange(ctx, device=meta.block_tables.device)  # (L,)
            slots = meta.block_tables[i].long()[positions // block_size] * block_size
            allowed = positions[None, :] <= positions[ctx - q :, None]  # (q, L)
            chunks.append(ChunkIndex(start, q, slots + positions % block_size, allowed))
        start += q
    return chunks


def gather_contexts(
    cache: KVCache,  # (num_blocks, block_size, num_kv_heads, head_dim)
    index: DecodeIndex,
    dtype: torch.dtype | None = None,  # another format is read back as this (the query's)
) -> torch.Tensor:  # (B, L, num_kv_heads, head_dim)
    """Each one-token row's context, padded to the longest: one gather of exactly its slots."""
    shape = (index.batch, index.length, *cache.shape[2:])
    return read_slots(cache, index.slots, dtype).view(shape)


def attend_contexts(
    query: torch.Tensor,  # (B, num_heads, head_dim): one query token per request
    k: torch.Tensor,  # (B, L, num_kv_heads, head_dim), as gather_contexts returns them
    v: torch.Tensor,
    index: DecodeIndex,
    scale: float,
) -> torch.Tensor:  # (B, num_heads, head_dim)
    out = torch.nn.functional.scaled_dot_product_attention(
        query.unsqueeze(2),  # (B, H, 1, D)
        k.transpose(1, 2),  # (B, Hkv, L, D)
        v.transpose(1, 2),
        attn_mask=index.visible,
        scale=scale,
        enable_gqa=True,  # each group of query heads reads its shared KV head
    )
    return out.reshape(query.shape)


def decode_attention(
    query: torch.Tensor,  # (B, num_heads, head_dim): one query token per request
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    index: DecodeIndex,
    scale: float,
) -> torch.Tensor:  # (B, num_heads, head_dim)
    k = gather_contexts(k_cache, index, query.dtype)
    v = gather_contexts(v_cache, index, query.dtype)
    return attend_contexts(query, k, v, index, scale)


def step_attention(
    query: torch.Tensor,  # (T, num_heads, head_dim): the step's tokens, row after row
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    index: StepIndex,
    scale: float,
) -> torch.Tensor:  # (T, num_heads, head_dim)
    if not index.chunks:
        return decode_attention(query, k_cache, v_cache, index.decode, scale)
    out = torch.empty_like(query)
    if index.decode is not None:
        rows = query.index_select(0, index.decode_tokens)
        out[index.decode_tokens] = decode_attention(rows, k_cache, v_cache, index.decode, scale)
    for chunk in index.chunks:
        k = read_slots(k_cache, chunk.slots, query.dtype).transpose(0, 1)  # (Hkv, L, D)
        v = read_slots(v_cache, chunk.slots, query.dtype).transpose(0, 1)
        span = slice(chunk.start, chunk.start + chunk.length)
        # A batch of one, 4-D: on CPU only 4-D inputs reach torch's fused (flash) kernel;
        # 3-D ones fall back to the unfused math path, which in bf16 took 2.7x as long for
        # a 32-token chunk and 8.7x for a 512-token one (docs/performance.md).
        o = torch.nn.functional.scaled_dot_product_attention(
            query[span].transpose(0, 1)[None],  # (1, H, q, D)
            k[None],
            v[None],
            attn_mask=chunk.allowed,
            scale=scale,
            enable_gqa=True,
        )
        out[span] = o[0].transpose(0, 1)
    return out
