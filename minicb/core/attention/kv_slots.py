"""Tokens into and out of the paged KV cache, by flat slot.

A layer's cache, ``(num_blocks, block_size, num_kv_heads, head_dim)``, viewed as one long
row of slots: slot ``s`` is block ``s // block_size``, row ``s % block_size``, so one flat
index addresses any token and a step's tokens are written, or its contexts read, with one
``index_copy_`` or ``index_select`` each. The slots come from the block tables
(``AttentionMetadata.slot_mapping`` for writes, ``StepIndex`` for reads): this is where
paging meets the tensors.

A plain layer is that tensor, read and written here as it is. A layer in another format
(kv_layer.py; the 8-bit one in minicb/quant/) writes and reads itself by the same flat
slots, and the functions below hand it the work: what it is written it stores in its own
form, and what is read comes back in the dtype asked for, never the whole cache at once.
"""

from __future__ import annotations

import torch

from minicb.core.attention.kv_layer import KVCache


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


def write_slots(cache: KVCache, slots: torch.Tensor, x: torch.Tensor) -> None:
    """Write row i of ``x`` (T, num_kv_heads, head_dim) to flat cache slot ``slots[i]``
    (block ``slot // block_size``, row ``slot % block_size``)."""
    if not isinstance(cache, torch.Tensor):
        cache.write(slots, x)
        return
    cache.view(-1, *cache.shape[2:]).index_copy_(0, slots, x.to(cache.dtype))


def read_slots(cache: KVCache, slots: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """The rows at flat slots ``slots`` (N,) -> (N, num_kv_heads, head_dim): a plain layer's
    as they are, another format's in ``dtype`` (the query's)."""
    if not isinstance(cache, torch.Tensor):
        assert dtype is not None, "a layer in another format is read back in a dtype"
        return cache.read(slots, dtype)
    return cache.flatten(0, 1).index_select(0, slots)


def read_blocks(cache: KVCache, blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Whole blocks ``blocks`` (any index shape) -> (..., block_size, heads, head_dim)."""
    if not isinstance(cache, torch.Tensor):
        return cache.read_blocks(blocks, dtype)
    return cache[blocks]
