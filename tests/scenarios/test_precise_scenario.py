"""Lesson 11c, replicas behind a router that knows: in a scenario whose router reads the
index (precise-prefix, cost), the player attaches a KV event publisher to each replica
and feeds the router's index, as a fleet does; what the lesson's narration says holds
(issue 56)."""

from minicb.scenarios import load_scenario
from minicb.scenarios.player import ScenarioFeeder, build_engines, play

NAME = "11c-fleet-precise-prefix"


def found_cached(record):
    """Each request's prompt tokens found cached when it was admitted."""
    return {d.request_id: d.num_cached_tokens for s in record.steps for d in s.plan.admitted}


def test_the_index_is_fed_and_says_what_each_replica_holds():
    scenario = load_scenario(NAME)
    result = play(scenario, build_engines(scenario))
    replica0, replica1 = result.records.values()
    # every routing decision read blocks the replicas reported (none without the feed)
    expected = {replica0.groups[e.request_id]: e.cached_tokens for e in replica0.requests["routed"]}
    assert expected["c1-turn2"] == 208  # c3's first turn evicted the end of c1's history
    found = found_cached(replica0)
    c1_turn2 = next(r for r, g in replica0.groups.items() if g == "c1-turn2")
    assert found[c1_turn2] == 208  # and the replica found exactly that
    # the conversation alone on its replica: expected what it found, all its history
    for event in replica1.requests["routed"]:
        assert event.cached_tokens == found_cached(replica1)[event.request_id]
    assert sorted(e.cached_tokens for e in replica1.requests["routed"]) == [0, 384, 384]
    # on replica 0 each later turn found only what the other conversation left it
    later = [found[r] for r, g in replica0.groups.items() if not g.endswith("turn1")]
    assert later == [208, 208, 208, 208]


def test_detach_stops_the_publishers():
    scenario = load_scenario(NAME)
    engines = build_engines(scenario)
    feeder = ScenarioFeeder(scenario)
    before = [len(e.bus._listeners) for e in engines.values()]
    feeder.attach(engines)
    assert len(feeder.publishers) == 2
    feeder.detach(engines)
    assert [len(e.bus._listeners) for e in engines.values()] == before
