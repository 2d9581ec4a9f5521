"""Rejection sampling: keep as much of a draft as the target model's distribution allows.

A proposer guessed ``d_1..d_k`` after a request's tokens, drawing ``d_i`` from its own
distribution ``q_i``. One forward pass of the target gives its distributions ``p_1..p_k+1``
at those positions (``p_i`` after ``d_1..d_i-1``), filtered as the sampler filters them
(temperature, top-k, top-p). Then, for i = 1..k in turn:

- accept ``d_i`` with probability ``min(1, p_i(d_i) / q_i(d_i))``;
- at the first rejection, emit a token drawn from the residual ``(p_i - q_i)+``
  renormalised, and stop;
- when all k are accepted, emit a bonus token drawn from ``p_k+1``.

Each emitted token then has exactly the target's distribution, whatever ``q`` was: a
token ``x`` comes out at position i either as an accepted draft, with probability
``q(x) min(1, p(x)/q(x)) = min(q(x), p(x))``, or from the residual, with probability
``(1 - sum min(p, q)) (p(x) - q(x))+ / sum (p - q)+ = p(x) - min(p(x), q(x))``: together
``p(x)`` (Leviathan et al. and Chen et al., 2023). A good ``q`` is accepted often; a poor
one costs rejected positions, never a wrong distribution. Greedy is the same rule with
``p`` a point mass on the argmax (temperature 0): a draft is accepted exactly when it is
the argmax, and the token emitted at a rejection is the argmax.

The n-gram proposer's ``q_i`` is a point mass on ``d_i``. Then the rule reads: accept
with probability ``p_i(d_i)``, and on rejection draw from ``p_i`` with ``d_i`` removed. That
is what drawing ``x_i`` from ``p_i`` and keeping it while ``x_i == d_i`` does, and so the
engine verifies n-gram drafts that way (the runner draws at every position, seeded by
(seed, token index) like any token; ``accept_greedy`` in drafter.py keeps the matching
prefix): a seeded request then emits the same tokens with speculation on or off.
``rejection_sample`` below is the rule for every ``q``: a proposer that gives whole
distributions (a draft model) needs it, and the tests check the point-mass case against
it. Batched over rows, so that a test can run 200,000 of them at once.
"""

from __future__ import annotations

import torch

from minicb.core.config import SamplingParams
from minicb.core.runner.sampler import inverse_cdf, token_generator
from minicb.core.runner.sampling_filters import filter_rows


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(positions, vocab) what the sampler draws from at each of a row's positions: the
    filtered softmax (sampling_filters.py), or a point mass on the argmax for greedy."""
    if params.greedy:
        return point_masses(logits.argmax(-1), logits.shape[-1])
    return filter_rows(logits.float(), [params] * len(logits)).softmax(-1)


def point_masses(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """(..., vocab) a distribution that puts all its mass on each token: the ``q`` of a
    proposer that gives tokens and no probabilities (n-gram), or greedy's ``p``."""
    return torch.nn.functional.one_hot(tokens, vocab).float()


def row_uniforms(
    params: SamplingParams,
    first: int,
    positions: int,
    generator: torch.Generator,
    device: torch.device,
) -> torch.Tensor:
    """(positions, 2) one row's uniforms: at each position, one for the acceptance test and
    one for the draw. A seeded request's position i takes them from the generator of its
    token ``first + i`` (sampler.py's ``token_generator``), so its tokens do not
    depend on who shares its batch; others take them from the shared ``generator``."""
    if params.seed is None:
        return torch.rand((positions, 2), generator=generator, device=device)
    return torch.stack(
        [
            torch.rand(2, generator=token_generator(params.seed, first + i, device), device=device)
            for i in range(positions)
        ]
    )


def rejection_sample(
    draft: torch.Tensor,  # (N, k) proposed tokens, k >= 1
    q: torch.Tensor,  # (N, k, vocab) the proposer's distribution each was drawn from
    p: torch.Tensor,  # (N, k + 1, vocab) the target's filtered distributions
    uniforms: torch.Tensor,  # (N, k + 1, 2) in [0, 1): acceptance test, draw
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify N rows' drafts at once. Returns ``(accepted, emitted)``, both (N,): row j
    keeps ``draft[j, :accepted[j]]`` and then the token ``emitted[j]`` (drawn from the
    residual at the first rejection, or the bonus from ``p[j, k]``): between 1 and k + 1
    tokens a row."""
    n, k = draft.shape
    p_d = p[:, :k].gather(-1, draft[..., None])[..., 0]
    q_d = q.gather(-1, draft[..., None])[..., 0]  # > 0: each d_i was drawn from q_i
    accept = uniforms[:, :k, 0] < (p_d / q_d).clamp(max=1.0)
    accepted = accept.long().cumprod(-1).sum(-1)  # up to the first rejection
    # Where the emitted token comes from: (p - q)+ at the rejected position; after all k
    # were accepted, q is taken as 0, so the residual is p_k+1 itself (the bonus).
    rows = torch.arange(n, device=draft.device)
    target = p[rows, accepted]
    rejected = (accepted < k)[:, None]
    residual = (target - q[rows, accepted.clamp(max=k - 1)] * rejected).clamp(min=0.0)
    # A rejection where p <= q everywhere can only be rounding (p == q accepts at ratio 1):
    # its residual is empty, and p is what it should have been.
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, target)
    emitted = inverse_cdf(residual, uniforms[rows, accepted, 1:])
    return accepted, emitted


def verify_row(
    draft: list[int],
    q: torch.Tensor,  # (d, vocab) the draft's distributions
    logits: torch.Tensor,  # (d + 1, vocab) the target's logits at the row's sampled positions
    params: SamplingParams,
    first: int,  # the index of the row's first new token (its seeded generators')
    generator: torch.Generator,  # the runner's, for a request without a seed
) -> list[int]:
    """One engine row verified: its kept guesses, then the token drawn from the residual at
    the first rejection (or the bonus). ``p`` is filtered as the sampler filters (the same
    top-k, top-p and temperature the draft's ``q`` was filtered with)."""
    device = logits.device
    tokens = torch.tensor([draft], device=device)
    p = target_probs(logits, params)[None]
    uniforms = row_uniforms(params, first, len(draft) + 1, generator, device)[None]
    accepted, emitted = rejection_sample(tokens, q.to(device)[None].float(), p, uniforms)
    kept = int(accepted[0])
    return draft[:kept] + [int(emitted[0])]
