"""Which tokens a sampled row may draw, and how likely: temperature, top-k and top-p.

``filter_rows`` works on every sampled row of a step at once, as tensor operations, each
row by its own settings; ``filter_logits`` is the plain one-row reference it is tested
against (tests/runner/test_sampler.py). A filtered-out token's logit is ``-inf``, so the
softmax the sampler takes next gives it no probability. Greedy rows never come here: the
sampler takes their argmax as it is (and so does a temperature under 1e-5, which
SamplingParams counts as greedy: dividing by less overflows float32).

top-p never drops the most likely token, however small top_p is: a top_p that rounds to
0 in float32 (1e-46) would otherwise drop every token, and a row of ``-inf`` has no
distribution to draw from (its softmax is NaN).
"""

from __future__ import annotations

import torch

from minicb.core.config import SamplingParams


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k and top-p on one row of fp32 logits (vocab,): the reference."""
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens ranked above it already cover top_p of the mass.
        drop = probs.cumsum(-1) - probs >= params.top_p
        drop[0] = False  # the most likely token stays, whatever top_p is
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(0, order, sorted_logits)
    return logits


def filter_rows(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """``filter_logits`` on every row of fp32 logits (N, vocab) at once, row i by params[i]."""
    vocab, device = logits.shape[-1], logits.device
    temps = torch.tensor([p.temperature for p in params], device=device)
    logits = logits / temps[:, None]
    ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    if min(ks) < vocab:
        # The k-th largest of each row, from one top-k at the largest k asked for.
        top = torch.topk(logits, max(ks), dim=-1).values  # (N, max_k)
        kth = top.gather(1, torch.tensor(ks, device=device)[:, None] - 1)  # (N, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    top_p = torch.tensor([p.top_p for p in params], device=device)[:, None]  # (N, 1)
    if bool((top_p < 1.0).any()):
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens ranked above it already cover top_p of the mass;
        # rows with top_p = 1 drop nothing.
        drop = (probs.cumsum(-1) - probs >= top_p) & (top_p < 1.0)
        drop[:, 0] = False  # each row's most likely token stays, whatever top_p is
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
    return logits
