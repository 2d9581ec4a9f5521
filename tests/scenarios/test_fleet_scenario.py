"""Lessons 11 and 11b, replicas behind a router: the fleet scenarios route with the fleet's
one Router and say so on the page, and what their narration says holds (issue 33).

Both play the same multi-turn chat on two simulated replicas (virtual time, a second or
two), one with round-robin, one prefix-aware; the comparison their narration makes across
the two lessons is checked here.
"""

import copy
import json

import pytest

from minicb.fleet.router import Router
from minicb.scenarios import ScenarioError, load_scenario
from minicb.scenarios.player import arrivals, build_engines, play
from minicb.scenarios.scenario import HERE, Scenario
from minicb.scenarios.side_figures import side_metric

NAMES = {"round-robin": "11-fleet-round-robin", "prefix-aware": "11b-fleet-prefix-aware"}


@pytest.fixture(scope="module")
def runs():
    out = {}
    for policy, name in NAMES.items():
        scenario = load_scenario(name)
        assert scenario.router == policy
        out[policy] = scenario, play(scenario, build_engines(scenario))
    return out


def total(result, metric):
    return sum(side_metric(record, metric) for record in result.records.values())


def test_both_lessons_play_the_same_chat():
    a, b = (load_scenario(name) for name in NAMES.values())
    assert arrivals(a) == arrivals(b)
    assert a.sides == b.sides and a.runner == b.runner


def test_each_request_goes_to_one_replica_with_a_routed_event_naming_it(runs):
    for scenario, result in runs.values():
        expected = len(arrivals(scenario))
        assert total(result, "routed") == expected
        assert sum(len(r.requests["finished"]) for r in result.records.values()) == expected
        for index, record in enumerate(result.records.values()):
            routed = record.requests["routed"]
            assert all(e.replica == index and e.policy == scenario.router for e in routed)
            assert all(e.reason.startswith(f"replica {index}: ") for e in routed)
            # the event names the replica's own request id, as Fleet's does
            arrived = record.requests["arrived"]
            assert [e.request_id for e in routed] == [e.request_id for e in arrived]


def test_the_one_router_decides(runs):
    """Replayed into a fresh Router, what the feeder told its router gives the same
    decisions (as test_simulated_fleet and test_replicas_serve check for the fleets)."""
    for scenario, result in runs.values():
        fresh = Router(scenario.router, 2)
        decided = sorted((e.time, e.replica, e.reason) for r in result.records.values()
                         for e in r.requests["routed"])  # fmt: skip
        replayed = [fresh.route(rid, ids, loads) for rid, ids, loads in result.feeder.told]
        assert len(replayed) == len(decided) == len(arrivals(scenario))
        assert sorted((r.replica, r.reason) for r in replayed) == sorted(
            (replica, reason) for _, replica, reason in decided
        )


def test_prefix_aware_computes_fewer_prompt_tokens_than_round_robin(runs):
    rr, pa = runs["round-robin"][1], runs["prefix-aware"][1]
    assert total(pa, "cache_hits") == 6 and total(rr, "cache_hits") == 3
    assert total(pa, "prefill_tokens") < 0.6 * total(rr, "prefill_tokens")
    # the figures the narration quotes
    text = runs["prefix-aware"][0].narration[-1].text["en"]
    computed = (int(total(pa, "prefill_tokens")), int(total(rr, "prefill_tokens")))
    assert f"{computed[0]:,} prompt tokens computed against {computed[1]:,}" in text


def test_an_unknown_router_is_named():
    data = json.loads((HERE / f"{NAMES['round-robin']}.json").read_text(encoding="utf-8"))
    data = copy.deepcopy(data)
    data["router"] = "random"
    with pytest.raises(ScenarioError, match="router 'random' is unknown; choose one of"):
        Scenario.from_dict(data)
