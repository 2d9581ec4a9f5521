"""KVPool: the paged KV cache's memory, values and (for an 8-bit cache) their scales.

A pool is ``values`` of shape ``(num_layers, 2, num_blocks, block_size, num_kv_heads,
head_dim)`` (2: keys, values) in the storage dtype, and, when the cache is 8-bit
(minicb/quant/kv.py), ``scales`` of shape ``(num_layers, 2, num_blocks, block_size,
num_kv_heads)`` in fp32, one per token and KV head. Both are indexed by the same block id,
so a block is the same slice of each: whatever moves a block moves both (``copy_blocks``),
and the block manager, which deals in block ids only, never knows scales exist.

The runner holds one pool on the device and one in host memory for swapped-out blocks.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from minicb.quant.kv import SCALE_DTYPE, QuantizedCache, bytes_per_token_head, storage_dtype


@dataclass(frozen=True)
class KVPool:
    values: torch.Tensor  # (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
    scales: torch.Tensor | None  # (num_layers, 2, num_blocks, block_size, num_kv_heads) fp32

    @classmethod
    def allocate(
        cls,
        num_layers: int,
        block: tuple[int, int, int],  # (block_size, num_kv_heads, head_dim)
        num_blocks: int,
        kv_cache_dtype: str,
        compute_dtype: torch.dtype,
        device: torch.device | str,
        pin_memory: bool = False,
    ) -> KVPool:
        """A zeroed pool of ``num_blocks`` blocks (``pin_memory``: page-locked host memory,
        for fast copies to and from a GPU)."""
        shape = (num_layers, 2, num_blocks, *block)
        dtype = storage_dtype(kv_cache_dtype, compute_dtype)
        values = zeroed(shape, dtype, device, pin_memory)
        scales = None
        if dtype != compute_dtype:
            scales = zeroed(shape[:-1], SCALE_DTYPE, device, pin_memory)
        return cls(values, scales)

    @property
    def num_blocks(self) -> int:
        return self.values.shape[2]

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor] | tuple[QuantizedCache, ...]]:
        """Per layer (k_cache, v_cache), views into the pool: plain tensors, or for an 8-bit
        pool ``QuantizedCache(values, scales)`` pairs, as the attention backends take them."""
        if self.scales is None:
            return [(layer[0], layer[1]) for layer in self.values]
        return [
            (QuantizedCache(v[0], s[0]), QuantizedCache(v[1], s[1]))
            for v, s in zip(self.values, self.scales, strict=True)
        ]


def zeroed(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str, pin_memory: bool
) -> torch.Tensor:
    """A tensor of zeros. In ordinary host memory, an anonymous memory mapping: the operating
    system gives it zero pages as they are first touched, so a pool of a gigabyte costs
    neither the seconds of writing every byte (torch.zeros: 3.2 s for the default model's
    pools on a 2-core Xeon, at every engine's start) nor memory for blocks never used."""
    nbytes = math.prod(shape) * dtype.itemsize
    if torch.device(device).type != "cpu" or pin_memory or nbytes == 0:
        return torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin_memory)
    # The tensor holds a reference to the mapping, which lives as long as it does.
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=torch.uint8).view(dtype).view(shape)


def bytes_per_block(
    num_layers: int,
    block: tuple[int, int, int],  # (block_size, num_kv_heads, head_dim)
    kv_cache_dtype: str,
    compute_dtype: torch.dtype,
) -> int:
    """Bytes one block takes in every layer, keys and values, scales included."""
    block_size, num_kv_heads, head_dim = block
    per_head = bytes_per_token_head(kv_cache_dtype, compute_dtype, head_dim)
    return 2 * num_layers * block_size * num_kv_heads * per_head


def copy_blocks(src: KVPool, dst: KVPool, pairs: Sequence[tuple[int, int]]) -> None:
    """Copy block ``s`` of ``src`` into block ``d`` of ``dst`` for every (s, d) in ``pairs``,
    in every layer, keys and values, and their scales: THE way a block moves between pools
    (device and host, either way), so no copy can leave a block's scales behind."""
    if not pairs:
        return
    src_ids, dst_ids = (list(ids) for ids in zip(*pairs, strict=True))
    for source, target in ((src.values, dst.values), (src.scales, dst.scales)):
        if source is None or target is None:
            assert source is None and target is None, "both pools must hold scales, or neither"
            continue
        # Advanced indexing has no fp8 kernels on CPU: move the bytes (same size, same bits).
        if source.element_size() == 1:
            source, target = source.view(torch.uint8), target.view(torch.uint8)
        target[:, :, dst_ids] = source[:, :, src_ids].to(target.device)
