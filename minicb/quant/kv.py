"""The 8-bit KV cache: its two formats, quantize/dequantize, and where the scales live.

Why: a continuous-batching engine holds as many requests as its KV pool has blocks for, so
the bytes of one cached token bound the batch. Storing keys and values in one byte instead
of two (bf16) or four (fp32) lets the same memory hold about twice (or four times) the
blocks, hence about twice the requests; the price is a small rounding error in every key
and value the attention reads back.

The formats (``kv_cache_dtype``, settings.py):
  "auto"  the model's compute dtype, no scale (the engine as it always was)
  "int8"  q = round(x / s) in [-127, 127], s = amax / 127, symmetric (no zero point:
          keys and values are centred near 0, and a zero point would cost a second number)
  "fp8"   q = float8_e4m3fn(x / s), s = amax / 448 (448 is e4m3's largest value). fp8
          keeps 3 mantissa bits at every magnitude, so small entries beside a large one
          keep their relative precision; int8 has an even grid, finer near the top
Either way a value is read back as ``q * s`` in the compute dtype, inside the attention
kernel ("dequantize on read"), so no full-precision copy of the cache is ever made.

How it enters the engine: through the core's KV layer seam (minicb/core/attention/
kv_layer.py). ``EightBitKV`` is the format the pool allocates (values and scales, one
block id for both), and each layer is a ``QuantizedCache`` that writes and reads itself by
flat slot, which is all the torch backend and the reference ask of it; the Triton kernels
do the same inside store_kv.py and the attention kernels. minicb/quant/__init__.py
registers "int8" and "fp8" under ``kv_cache_dtype``.

The scale granularity: ONE fp32 scale per token per KV head, over its ``head_dim`` values
(``amax`` is the largest |value| of that token's head). Why not one per block, as a
per-tensor or per-block scheme would have it:
  - A token's scale is known the moment the token is written, by the store path that writes
    it. A per-block scale would change as the block fills (a later token with a larger
    value raises ``amax``), and every earlier token of the block would have to be
    re-quantised, or the scale fixed before the data is seen (calibration).
  - The scales live beside the values in the same block geometry, pool
    ``(num_layers, 2, num_blocks, block_size, num_kv_heads)`` next to the values'
    ``(..., head_dim)``. Whatever moves a block (swap out and in, a copy to another pool)
    moves its scales by the same block index, and a block shared by prefix caching is
    shared with its scales: nothing special anywhere else.
  - Outliers stay local: one token with a large key costs precision on that token only.
  - The cost: 4 bytes per ``head_dim`` values, 6.25 % at head_dim 64 (1.0625 bytes a value
    against 2 for bf16, so 1.88x the blocks; 3.76x against fp32). A per-block scale would
    cost almost nothing, and fp16 scales would halve it; neither is worth the above.

The error bound (what tests/quant/ checks): int8 rounds to the nearest step, so
``|x - q*s| <= s/2`` (plus the float error of the division); e4m3 keeps 3 mantissa bits,
so ``|x - q*s| <= 2^-4 |x|`` when it rounds to nearest (2^-3 where it truncates, as
Triton's CPU interpreter does), and ``2^-10 s`` near zero (its subnormal step is 2^-9).

Rounding: int8 rounds half away from zero (``trunc(x + copysign(0.5, x))``), which the
Triton store kernel can do with the same two operations, so both backends write the same
bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from minicb.core.attention.kv_layer import PartSpec

# The storage dtype and the largest magnitude it holds, per 8-bit format.
FORMATS: dict[str, tuple[torch.dtype, float]] = {
    "int8": (torch.int8, 127.0),
    "fp8": (torch.float8_e4m3fn, 448.0),
}
SCALE_DTYPE = torch.float32
# A head whose values are all (nearly) zero gets this amax, so its scale is never 0.
MIN_AMAX = 1e-6


@dataclass(frozen=True)
class EightBitKV:
    """The KV format for ``kv_cache_dtype`` int8 or fp8 (``KVFormat`` in the core): a block
    row's values in 8 bits, and beside them one fp32 scale per token and KV head."""

    name: str  # a key of FORMATS

    def parts(self, block: tuple[int, int, int], compute_dtype: torch.dtype) -> list[PartSpec]:
        """(values (block_size, heads, head_dim) in 8 bits, scales (block_size, heads))."""
        return [(block, FORMATS[self.name][0]), (block[:-1], SCALE_DTYPE)]

    def layer(self, parts: tuple[torch.Tensor, ...]) -> QuantizedCache:
        return QuantizedCache(*parts)


class QuantizedCache(NamedTuple):
    """One layer's keys (or values) in 8 bits: what the attention backends receive in place
    of a plain cache tensor when ``kv_cache_dtype`` is int8 or fp8 (a ``KVLayer``)."""

    data: torch.Tensor  # (num_blocks, block_size, num_kv_heads, head_dim) int8 or fp8
    scale: torch.Tensor  # (num_blocks, block_size, num_kv_heads) fp32: one per token/head

    @property
    def shape(self) -> torch.Size:
        """The values' shape, so code that reads ``cache.shape`` works on either kind."""
        return self.data.shape

    def write(self, slots: torch.Tensor, x: torch.Tensor) -> None:
        """Row i of ``x`` (T, num_kv_heads, head_dim), quantised, into flat slot
        ``slots[i]`` (block ``slot // block_size``, row ``slot % block_size``)."""
        data, scale = quantize(x, self.data.dtype)
        # index_copy_ has no fp8 kernel on CPU: copy the bytes (same size, same bits).
        flat = self.data.view(torch.uint8).view(-1, *self.shape[2:])
        flat.index_copy_(0, slots, data.view(torch.uint8))
        self.scale.view(-1, self.shape[2]).index_copy_(0, slots, scale)

    def read(self, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The rows at flat slots ``slots`` (N,), dequantised: (N, num_kv_heads, head_dim)."""
        data = self.data.flatten(0, 1).index_select(0, slots)
        return dequantize(data, self.scale.flatten(0, 1).index_select(0, slots), dtype)

    def read_blocks(self, blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Whole blocks ``blocks`` (any index shape), dequantised: (..., block_size, heads,
        head_dim)."""
        return dequantize(self.data[blocks], self.scale[blocks], dtype)


def qmax_of(dtype: torch.dtype) -> float:
    """The largest magnitude the 8-bit storage ``dtype`` holds."""
    for storage, qmax in FORMATS.values():
        if storage == dtype:
            return qmax
    raise ValueError(f"{dtype} is not an 8-bit KV format; known: {', '.join(FORMATS)}")


def quantize(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (..., head_dim) -> (values in ``dtype``, fp32 scales (...)): one scale per row."""
    qmax = qmax_of(dtype)
    x = x.float()
    scale = x.abs().amax(dim=-1).clamp_min(MIN_AMAX) / qmax
    scaled = (x / scale.unsqueeze(-1)).clamp(-qmax, qmax)
    if dtype == torch.int8:
        return torch.trunc(scaled + torch.copysign(torch.full_like(scaled, 0.5), scaled)).to(
            dtype
        ), scale
    return scaled.to(dtype), scale


def dequantize(data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(values (..., head_dim), scales (...)) -> ``q * s`` in ``dtype``."""
    return (data.float() * scale.unsqueeze(-1)).to(dtype)
