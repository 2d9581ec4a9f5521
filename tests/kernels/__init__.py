"""Shared builders for the kernel tests: random paged caches and the tolerances per dtype.

Tests run on CUDA when there is one, otherwise on CPU under the Triton interpreter
(tests/conftest.py sets TRITON_INTERPRET=1 before triton is imported). The interpreter
runs programs one by one in Python, so cases keep batches and head counts small.
"""

from __future__ import annotations

import random

import torch

from minicb.core.attention.backend import AttentionMetadata

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

# (atol, rtol) against the fp32 reference. Both sides round the same fp32 result to the
# output dtype (one ulp: 2^-11 for fp16, 2^-8 for bf16, relative); on a GPU the kernels also
# round the softmax weights to the K/V dtype before the P@V product, as flash attention does,
# and the interpreter truncates fp32 -> bf16 instead of rounding (up to one ulp more).
TOLERANCES = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}

# Written to every cache row no request owns (tails of partial blocks, block 0, spare
# blocks): a kernel that reads past a context or through a padded table entry sees huge
# keys that would swamp its softmax. Finite, so the reference's masked sums stay finite.
POISON = 1000.0

GQA_SHAPES = [(9, 3), (4, 1), (8, 8)]  # (num_heads, num_kv_heads)


def make_paged_case(
    query_lens: list[int],
    context_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Random query (T, H, D), K/V caches and metadata, with blocks scattered at random."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    blocks_per_req = [-(-n // block_size) for n in context_lens]
    num_blocks = 1 + sum(blocks_per_req) + 2  # block 0 and two spares stay unowned
    owned = list(range(1, num_blocks))
    rng.shuffle(owned)  # tables point all over the cache, not in order
    tables, slots = [], []
    for n_blocks, q_len, ctx in zip(blocks_per_req, query_lens, context_lens, strict=True):
        table = [owned.pop() for _ in range(n_blocks)]
        tables.append(table)
        # This step's tokens are the last q_len positions of the context.
        slots += [
            table[p // block_size] * block_size + p % block_size for p in range(ctx - q_len, ctx)
        ]
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, POISON)
    v_cache = torch.full(shape, POISON)
    for table, ctx in zip(tables, context_lens, strict=True):
        flat_k = k_cache[table].flatten(0, 1)  # (n_blocks * block_size, Hkv, D) copy
        flat_v = v_cache[table].flatten(0, 1)
        flat_k[:ctx] = torch.randn((ctx, num_kv_heads, head_dim), generator=gen)
        flat_v[:ctx] = torch.randn((ctx, num_kv_heads, head_dim), generator=gen)
        k_cache[table] = flat_k.view(-1, block_size, num_kv_heads, head_dim)
        v_cache[table] = flat_v.view(-1, block_size, num_kv_heads, head_dim)
    query = torch.randn((sum(query_lens), num_heads, head_dim), generator=gen)
    meta = AttentionMetadata.build(query_lens, context_lens, tables, slots, DEVICE)
    return (
        query.to(DEVICE, dtype),
        k_cache.to(DEVICE, dtype),
        v_cache.to(DEVICE, dtype),
        meta,
    )
