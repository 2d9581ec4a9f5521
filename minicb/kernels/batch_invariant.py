"""Batch-invariant arithmetic: a token's numbers never depend on the batch it ran in.

Continuous batching puts a token beside different neighbours every iteration: in a batch of
one or of 200, in a prompt chunk of 32 or of 512. Mathematically its row of every product is
the same; in floating point it is not, because the kernels choose how to sum by the shape
they are given. Measured on a 2-core CPU (torch 2.13, fp32): a row of ``F.linear(x)`` has
the same bits whether x holds 4, 8, 12 or 13 and more rows, and other bits at 1 to 3 rows (a
matrix-vector kernel, another summation order) and, with two threads, at 5 to 7 and 9 to 11
(with one, only at 1 to 3); SDPA's sum over a token's keys changes with the longest context
in the step (keys are padded to it) and with where a prompt chunk starts. In fp32 those
last-bit differences almost never change a greedy token. Under an 8-bit KV cache they do: a
key that lands on a rounding boundary of ``round(x / scale)`` moves by a whole step of the
scale, and the tokens of a prompt run alone and in a batch part
(tests/quant/test_kv_batch_variance.py).

``batch_invariant=True`` (EngineConfig; ``--batch-invariant``) removes the dependence by
construction, the idea of Thinking Machines' "Defeating Nondeterminism in LLM Inference"
(2025) and vLLM's batch-invariant mode, here in plain torch:

- **Linears in fixed tiles of ROW_TILE rows.** The rows are padded to a multiple of the tile
  and every product is called on exactly one tile shape, so every token's row takes the same
  kernel, the same thread split and the same summation order, wherever it sits in the batch
  (that one shape treats each of its rows alike, wherever it sits, is what
  tests/kernels/test_batch_invariant.py checks on the machine at hand).
- **Attention for each token alone, over its own keys, in fixed tiles of KEY_TILE keys, in
  order.** Each query token reads exactly the keys it may see (0 .. its position), tile by
  tile with a running softmax (max, rescale, sum). A tile's sums run over fixed dimensions
  (head_dim for the scores, KEY_TILE for the weighted values), so their order does not
  depend on how many tokens are in the step; tiles past a token's last key are fully masked
  and add exact zeros. A decode row and a prompt token are the same case, so chunk size,
  prefix-cache hits and recomputation after preemption cannot change a token either.

RMSNorm, RoPE, the embedding and the element-wise ops already work row by row. The price is
speed (a decode step of the default model on this CPU: see docs/performance.md): it is a
mode for exactness, not the default. Torch attention only (a Triton kernel would need the
same fixed tiling), and one process (tensor_parallel_size 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from minicb.core.attention.backend import AttentionMetadata, TorchBackend
from minicb.core.attention.kv_slots import read_slots
from minicb.packing.packed import PackedLinear
from minicb.quant.weights import Int8Linear

ROW_TILE = 16  # rows per product: a decode batch up to 16 takes one call
KEY_TILE = 64  # keys per attention tile


class RowTiledLinear(nn.Module):
    """A linear layer (plain, packed or int8) applied ROW_TILE rows at a time, zero-padded."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, in) -> (T, out)
        rows = x.shape[0]
        padded = -(-rows // ROW_TILE) * ROW_TILE
        if padded != rows:
            x = torch.cat([x, x.new_zeros(padded - rows, x.shape[1])])
        return torch.cat([self.inner(tile) for tile in x.split(ROW_TILE)])[:rows]


def tile_linears(model: nn.Module) -> int:
    """Wrap every linear layer of ``model`` (the LM head too) in RowTiledLinear; how many."""
    linears = (nn.Linear, PackedLinear, Int8Linear)
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, linears) and not isinstance(parent, RowTiledLinear)
    ]
    for parent, name, child in targets:
        setattr(parent, name, RowTiledLinear(child))
    return len(targets)


class RowTiles:
    """The row-tiled weight form at the model build's seam (minicb/core/runner/wrappers.py):
    ``batch_invariant``. Last of the forms: it wraps whichever linears the model holds."""

    unshareable = "cannot share weights between batch_invariant and plain engines"

    def fits(self, device: torch.device, dtype: torch.dtype) -> bool:
        return True

    def apply(self, model: nn.Module) -> None:
        tile_linears(model)

    def held_by(self, model: nn.Module) -> bool:
        return any(isinstance(m, RowTiledLinear) for m in model.modules())

    def describe(self) -> dict[str, str]:
        return {}  # the attention backend's reason says batch_invariant


