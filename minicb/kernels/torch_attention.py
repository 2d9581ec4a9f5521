"""The torch backend's decode attention: gather indices built once per step, not per layer.

The reference (``minicb.kernels.reference``) gathers every block of every request into a
padded copy, and builds the padding mask, in every layer. Everything but the gather itself
depends only on the step's metadata, which all layers share: the flat cache slot of each
context token and the mask. ``DecodeIndex`` holds those, built by the first layer and
reused by the rest; each layer then does one ``index_select`` of exactly the context tokens
(not whole blocks) from the cache viewed as a flat row of slots, and one SDPA call. The
reference stays the definition; tests/kernels/test_torch_attention.py checks they agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from minicb.kernels.attention import AttentionMetadata


@dataclass(frozen=True)
class DecodeIndex:
    """What every layer of one decode step needs to read its requests' contexts."""

    slots: torch.Tensor  # (B * L,) int64: flat cache slot of context token j of request i
    visible: torch.Tensor  # (B, 1, 1, L) bool: j < context_lens[i] (L = longest context)
    batch: int
    length: int

    @classmethod
    def build(cls, meta: AttentionMetadata, block_size: int) -> DecodeIndex:
        length = meta.max_context_len
        positions = torch.arange(length, device=meta.block_tables.device)  # (L,)
        blocks = meta.block_tables.long()[:, positions // block_size]  # (B, L)
        slots = blocks * block_size + positions % block_size
        visible = positions[None, :] < meta.context_lens.long()[:, None]  # (B, L)
        # Past a request's context the table is padded with block 0: a real slot whose
        # (masked) values are read, so the gather needs no bounds check.
        return cls(slots.flatten(), visible[:, None, None, :], meta.num_requests, length)


def decode_attention(
    query: torch.Tensor,  # (B, num_heads, head_dim): one query token per request
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    index: DecodeIndex,
    scale: float,
) -> torch.Tensor:  # (B, num_heads, head_dim)
    shape = (index.batch, index.length, *k_cache.shape[2:])  # (B, L, Hkv, D)
    k = k_cache.flatten(0, 1).index_select(0, index.slots).view(shape).transpose(1, 2)
    v = v_cache.flatten(0, 1).index_select(0, index.slots).view(shape).transpose(1, 2)
    out = torch.nn.functional.scaled_dot_product_attention(
        query.unsqueeze(2),  # (B, H, 1, D)
        k,  # (B, Hkv, L, D)
        v,
        attn_mask=index.visible,
        scale=scale,
        enable_gqa=True,  # each group of query heads reads its shared KV head
    )
    return out.reshape(query.shape)
