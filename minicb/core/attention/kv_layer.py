"""The KV layer seam: the format one layer's keys (or values) are held in.

The core's format is the plain one: a layer is a tensor ``(num_blocks, block_size,
num_kv_heads, head_dim)`` in the compute dtype, written and read by flat slot
(kv_slots.py). In any other format a layer is an object with the methods of ``KVLayer``;
the 8-bit one (minicb/quant/kv.py) quantises what it is written and dequantises what is
read, so the attention code above it is the same for every format.

A format (``KVFormat``) also tells the pool what to allocate: the tensors that hold a block
row (``parts``: the values first, then whatever the format keeps beside them, such as a
scale per token and KV head), and how one layer's views of them become its layer. Every
part is indexed by the same block id, so moving a block moves all of it
(kv_pool.copy_blocks).

``kv_cache_dtype`` names the format in ``KV_FORMATS``: "auto" (plain) is the core's; the
others register a factory there when their package is imported (``import minicb.features``
registers them all; a name nobody registered: ``FeatureNotLoaded``, minicb/core/registry.py),
and the factory imports the format's module only when it is used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Union

from minicb.core.registry import lookup

if TYPE_CHECKING:  # the registry itself needs no torch: a feature registers for free
    import torch

# A block row of one part: (shape after the block index, dtype).
PartSpec = tuple[tuple[int, ...], "torch.dtype"]


class KVLayer(Protocol):
    """One layer's keys (or values) in a format other than the plain tensor."""

    @property
    def shape(self) -> torch.Size:  # (num_blocks, block_size, num_kv_heads, head_dim)
        ...

    def write(self, slots: torch.Tensor, x: torch.Tensor) -> None:
        """Row i of ``x`` (N, num_kv_heads, head_dim) into flat slot ``slots[i]``."""

    def read(self, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The rows at flat slots ``slots`` (N,), in ``dtype``: (N, num_kv_heads, head_dim)."""

    def read_blocks(self, blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Whole blocks (any index shape), in ``dtype``: (..., block_size, heads, head_dim)."""


# What the attention backends take for a layer: the plain tensor, or another format's layer.
KVCache = Union["torch.Tensor", KVLayer]


class KVFormat(Protocol):
    """A KV cache format, as the pool allocates it."""

    def parts(self, block: tuple[int, int, int], compute_dtype: torch.dtype) -> list[PartSpec]:
        """The tensors one block row ``(block_size, num_kv_heads, head_dim)`` is held in."""

    def layer(self, parts: tuple[torch.Tensor, ...]) -> KVCache:
        """One layer's keys (or values), from its views of those tensors."""


@dataclass(frozen=True)
class PlainKV:
    """The core's format: the compute dtype, one tensor, and that tensor is the layer."""

    def parts(self, block: tuple[int, int, int], compute_dtype: torch.dtype) -> list[PartSpec]:
        return [(block, compute_dtype)]

    def layer(self, parts: tuple[torch.Tensor, ...]) -> KVCache:
        return parts[0]


# kv_cache_dtype -> a factory of its format. "auto" is the core's; features add theirs.
KV_FORMATS: dict[str, Callable[[], KVFormat]] = {"auto": PlainKV}


def kv_format(kv_cache_dtype: str) -> KVFormat:
    """The format registered for ``kv_cache_dtype`` (``FeatureNotLoaded`` if none is)."""
    build = lookup(KV_FORMATS, "KV format", kv_cache_dtype, f"kv_cache_dtype={kv_cache_dtype!r}")
    return build()
