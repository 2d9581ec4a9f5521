"""The simulated prediction of speculative decoding (minicb/cost_model/speculation.py,
minicb/sim/speculation.py): the break-even rule moves the right way."""

from __future__ import annotations

import pytest

from minicb.cost_model.catalogue import load_profile
from minicb.cost_model.speculation import SpeculationCost, tokens_per_round
from minicb.sim.speculation import main, predict, render

TARGET = load_profile("H100:llama-3.1-8b")


def _costs():
    return [
        SpeculationCost.build(TARGET, "ngram"),
        SpeculationCost.build(TARGET, "draft", draft_model="llama-3.2-1b"),
        SpeculationCost.build(TARGET, "early_exit", draft_layers=8),
    ]


def test_tokens_per_round_runs_from_one_to_k_plus_one():
    assert tokens_per_round(0.0, 4) == 1
    assert tokens_per_round(1.0, 4) == 5
    assert tokens_per_round(0.5, 2) == pytest.approx(1.75)


@pytest.mark.parametrize("cost", _costs(), ids=lambda c: c.proposer)
def test_a_bigger_batch_gains_less_and_needs_more_acceptance(cost):
    p = predict(cost, k=4, alpha=0.7, context=1024)
    speedups = [r["speedup"] for r in p["rounds"]]
    costs = [r["round_cost_steps"] for r in p["rounds"]]
    evens = [r["break_even_alpha"] for r in p["rounds"]]
    assert speedups == sorted(speedups, reverse=True) and speedups[0] > speedups[-1]
    assert costs == sorted(costs) and costs[-1] > costs[0]
    assert evens == sorted(evens) and evens[-1] > evens[0]
    # at the break-even alpha a round gives what it costs
    for r, even in zip(p["rounds"], evens, strict=True):
        assert tokens_per_round(even, 4) == pytest.approx(r["round_cost_steps"], abs=1e-3)


def test_a_draft_model_costs_its_own_reads_and_a_bigger_draft_costs_more():
    ngram, draft, early = _costs()
    assert ngram.draft_s(1, 1024, 4) == 0
    small = draft.draft_s(1, 1024, 4)
    # its weights (2.5 GB in bf16) read 4 times at 80 % of 3.35 TB/s, and its KV
    assert 4 * draft.draft.weight_bytes / (3.35e12 * 0.8) < small < 2 * 4 * 2.5e9 / 2.68e12
    assert early.draft_s(1, 1024, 4) > small  # 8 of the 8B's 32 layers outweigh the 1B
    assert draft.draft_s(1, 8192, 4) > small  # a longer context reads more of its KV
    assert draft.round(1, 1024, 4, 0.7)["speedup"] < ngram.round(1, 1024, 4, 0.7)["speedup"]


def test_a_draft_must_share_the_vocabulary():
    with pytest.raises(ValueError, match="tokenizer"):
        SpeculationCost.build(TARGET, "draft", draft_model="smollm2-135m")


def test_the_table_says_it_is_simulated(capsys):
    assert main(["--alpha", "0.6"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Simulated (not measured): H100-SXM:llama-3.1-8b, proposer draft")
    assert "| 256 |" in out and "break-even alpha" in out
    text = render(predict(_costs()[0], k=4, alpha=0.0, context=1024))
    assert "| no |" in text  # nothing accepted: a round never pays


def test_the_simulated_runner_prices_a_drafted_step_as_the_prediction_does():
    """A plan of drafted decode rows costs, in the simulated runner's step-time model, what
    the prediction's verification step costs: the LM head at each of the 1 + k positions."""
    from minicb.core.scheduler.plan import DECODE, ScheduledRequest, StepPlan

    def plan(k):
        rows = [
            ScheduledRequest(i, DECODE, 1 + k, 1023, 1024 + k, [], 65, True, True,
                             num_draft_tokens=k)
            for i in range(16)
        ]  # fmt: skip
        return StepPlan(1, "continuous", 16, scheduled=rows)

    cost = _costs()[0]
    assert TARGET(plan(0)) == pytest.approx(cost.plain_step_s(16, 1024))
    assert TARGET(plan(4)) == pytest.approx(cost.verify_step_s(16, 1024, 4))
    assert TARGET(plan(4)) > TARGET(plan(0))
