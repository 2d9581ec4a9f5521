"""The rejection sampler (minicb/speculation/rejection.py) keeps the target's distribution
whatever the draft's: on synthetic (p, q) pairs, the first emitted token's empirical
distribution approaches p as the draws grow (total variation under 0.01 at 200,000 draws;
measured 0.0005 to 0.0018 over these pairs), and a sampler with a wrong residual (p instead
of (p - q)+) stays far from it. A point-mass draft (the n-gram's) is accepted with
probability p(d), and drawing at each position and keeping the matching prefix (what the
engine does) gives the same distribution; a draft equal to the target is always accepted;
greedy is the argmax rule; a seeded row's tokens depend only on its seed."""

from collections import Counter

import torch

from minicb.core.config import SamplingParams
from minicb.core.runner.sampler import inverse_cdf
from minicb.speculation.drafter import accept_greedy
from minicb.speculation.rejection import (
    point_masses,
    rejection_sample,
    row_uniforms,
    target_probs,
)

VOCAB, K = 8, 2
COUNTS = (2_000, 20_000, 200_000)
BOUND = 0.01  # total variation at 200,000 draws


def pairs(count: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(p, q): K + 1 target and K draft distributions over VOCAB tokens, some peaked, some
    with zeros (a token the target's top-k filtered out, one the draft never proposes)."""
    gen = torch.Generator().manual_seed(11)
    out = []
    for i in range(count):
        p = (torch.randn((K + 1, VOCAB), generator=gen) * (1 + i / 2)).softmax(-1)
        q = (torch.randn((K, VOCAB), generator=gen) * (1 + i / 2)).softmax(-1)
        if i % 2:
            p[:, 0] = 0.0  # filtered out of the target
            q[:, 1] = 0.0  # never drafted
            p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
        out.append((p, q))
    return out


def draw(probs: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    """(n, positions): a token from each row of ``probs`` (positions, vocab), n times."""
    rows = probs.expand(n, *probs.shape).reshape(-1, probs.shape[-1])
    return inverse_cdf(rows, torch.rand((len(rows), 1), generator=gen)).view(n, -1)


def first_tokens(p, q, n, gen, sampler=rejection_sample) -> torch.Tensor:
    """The first token each of n verified rows emits: its first draft if kept, or else the
    token drawn at the rejection."""
    draft = draw(q, n, gen)
    accepted, emitted = sampler(
        draft,
        q.expand(n, *q.shape),
        p.expand(n, *p.shape),
        torch.rand((n, K + 1, 2), generator=gen),
    )
    return torch.where(accepted > 0, draft[:, 0], emitted)


def total_variation(tokens: torch.Tensor, p: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=VOCAB).float()
    return 0.5 * float((counts / len(tokens) - p).abs().sum())


def outcomes(accepted, emitted, draft) -> Counter:
    """How often each list of tokens came out of a verification of ``draft``."""
    return Counter(tuple(draft[:a].tolist()) + (e,) for a, e in zip(accepted, emitted, strict=True))


def wrong_residual(draft, q, p, uniforms):
    """The classic mistake, one position: accept with min(1, p/q), but draw a rejected
    position's token from p instead of (p - q)+: tokens the draft over-proposed come back."""
    p_d = p[:, 0].gather(-1, draft[:, :1])[:, 0]
    q_d = q[:, 0].gather(-1, draft[:, :1])[:, 0]
    accepted = (uniforms[:, 0, 0] < (p_d / q_d).clamp(max=1.0)).long()
    return accepted, inverse_cdf(p[:, 0], uniforms[:, 0, 1:])


def test_first_token_follows_the_target_and_the_distance_falls_with_draws():
    gen = torch.Generator().manual_seed(0)
    distances = []
    for p, q in pairs():
        tokens = first_tokens(p, q, COUNTS[-1], gen)  # the smaller counts: its first draws
        tv = [total_variation(tokens[:n], p[0]) for n in COUNTS]
        distances.append(tv)
        assert tv[2] < BOUND, (tv, p, q)
    means = [sum(d[i] for d in distances) / len(distances) for i in range(len(COUNTS))]
    assert means[0] > means[1] > means[2], means  # each 10x more draws: about 3x closer
    assert max(d[2] for d in distances) < 0.0025  # it measured 0.0018 at most (the docs say)


def test_a_wrong_residual_fails_the_bound():
    gen = torch.Generator().manual_seed(1)
    for p, q in pairs():
        tv = total_variation(first_tokens(p, q, COUNTS[-1], gen, wrong_residual), p[0])
        assert tv > BOUND, tv  # measured 0.063 to 0.13 over these pairs


def test_a_point_mass_draft_is_accepted_with_probability_p_of_it():
    gen = torch.Generator().manual_seed(2)
    n = COUNTS[-1]
    for p, _ in pairs():
        d = torch.tensor([[2, 3]]).expand(n, K)
        accepted, emitted = rejection_sample(
            d,
            point_masses(d, VOCAB),
            p.expand(n, *p.shape),
            torch.rand((n, K + 1, 2), generator=gen),
        )
        rate = float((accepted > 0).float().mean())
        target = float(p[0, d[0, 0]])
        assert abs(rate - target) < 5 * (target * (1 - target) / n) ** 0.5 + 1e-9
        first = torch.where(accepted > 0, d[:, 0], emitted)
        assert total_variation(first, p[0]) < BOUND
        # What the engine does instead: draw at every position, keep the matching prefix.
        # Both give the same tokens with the same odds (all of them, not only the first).
        m = 20_000
        rule = outcomes(accepted[:m].tolist(), emitted[:m].tolist(), d[0])
        drawn = draw(p, m, gen).tolist()
        engine = Counter(tuple(accept_greedy(d[0].tolist(), row)) for row in drawn)
        gap = 0.5 * sum(abs(rule[o] - engine[o]) for o in rule | engine) / m
        assert gap < 0.03, gap  # two samples of 20,000: about 0.01 apart by chance


def test_a_draft_equal_to_the_target_keeps_all_k_plus_one():
    gen = torch.Generator().manual_seed(3)
    for p, _ in pairs():
        n = 1000
        draft = draw(p[:K], n, gen)
        accepted, _ = rejection_sample(
            draft, p[:K].expand(n, K, VOCAB), p.expand(n, *p.shape), torch.rand((n, K + 1, 2))
        )
        assert accepted.tolist() == [K] * n  # K drafts and the bonus: K + 1 tokens a row


def test_greedy_is_the_argmax_rule():
    logits = torch.randn((K + 1, VOCAB), generator=torch.Generator().manual_seed(4))
    p = target_probs(logits, SamplingParams(temperature=0.0))
    argmax = logits.argmax(-1).tolist()
    for draft in ([argmax[0], argmax[1]], [argmax[0], (argmax[1] + 1) % VOCAB], [5, 5]):
        d = torch.tensor([draft])
        accepted, emitted = rejection_sample(
            d, point_masses(d, VOCAB), p[None], torch.rand(1, K + 1, 2)
        )
        assert draft[: int(accepted)] + [int(emitted)] == accept_greedy(draft, argmax)


def test_the_target_is_filtered_as_the_sampler_filters():
    logits = torch.randn((K + 1, VOCAB), generator=torch.Generator().manual_seed(5))
    p = target_probs(logits, SamplingParams(temperature=0.7, top_k=3))
    assert ((p > 0).sum(-1) == 3).all()
    assert torch.allclose(p.sum(-1), torch.ones(K + 1))


def test_a_seeded_row_draws_from_its_seed_and_token_index_only():
    params = SamplingParams(temperature=1.0, seed=7)
    a = row_uniforms(params, 5, K + 1, torch.Generator().manual_seed(1), torch.device("cpu"))
    b = row_uniforms(params, 5, K + 1, torch.Generator().manual_seed(2), torch.device("cpu"))
    later = row_uniforms(params, 6, K + 1, torch.Generator().manual_seed(1), torch.device("cpu"))
    assert torch.equal(a, b)  # whatever the shared generator did
    assert torch.equal(a[1:], later[:-1])  # token 6's uniforms, whichever step drew it
    unseeded = SamplingParams(temperature=1.0)
    c = row_uniforms(unseeded, 5, K + 1, torch.Generator().manual_seed(1), torch.device("cpu"))
    assert not torch.equal(a, c)
