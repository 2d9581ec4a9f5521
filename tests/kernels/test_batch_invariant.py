"""Batch-invariant arithmetic (minicb/kernels/batch_invariant.py): a token's output is the
same bits whatever else the step holds, and the same numbers (to rounding) as the reference.

The end-to-end form, greedy tokens under an 8-bit KV cache alone, batched, chunked and
preempted on the default model, is tests/quant/test_kv_batch_variance.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from minicb import LLM, EngineConfig
from minicb.core.attention import reference
from minicb.core.attention.backend import AttentionMetadata
from minicb.kernels.batch_invariant import (
    ROW_TILE,
    BatchInvariantBackend,
    RowTiledLinear,
    tile_linears,
)
from minicb.quant.kv import FORMATS, QuantizedCache, quantize

from . import GQA_SHAPES, make_paged_case

MIXED = ([1, 7, 1, 5, 1], [9, 7, 33, 37, 1])  # decodes beside a first chunk and a later one


def sub_step(meta: AttentionMetadata, picks: list[tuple[int, int, int]]) -> AttentionMetadata:
    """A step over the same caches holding only ``(request, query_len, context_len)`` rows."""
    tables, lens, slots = [], [], []
    block_size = 4
    for i, q, ctx in picks:
        table = meta.block_tables[i].tolist()
        tables.append(table)
        lens.append(q)
        slots += [table[p // block_size] * block_size + p % block_size for p in range(ctx - q, ctx)]
    contexts = [ctx for _, _, ctx in picks]
    return AttentionMetadata.build(lens, contexts, tables, slots, meta.block_tables.device)


def token_rows(meta: AttentionMetadata, request: int) -> slice:
    start = int(meta.query_start[request])
    return slice(start, start + meta.query_lens_host[request])


@pytest.mark.parametrize("heads", GQA_SHAPES, ids=lambda h: f"{h[0]}:{h[1]}")
@pytest.mark.parametrize("kv", ["auto", *FORMATS])
def test_a_tokens_attention_is_the_same_bits_in_any_step(heads, kv):
    query, k_cache, v_cache, meta = make_paged_case(*MIXED, *heads, 32, 4, torch.float32)
    if kv != "auto":
        k_cache, v_cache = (
            QuantizedCache(*quantize(c, FORMATS[kv][0])) for c in (k_cache, v_cache)
        )
    scale = 32**-0.5
    whole = BatchInvariantBackend().attention(query, k_cache, v_cache, meta, scale)
    # The reference over the same (dequantised) cache: the same attention, to rounding.
    if kv == "auto":
        ref = reference.paged_attention(query, k_cache, v_cache, meta, scale)
        torch.testing.assert_close(whole, ref, atol=1e-5, rtol=1e-5)
    # Request 2's decode row alone, and request 3's five prompt tokens as chunks of 2 and 3,
    # each in a step of its own: bitwise what they were beside the others.
    alone = sub_step(meta, [(2, 1, 33)])
    out = BatchInvariantBackend().attention(
        query[token_rows(meta, 2)], k_cache, v_cache, alone, scale
    )
    assert torch.equal(out, whole[token_rows(meta, 2)])
    rows = whole[token_rows(meta, 3)]
    first, second = sub_step(meta, [(3, 2, 34)]), sub_step(meta, [(3, 3, 37)])
    q3 = query[token_rows(meta, 3)]
    a = BatchInvariantBackend().attention(q3[:2], k_cache, v_cache, first, scale)
    b = BatchInvariantBackend().attention(q3[2:], k_cache, v_cache, second, scale)
    assert torch.equal(torch.cat([a, b]), rows)


def test_a_row_of_a_tiled_linear_is_the_same_bits_in_any_batch():
    torch.manual_seed(0)
    plain = nn.Linear(576, 1536)
    tiled = RowTiledLinear(plain)
    x = torch.randn(3 * ROW_TILE + 5, 576)
    row = x[4]
    for rows in (1, 3, 5, 9, ROW_TILE, 37, len(x)):
        batch = torch.cat([row[None], x[: rows - 1]])  # the row first, then others
        out = tiled(batch)
        assert out.shape == (rows, 1536)
        assert torch.equal(out[0], tiled(row[None])[0]), rows
        torch.testing.assert_close(out, plain(batch), atol=1e-5, rtol=1e-5)
    shuffled = torch.cat([x[:20], row[None]])  # the row at position 20 of 21
    assert torch.equal(tiled(shuffled)[20], tiled(row[None])[0])


def test_every_linear_of_the_model_is_tiled_once(tiny_llama_dir):
    llm = LLM(model=tiny_llama_dir, dtype="float32", batch_invariant=True, num_kv_blocks=16)
    model = llm.engine.runner.model
    tiled = [m for m in model.modules() if isinstance(m, RowTiledLinear)]
    plain = [m for m in model.modules() if type(m) is nn.Linear]
    assert len(tiled) == len(plain) == 7 * model.cfg.num_layers + 1  # and the LM head
    assert tile_linears(model) == 0  # already wrapped: nothing wrapped twice
    assert llm.engine.runner.describe()["attention_reason"].startswith("batch_invariant")


def test_batch_invariant_is_refused_where_it_is_not_built(tiny_llama_dir):
    with pytest.raises(ValueError, match="attention_backend torch or auto"):
        EngineConfig.from_kwargs(batch_invariant=True, attention_backend="triton")
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        EngineConfig.from_kwargs(batch_invariant=True, tensor_parallel_size=2)
    plain = LLM(model=tiny_llama_dir, dtype="float32", num_kv_blocks=16)
    config = plain.engine.config.with_(batch_invariant=True)
    with pytest.raises(ValueError, match="batch_invariant and plain"):
        plain.engine.runner.with_config(config)
