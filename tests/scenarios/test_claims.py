"""Each scenario's narration claims hold in its run, and every narration point fires.

Simulated scenarios run on their own simulated GPU, as in the demo. A scenario written
for the embedded model runs here on a simulated GPU too (TEST_PROFILE: no weights, so the
test stays fast); its claims compare scheduling effects that hold on the real model as
well (the report of the branch quotes them on the embedded model). Times are on the
engine's virtual clock, never the wall clock.
"""

import pytest

from minicb.scenarios import load_scenario, scenario_names
from minicb.scenarios.player import arrivals, build_engines, play
from minicb.scenarios.side_figures import check_claim, request_metric, side_metric

TEST_PROFILE = "L4:llama-3.1-8b"  # prefill of a few hundred tokens is compute-bound here


@pytest.fixture(scope="module")
def runs():
    cache = {}

    def run(name):
        if name not in cache:
            scenario = load_scenario(name)
            cache[name] = scenario, play(scenario, build_engines(scenario, profile=TEST_PROFILE))
        return cache[name]

    return run


@pytest.mark.parametrize("name", scenario_names())
def test_every_narration_point_fires_in_order_and_every_claim_holds(runs, name):
    scenario, result = runs(name)
    assert sorted(result.fired) == list(range(len(scenario.narration)))
    rounds = [result.fired[i] for i in range(len(scenario.narration))]
    assert rounds == sorted(rounds), "narration points fire in the order they are written"
    assert result.rounds < scenario.max_steps, "the run finished before max_steps"
    for point in scenario.narration:
        for claim in point.claims:
            holds, said = check_claim(result.records, claim)
            assert holds, said


@pytest.mark.parametrize("name", scenario_names())
def test_both_sides_served_every_request(runs, name):
    scenario, result = runs(name)
    expected = len(arrivals(scenario))
    finished = [len(record.requests["finished"]) for record in result.records.values()]
    if scenario.router is None:
        assert finished == [expected, expected]
    else:  # a fleet: each request went to one replica
        assert sum(finished) == expected


def test_a_claim_that_is_false_says_so_with_its_figures(runs):
    _, result = runs("01-static-vs-continuous")
    holds, said = check_claim(result.records, "static.makespan < continuous.makespan")
    assert not holds
    assert said.startswith("static.makespan < continuous.makespan: ") and said.endswith("False")


def test_the_starved_request_waits_longer_without_aging(runs):
    _, result = runs("05-fairness-aging")
    strict = request_metric(result.records["strict"], "wait", "background")
    aging = request_metric(result.records["aging"], "wait", "background")
    urgent = request_metric(result.records["aging"], "wait", "urgent")
    assert aging < strict and urgent > 0


def test_arrivals_are_the_same_for_both_sides_and_share_their_prefix():
    scenario = load_scenario("06-prefix-caching")
    first, second = arrivals(scenario)[:2]
    assert first.prompt[:448] == second.prompt[:448]
    assert first.prompt[448:] != second.prompt[448:]
    assert arrivals(scenario) == arrivals(scenario)


def test_the_metrics_read_the_events(runs):
    _, result = runs("04b-recompute-vs-swap")
    swap = result.records["swap"]
    assert side_metric(swap, "swaps") == len(swap.requests["swapped_out"]) >= 1
    assert side_metric(swap, "steps") == len(swap.steps)


def test_a_sides_own_clock_leaves_out_the_other_sides_steps():
    from types import SimpleNamespace as NS

    from minicb.scenarios.side_figures import SideRecord

    record = SideRecord({})
    # Its steps ran 0-1 and 3-4 on the shared wall clock; the other side ran 1-3.
    record.steps = [
        NS(wall_start=0.0, wall_end=1.0, busy_s=1.0),
        NS(wall_start=3.0, wall_end=4.0, busy_s=2.0),
    ]
    assert [record.own(t) for t in (0.0, 0.5, 1.0, 2.0, 3.0, 3.5, 4.0, 9.0)] == [
        0.0, 0.5, 1.0, 1.0, 1.0, 1.5, 2.0, 2.0,
    ]  # fmt: skip
    record.requests["tokens"] = [NS(request_ids=[0], time=1.0), NS(request_ids=[0], time=4.0)]
    assert record.token_gaps() == {0: 1.0}  # not the 3 s of the wall clock