@dataclass(frozen=True)
class TokenIndex:
    """For each of the step's T query tokens, the cache slots of the keys it may see."""

    slots: torch.Tensor  # (T, L) int64, L a multiple of KEY_TILE; slot 0 past the token's keys
    visible: torch.Tensor  # (T, L) bool: key j is at or before the token's position

    @classmethod
    def build(cls, meta: AttentionMetadata, block_size: int) -> TokenIndex:
        device = meta.block_tables.device
        owner, position = [], []  # per token: its request's row, its absolute position
        for i, (q, ctx) in enumerate(
            zip(meta.query_lens_host, meta.context_lens_host, strict=True)
        ):
            owner += [i] * q
            position += range(ctx - q, ctx)
        owner_t = torch.tensor(owner, dtype=torch.long, device=device)
        pos_t = torch.tensor(position, dtype=torch.long, device=device)
        length = -(-(max(position, default=0) + 1) // KEY_TILE) * KEY_TILE
        keys = torch.arange(length, device=device)
        visible = keys[None, :] <= pos_t[:, None]  # (T, L)
        blocks = meta.block_tables.long()[owner_t][
            :, (keys // block_size).clamp(max=meta.block_tables.shape[1] - 1)
        ]
        slots = blocks * block_size + keys % block_size
        return cls(torch.where(visible, slots, 0), visible)


def attend_each_token(
    query: torch.Tensor,  # (T, num_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim) or 8-bit pair
    v_cache: torch.Tensor,
    index: TokenIndex,
    scale: float,
) -> torch.Tensor:  # (T, num_heads, head_dim)
    """Each token over its own keys, KEY_TILE at a time, with a running softmax."""
    tokens, heads, dim = query.shape
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    q = query.reshape(tokens, kv_heads, group, 1, dim)
    best = query.new_full((tokens, kv_heads, group, 1), float("-inf"))
    total = query.new_zeros(best.shape)
    acc = query.new_zeros((tokens, kv_heads, group, dim))
    shape = (tokens, KEY_TILE, kv_heads, dim)
    for start in range(0, index.slots.shape[1], KEY_TILE):
        slots = index.slots[:, start : start + KEY_TILE].flatten()
        k = read_slots(k_cache, slots, query.dtype).view(shape).transpose(1, 2).contiguous()
        v = read_slots(v_cache, slots, query.dtype).view(shape).permute(0, 2, 3, 1).contiguous()
        # Every sum below runs over the innermost, contiguous axis of a fixed length
        # (head_dim, then the tile's keys): the same loop for every token, whatever T is.
        scores = (q * k[:, :, None]).sum(-1) * scale  # (T, Hkv, G, KEY_TILE)
        seen = index.visible[:, None, None, start : start + KEY_TILE]
        scores = scores.masked_fill(~seen, float("-inf"))
        # Tile 0 always holds key 0, so ``best`` is finite from the first tile on, and a
        # fully masked later tile rescales by exp(0) = 1 and adds zeros: exact no-ops.
        new_best = torch.maximum(best, scores.amax(-1, keepdim=True))
        rescale = torch.exp(best - new_best)
        weights = torch.exp(scores - new_best)  # (T, Hkv, G, KEY_TILE)
        total = total * rescale + weights.sum(-1, keepdim=True)
        values = (weights[:, :, :, None] * v[:, :, None]).sum(-1)  # (T, Hkv, G, D)
        acc = acc * rescale + values
        best = new_best
    return (acc / total).reshape(tokens, heads, dim)


class BatchInvariantBackend(TorchBackend):
    """The torch backend's store, with attend_each_token for attention."""

    def __init__(self) -> None:
        super().__init__("batch_invariant: each token attends alone, in fixed key tiles")
        self._tokens: tuple[AttentionMetadata, TokenIndex] | None = None

    def attention(self, query, k_cache, v_cache, meta, scale) -> torch.Tensor:
        if self._tokens is None or self._tokens[0] is not meta:  # built once per step
            self._tokens = (meta, TokenIndex.build(meta, k_cache.shape[1]))
        return attend_each_token(query, k_cache, v_cache, self._tokens[1], scale)
