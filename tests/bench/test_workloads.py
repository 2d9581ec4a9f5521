"""The bench's workload recipes: seeded, and distributed as documented (the request shape,
the arrival times and the arrival loop: tests/test_workload.py)."""

import math
import statistics

import pytest

from minicb.bench.recipes import (
    capped_exponential,
    fixed_lengths,
    nanovllm_replica,
    uniform_lengths,
)

VOCAB = 49152


def _capped_exp_mean(mean: float, cap: int) -> float:
    """E[min(cap, max(1, round(X)))] for X exponential of ``mean``, summed exactly."""
    total = 0.0
    for k in range(0, cap + 1):
        lo = max(0.0, k - 0.5)
        p = math.exp(-lo / mean) - math.exp(-(k + 0.5) / mean)
        if k == cap:  # everything from cap - 0.5 up is capped
            p = math.exp(-lo / mean)
        total += min(cap, max(1, k)) * p
    return total


def test_same_seed_same_workload_other_seed_other_workload():
    a = capped_exponential(50, 8, 16, 64, VOCAB, seed=3)
    b = capped_exponential(50, 8, 16, 64, VOCAB, seed=3)
    c = capped_exponential(50, 8, 16, 64, VOCAB, seed=4)
    assert a.requests == b.requests
    assert a.output_lens != c.output_lens
    for make in (
        lambda s: uniform_lengths(20, (4, 64), (1, 32), VOCAB, seed=s),
        lambda s: nanovllm_replica(20, (6, 64), VOCAB, seed=s),
        lambda s: fixed_lengths(20, 8, 8, VOCAB, seed=s),
    ):
        assert make(1).requests == make(1).requests
        assert make(1).requests != make(2).requests


def test_lengths_do_not_depend_on_the_vocabulary():
    for make in (
        lambda v: capped_exponential(40, 8, 16, 64, v, seed=5),
        lambda v: uniform_lengths(40, (4, 64), (1, 32), v, seed=5),
        lambda v: nanovllm_replica(40, (6, 64), v, seed=5),
    ):
        small, large = make(256), make(VOCAB)
        assert small.prompt_lens == large.prompt_lens
        assert small.output_lens == large.output_lens
        assert small.requests != large.requests  # the ids differ, within each vocabulary


def test_capped_exponential_lengths_follow_the_capped_distribution():
    mean, cap, n = 16, 64, 20000
    w = capped_exponential(n, 4, mean, cap, VOCAB, seed=0)
    outs = w.output_lens
    assert all(1 <= x <= cap for x in outs)
    assert set(w.prompt_lens) == {4}
    assert statistics.fmean(outs) == pytest.approx(_capped_exp_mean(mean, cap), rel=0.03)
    at_cap = sum(x == cap for x in outs) / n
    assert at_cap == pytest.approx(math.exp(-(cap - 0.5) / mean), abs=0.005)
    # Exponential: the median is mean * ln 2.
    assert statistics.median(outs) == pytest.approx(mean * math.log(2), abs=1.0)


def test_uniform_lengths_cover_their_ranges_evenly():
    w = uniform_lengths(6000, (4, 64), (1, 32), VOCAB, seed=0)
    assert set(w.prompt_lens) == set(range(4, 65))
    assert set(w.output_lens) == set(range(1, 33))
    assert statistics.fmean(w.prompt_lens) == pytest.approx(34, rel=0.02)
    assert statistics.fmean(w.output_lens) == pytest.approx(16.5, rel=0.02)


def test_nanovllm_replica_matches_its_recipe():
    w = nanovllm_replica(3000, (6, 64), VOCAB, seed=0)
    assert w.temperature == 0.6
    assert min(w.prompt_lens) == 6 and max(w.prompt_lens) == 64
    assert min(w.output_lens) == 6 and max(w.output_lens) == 64
    ids = [t for r in w.requests for t in r.prompt]
    assert min(ids) == 0 and max(ids) == 10000
    small = nanovllm_replica(50, (6, 64), vocab=256, seed=0)
    assert max(t for r in small.requests for t in r.prompt) <= 255


def test_fixed_lengths_are_all_alike_and_prompts_fit_the_vocabulary():
    w = fixed_lengths(10, 12, 7, vocab=256, seed=0)
    assert set(w.prompt_lens) == {12} and set(w.output_lens) == {7}
    assert all(3 <= t <= 255 for r in w.requests for t in r.prompt)
    assert w.all_at_once
