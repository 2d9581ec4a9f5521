"""Lesson 10, the prefix cache's host tier: what its narration says holds when it plays
(issue 34).

On the simulated L4 of test_claims.py (fast) and on the tiny random model through the real
runner (the host copies are real tensor copies): the histories leave the device pool, the
tier keeps them, a returning turn finds its history there and computes fewer prompt tokens,
and the answers are the same tokens with and without the tier. No wall-clock time is read.
"""

from collections import defaultdict

import pytest

from minicb.scenarios import load_scenario
from minicb.scenarios.player import build_engines, play
from minicb.scenarios.side_figures import request_metric, side_metric

NAME = "10-prefix-host-tier"
HISTORY = 448  # tokens of each conversation's history (its prefix)


@pytest.fixture(scope="module")
def scenario():
    return load_scenario(NAME)


def _check_the_narration(records):
    device, tier = records["device-only"], records["host-tier"]
    assert side_metric(device, "host_cached_blocks") == 0
    assert side_metric(tier, "host_cached_blocks") >= HISTORY // 16
    assert side_metric(device, "host_hit_tokens") == 0
    assert side_metric(tier, "host_hit_tokens") >= HISTORY
    # Fewer prompt tokens computed: every token the cache found is one not prefilled.
    saved = side_metric(device, "prefill_tokens") - side_metric(tier, "prefill_tokens")
    assert saved == side_metric(tier, "cached_tokens") - side_metric(device, "cached_tokens")
    assert side_metric(tier, "prefill_tokens") < 0.75 * side_metric(device, "prefill_tokens")


def _outputs(record):
    """Each group's tokens, in the order its requests arrived."""
    tokens = defaultdict(list)
    for event in record.requests["tokens"]:
        for rid, token in zip(event.request_ids, event.token_ids, strict=True):
            tokens[rid].append(token)
    by_group = defaultdict(list)
    for rid in sorted(tokens):
        by_group[record.groups[rid]].append(tokens[rid])
    return dict(by_group)


def test_on_a_simulated_gpu_the_tier_computes_fewer_prompt_tokens_and_answers_sooner(scenario):
    result = play(scenario, build_engines(scenario, profile="L4:llama-3.1-8b"))
    _check_the_narration(result.records)
    device, tier = result.records["device-only"], result.records["host-tier"]
    assert request_metric(tier, "ttft", "c1-turn2") < request_metric(device, "ttft", "c1-turn2")


@pytest.mark.slow  # two engines of 200 real steps each: about a minute on two loaded cores
def test_on_a_real_model_the_tier_gives_the_same_tokens_and_computes_fewer(
    scenario, tiny_llama_dir
):
    engines = build_engines(scenario, model=str(tiny_llama_dir))
    result = play(scenario, engines)
    _check_the_narration(result.records)
    device, tier = result.records["device-only"], result.records["host-tier"]
    assert _outputs(device) == _outputs(tier)
    for engine in engines.values():
        assert engine.kv_snapshot().num_used == 0  # every device block back in the pool
