"""The prediction of static against continuous batching from lengths alone: the real
engine with each scheduler on a simulated runner (minicb.sim.run.static_vs_continuous).
These were the paper replay's tests (bench/theory.py); the same counts now come from the
schedulers that run."""

import random

import pytest

from minicb.core.config import EngineConfig
from minicb.core.scheduler.plan import StepPlan
from minicb.sim.run import harmonic, static_vs_continuous
from minicb.workload import RequestSpec, from_lengths


def unit(plan: StepPlan) -> float:
    return 1.0  # every step costs 1 s: the clock counts steps


def rows(plan: StepPlan) -> float:
    return sum(r.num_tokens == 1 for r in plan.scheduled)  # one-token rows, padding included


def rows_and_prompt_tokens(plan: StepPlan) -> float:
    return rows(plan) + sum(r.num_tokens for r in plan.scheduled if r.num_tokens > 1)


def config(slots: int, budget: int) -> EngineConfig:
    return EngineConfig(max_num_seqs=slots, max_num_batched_tokens=budget,
                        enable_prefix_caching=False)  # fmt: skip


def lengths(prompts: list[int], outputs: list[int]) -> list[RequestSpec]:
    return from_lengths(prompts, outputs)


def test_a_step_costs_what_the_step_time_function_says():
    # step 1: prefill 0 and 1 (8 tokens); 2: decode 1, prefill 2 (1 row, 4 tokens);
    # 3: decode 1 and 2 (2 rows): a x 3 steps + c x 3 rows + p x 12 prompt tokens.
    def step_time(plan: StepPlan) -> float:
        tokens = sum(r.num_tokens for r in plan.scheduled if r.num_tokens > 1)
        return 0.05 + 0.002 * rows(plan) + 0.0004 * tokens

    pred = static_vs_continuous(step_time, config(2, 64), lengths([4, 4, 4], [1, 3, 2]))
    assert pred["continuous_s"] == pytest.approx(0.05 * 3 + 0.002 * 3 + 0.0004 * 12)
    assert pred["continuous_steps"] == 3


def test_static_counts_prefill_then_lockstep_decodes_to_the_longest():
    # Two batches of two; prompts fit one step's budget; the first token ends prefill.
    prompts, outputs = [4, 4, 4, 4], [1, 5, 3, 2]
    pred = static_vs_continuous(unit, config(2, 64), lengths(prompts, outputs))
    assert pred["static_s"] == (1 + 4) + (1 + 2)
    # Prompts of 10 under a budget of 8 take two prefill steps per batch of two.
    pred = static_vs_continuous(unit, config(2, 8), lengths([10, 10], [3, 3]))
    assert pred["static_s"] == 3 + 2
    # count row-steps: padding included
    pred = static_vs_continuous(rows, config(2, 64), lengths(prompts, outputs))
    assert pred["static_s"] == 2 * 4 + 2 * 2


def test_continuous_refills_slots_as_requests_finish():
    # Two slots: request 0 (1 token) leaves after its prefill step, 2 takes its slot.
    prompts, outputs = [4, 4, 4], [1, 3, 2]
    # step 1: prefill 0, 1; step 2: decode 1, prefill 2; step 3: decode 1, 2 -> all done.
    pred = static_vs_continuous(unit, config(2, 64), lengths(prompts, outputs))
    assert pred["continuous_s"] == 3
    pred = static_vs_continuous(rows_and_prompt_tokens, config(2, 64), lengths(prompts, outputs))
    assert pred["continuous_s"] == (4 + 4) + (1 + 4) + (1 + 1)
    # Equal lengths: continuous and static do the same steps.
    same = static_vs_continuous(unit, config(4, 64), lengths([8] * 8, [6] * 8))
    assert same["ratio"] == pytest.approx(1.0)


def _exponential_ratio(n: int, B: int = 4, mean: float = 40.0) -> float:
    rng = random.Random(0)
    outputs = [max(1, round(rng.expovariate(1 / mean))) for _ in range(n)]
    return static_vs_continuous(unit, config(B, 64), lengths([1] * n, outputs))["ratio"]


def test_ratio_tends_to_the_harmonic_number_for_exponential_lengths():
    """Memory-bound steps (cost independent of the batch), many exponential requests; 1,000
    of them here (2.04 against H_4 = 2.08), 4,000 in the slow test below."""
    assert harmonic(4) == pytest.approx(1 + 1 / 2 + 1 / 3 + 1 / 4)
    assert _exponential_ratio(1000) == pytest.approx(harmonic(4), rel=0.05)


@pytest.mark.slow
def test_ratio_tends_to_the_harmonic_number_for_4000_exponential_lengths():
    """The paper replay's own size: 4,000 requests, 125,000 engine steps (a minute or two
    on a loaded two-core machine); 2.07 against 2.08."""
    assert _exponential_ratio(4000) == pytest.approx(harmonic(4), rel=0.05)
