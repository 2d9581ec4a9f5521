"""KVPool: the paged KV cache's memory, in whatever format ``kv_cache_dtype`` names.

A pool is the tensors of its format (``parts``, minicb/core/attention/kv_layer.py), each of
shape ``(num_layers, 2, num_blocks, ...)`` (2: keys, values) followed by that part's block
row: for the plain format one part, the values ``(block_size, num_kv_heads, head_dim)`` in
the compute dtype; an 8-bit format adds its scales beside them. Every part is indexed by
the same block id, so a block is the same slice of each: whatever moves a block moves all
of it (``copy_blocks``), and the block manager, which deals in block ids only, never knows
what a format keeps.

The runner holds one pool on the device and one in host memory for swapped-out blocks.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from minicb.core.attention.kv_layer import KVCache, KVFormat, kv_format


@dataclass(frozen=True)
class KVPool:
    parts: tuple[torch.Tensor, ...]  # each (num_layers, 2, num_blocks, *its block row)
    kv_format: KVFormat  # what the parts hold, and how a layer is made of them

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
        fmt = kv_format(kv_cache_dtype)
        parts = tuple(
            zeroed((num_layers, 2, num_blocks, *row), dtype, device, pin_memory)
            for row, dtype in fmt.parts(block, compute_dtype)
        )
        return cls(parts, fmt)

    @property
    def values(self) -> torch.Tensor:
        """The keys' and values' own numbers: (num_layers, 2, num_blocks, *block row)."""
        return self.parts[0]

    @property
    def num_blocks(self) -> int:
        return self.values.shape[2]

    def layers(self) -> list[tuple[KVCache, KVCache]]:
        """Per layer (k_cache, v_cache), views into the pool, as the attention backends take
        them: plain tensors, or the format's layer objects."""

        def view(layer: int, kv: int) -> KVCache:  # kv 0: the keys, 1: the values
            return self.kv_format.layer(tuple(part[layer, kv] for part in self.parts))

        return [(view(layer, 0), view(layer, 1)) for layer in range(self.values.shape[0])]


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
    """Bytes one block takes in every layer, keys and values, in every part of its format."""
    parts = kv_format(kv_cache_dtype).parts(block, compute_dtype)
    return 2 * num_layers * sum(math.prod(row) * dtype.itemsize for row, dtype in parts)


def copy_blocks(src: KVPool, dst: KVPool, pairs: Sequence[tuple[int, int]]) -> None:
    """Copy block ``s`` of ``src`` into block ``d`` of ``dst`` for every (s, d) in ``pairs``,
    in every layer, keys and values, in every part: THE way a block moves between pools
    (device and host, either way), so no copy can leave a part of a block behind."""
    if not pairs:
        return
    assert src.kv_format == dst.kv_format, "blocks move between pools of one KV format"
    src_ids, dst_ids = (list(ids) for ids in zip(*pairs, strict=True))
    for source, target in zip(src.parts, dst.parts, strict=True):
        # Advanced indexing has no fp8 kernels on CPU: move the bytes (same size, same bits).
        if source.element_size() == 1:
            source, target = source.view(torch.uint8), target.view(torch.uint8)
        target[:, :, dst_ids] = source[:, :, src_ids].to(target.device)
