"""Sampler: one new token per request that finished its uncomputed tokens this step.

Greedy rows take the argmax. Sampled rows apply temperature, top-k and top-p, then draw.
A request with a ``seed`` draws its n-th token from a generator seeded by (seed, n), so
its tokens do not depend on which other requests share the batch, nor on preemption.
"""

from __future__ import annotations

import torch

from minicb.config import SamplingParams


def _token_generator(seed: int, token_index: int, device: torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed((seed * 1_000_003 + token_index) % (2**63))
    return gen


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k and top-p on one row of fp32 logits (vocab,)."""
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens ranked above it already cover top_p of the mass.
        drop = probs.cumsum(-1) - probs >= params.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(0, order, sorted_logits)
    return logits


def sample(
    logits: torch.Tensor,  # (N, vocab) fp32, one row per sampling request
    params: list[SamplingParams],
    num_output_tokens: list[int],
    generator: torch.Generator,
) -> list[int]:
    tokens = logits.argmax(dim=-1).tolist()
    for i, p in enumerate(params):
        if p.greedy:
            continue
        probs = filter_logits(logits[i], p).softmax(-1)
        gen = (
            generator
            if p.seed is None
            else _token_generator(p.seed, num_output_tokens[i], logits.device)
        )
        tokens[i] = int(torch.multinomial(probs, 1, generator=gen).item())
    return tokens
