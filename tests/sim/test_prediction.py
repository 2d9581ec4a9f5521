"""The static-vs-continuous theory: the fitted step model and the simulated schedules."""

import random

import pytest

from minicb.bench.theory import (
    StepModel,
    fit_step_model,
    harmonic,
    predict,
    simulate_continuous,
    simulate_static,
)

UNIT = StepModel(a=1.0, c=0.0, p=0.0, r2=1.0, num_steps=0)  # every step costs 1 s: counts steps


def test_fit_recovers_a_known_step_model():
    rng = random.Random(0)
    steps = []
    for _ in range(50):
        rows, tokens = rng.randint(0, 32), rng.choice([0, 0, 0, 64, 200])
        steps.append({"dt": 0.05 + 0.002 * rows + 0.0004 * tokens, "decode_rows": rows,
                      "prefill_tokens": tokens})  # fmt: skip
    m = fit_step_model(steps)
    assert (m.a, m.c, m.p) == pytest.approx((0.05, 0.002, 0.0004), abs=1e-9)
    assert m.r2 == pytest.approx(1.0) and m.num_steps == 50
    assert m.step_time(10, 100) == pytest.approx(0.05 + 0.02 + 0.04)
    with pytest.raises(ValueError, match="at least 3 steps"):
        fit_step_model(steps[:2])


def test_static_counts_prefill_then_lockstep_decodes_to_the_longest():
    # Two batches of two; prompts fit one step's budget; the first token ends prefill.
    prompts, outputs = [4, 4, 4, 4], [1, 5, 3, 2]
    assert simulate_static(prompts, outputs, batch=2, budget=64, model=UNIT) == (1 + 4) + (1 + 2)
    # Prompts of 10 under a budget of 8 take two prefill steps per batch of two.
    assert simulate_static([10, 10], [3, 3], batch=2, budget=8, model=UNIT) == 3 + 2
    m = StepModel(a=0.0, c=1.0, p=0.0, r2=1, num_steps=0)  # count row-steps: padding included
    assert simulate_static(prompts, outputs, 2, 64, m) == 2 * 4 + 2 * 2


def test_continuous_refills_slots_as_requests_finish():
    # Two slots: request 0 (1 token) leaves after its prefill step, 2 takes its slot.
    prompts, outputs = [4, 4, 4], [1, 3, 2]
    # step 1: prefill 0, 1; step 2: decode 1, prefill 2; step 3: decode 1, 2 -> all done.
    assert simulate_continuous(prompts, outputs, slots=2, budget=64, model=UNIT) == 3
    m = StepModel(a=0.0, c=1.0, p=1.0, r2=1, num_steps=0)  # rows + prompt tokens
    assert simulate_continuous(prompts, outputs, 2, 64, m) == (4 + 4) + (1 + 4) + (1 + 1)
    # Equal lengths: continuous and static do the same steps.
    same = predict([8] * 8, [6] * 8, slots=4, budget=64, model=UNIT)
    assert same["ratio"] == pytest.approx(1.0)


def test_ratio_tends_to_the_harmonic_number_for_exponential_lengths():
    """Memory-bound steps (cost independent of the batch), many exponential requests."""
    rng = random.Random(0)
    B, n, mean = 4, 4000, 40.0
    outputs = [max(1, round(rng.expovariate(1 / mean))) for _ in range(n)]
    pred = predict([1] * n, outputs, slots=B, budget=64, model=UNIT)
    assert harmonic(B) == pytest.approx(1 + 1 / 2 + 1 / 3 + 1 / 4)
    assert pred["harmonic_B"] == harmonic(B)
    assert pred["ratio"] == pytest.approx(harmonic(B), rel=0.05)
