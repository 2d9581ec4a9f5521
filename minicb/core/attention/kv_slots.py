"""Tokens into and out of the paged KV cache, by flat slot, in either of its formats.

A layer's cache, ``(num_blocks, block_size, num_kv_heads, head_dim)``, viewed as one long
row of slots: slot ``s`` is block ``s // block_size``, row ``s % block_size``, so one flat
index addresses any token and a step's tokens are written, or its contexts read, with one
``index_copy_`` or ``index_select`` each. The slots come from the block tables
(``AttentionMetadata.slot_mapping`` for writes, ``StepIndex`` for reads): this is where
paging meets the tensors.

A plain cache is read and written as it is. An 8-bit cache (``QuantizedCache``,
minicb/quant/kv.py) quantises what it is given, one scale per token and KV head, and
dequantises what is read to the query's dtype: only the tokens a step touches, never the
whole cache.
"""

from __future__ import annotations

import torch

from minicb.quant.kv import QuantizedCache, dequantize, quantize


def storing(slot_mapping: torch.Tensor) -> torch.Tensor | None:
    """Which tokens store: None when all do, else a mask (static padding rows recompute a
    token and store nothing). A host sync, so the torch backend asks once per step, not in
    every layer as ``reference.store_kv`` does."""
    keep = slot_mapping >= 0
    return None if bool(keep.all()) else keep


def write_kv(key, value, k_cache, v_cache, slots: torch.Tensor, keep: torch.Tensor | None) -> None:
    """Write token i's key and value to slot ``slots[i]``: those ``keep`` marks (None: all)."""
    if keep is not None:
        slots, key, value = slots[keep], key[keep], value[keep]
    write_slots(k_cache, slots, key)
    write_slots(v_cache, slots, value)


def write_slots(cache: torch.Tensor | QuantizedCache, slots: torch.Tensor, x: torch.Tensor):
    """Write row i of ``x`` (T, num_kv_heads, head_dim) to flat cache slot ``slots[i]``
    (block ``slot // block_size``, row ``slot % block_size``), quantising if the cache is."""
    if isinstance(cache, torch.Tensor):
        cache.view(-1, *cache.shape[2:]).index_copy_(0, slots, x.to(cache.dtype))
        return
    data, scale = quantize(x, cache.data.dtype)
    # index_copy_ has no fp8 kernel on CPU: copy the bytes (same size, same bits).
    flat = cache.data.view(torch.uint8).view(-1, *cache.shape[2:])
    flat.index_copy_(0, slots, data.view(torch.uint8))
    cache.scale.view(-1, cache.shape[2]).index_copy_(0, slots, scale)


def read_slots(
    cache: torch.Tensor | QuantizedCache, slots: torch.Tensor, dtype: torch.dtype | None
) -> torch.Tensor:
    """The rows at flat slots ``slots`` (N,) -> (N, num_kv_heads, head_dim): a plain cache's
    as they are, an 8-bit cache's dequantised to ``dtype``."""
    if isinstance(cache, torch.Tensor):
        return cache.flatten(0, 1).index_select(0, slots)
    assert dtype is not None, "an 8-bit cache is read back in a dtype: pass the query's"
    data = cache.data.flatten(0, 1).index_select(0, slots)
    return dequantize(data, cache.scale.flatten(0, 1).index_select(0, slots), dtype)


def read_blocks(
    cache: torch.Tensor | QuantizedCache, blocks: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Whole blocks ``blocks`` (any index shape) -> (..., block_size, heads, head_dim)."""
    if isinstance(cache, torch.Tensor):
        return cache[blocks]
    return dequantize(cache.data[blocks], cache.scale[blocks], dtype)
