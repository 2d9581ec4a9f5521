"""Each routing policy's choice on hand-built loads and prompts (minicb/fleet/router.py)."""

import pytest

from minicb.fleet.router import POLICIES, ReplicaLoad, Router, block_keys


def idle(n: int) -> list[ReplicaLoad]:
    return [ReplicaLoad(i, 0, 0) for i in range(n)]


PROMPT = list(range(128))  # 8 blocks of 16


def test_unknown_policy_names_the_choices():
    with pytest.raises(ValueError, match="round-robin.*least-loaded.*prefix-aware"):
        Router("random", 2)


def test_round_robin_takes_turns_and_skips_the_dead():
    router = Router("round-robin", 3)
    assert [router.route(i, PROMPT, idle(3)).replica for i in range(4)] == [0, 1, 2, 0]
    loads = [ReplicaLoad(0, 0, 0), ReplicaLoad(1, 0, 0, alive=False), ReplicaLoad(2, 0, 0)]
    assert [router.route(i, PROMPT, loads).replica for i in range(3)] == [2, 0, 2]


def test_least_loaded_scores_waiting_four_times_running():
    router = Router("least-loaded", 3)
    # scores: 1*4 + 0 = 4, 0*4 + 5 = 5, 0*4 + 3 = 3
    loads = [ReplicaLoad(0, 1, 0), ReplicaLoad(1, 0, 5), ReplicaLoad(2, 0, 3)]
    route = router.route(7, PROMPT, loads)
    assert (route.replica, route.request_id, route.policy) == (2, 7, "least-loaded")
    assert "score 3" in route.reason
    # ties go to the lowest index
    assert router.route(8, PROMPT, [ReplicaLoad(1, 0, 4), ReplicaLoad(0, 1, 0)]).replica == 0


def test_prefix_aware_follows_the_longest_cached_prefix():
    router = Router("prefix-aware", 3)
    first = router.route(0, PROMPT, idle(3))
    assert first.cached_tokens == 0 and "a new prefix" in first.reason
    router.route(1, list(range(1000, 1064)), idle(3))  # another prefix, elsewhere
    # the second turn extends the first: 128 of its 140 tokens were sent to that replica,
    # even though that replica is now (a little) busier
    loads = [ReplicaLoad(i, 0, 3 if i == first.replica else 0) for i in range(3)]
    turn = router.route(2, PROMPT + [5] * 12, loads)
    assert turn.replica == first.replica
    assert turn.cached_tokens == 128
    assert turn.reason == f"replica {first.replica}: 128 of 140 prompt tokens cached there"


def test_prefix_aware_counts_whole_blocks_of_the_same_chain_only():
    router = Router("prefix-aware", 2, block_size=16)
    router.route(0, PROMPT, idle(2))
    # the same tokens at another start share no block key: a prefix is the whole chain
    assert router.route(1, PROMPT[16:], idle(2)).cached_tokens == 0
    # 40 tokens of the prompt: two full blocks match, the partial third is not keyed
    assert len(block_keys(PROMPT[:40], 16)) == 2


def test_prefix_aware_spreads_new_prefixes_to_the_smallest_record():
    router = Router("prefix-aware", 2)
    a = router.route(0, PROMPT, idle(2))
    b = router.route(1, list(range(500, 628)), idle(2))
    assert {a.replica, b.replica} == {0, 1}


def test_prefix_aware_goes_least_loaded_when_load_is_unbalanced():
    router = Router("prefix-aware", 2, balance_abs=32, balance_rel=1.5)
    home = router.route(0, PROMPT, idle(2)).replica
    other = 1 - home
    busy = [ReplicaLoad(home, 10, 0), ReplicaLoad(other, 0, 1)]  # 40 against 1
    route = router.route(1, PROMPT, busy)
    assert route.replica == other
    assert "load unbalanced" in route.reason and "score 40 against 1" in route.reason
    assert route.cached_tokens == 0  # the router had not sent that prefix there


def test_prefix_aware_keeps_the_cache_under_the_absolute_threshold():
    router = Router("prefix-aware", 2, balance_abs=32, balance_rel=1.5)
    home = router.route(0, PROMPT, idle(2)).replica
    mild = [ReplicaLoad(home, 5, 0), ReplicaLoad(1 - home, 0, 1)]  # 20 against 1: ratio 20
    assert router.route(1, PROMPT, mild).replica == home


def test_the_record_is_bounded_and_forgets_least_recently_used():
    router = Router("prefix-aware", 1, max_blocks_per_replica=8)
    router.route(0, PROMPT, idle(1))  # 8 blocks: full
    router.route(1, list(range(500, 532)), idle(1))  # 2 more: the 2 oldest forgotten
    assert len(router.records[0]) == 8
    assert router.route(2, PROMPT, idle(1)).cached_tokens == 0  # its first block is gone


def test_removed_replicas_are_never_chosen_and_forget_their_prefixes():
    for policy in POLICIES:
        router = Router(policy, 2)
        home = router.route(0, PROMPT, idle(2)).replica
        router.remove(home)
        for i in range(1, 4):  # even when the caller still reports it alive
            assert router.route(i, PROMPT, idle(2)).replica == 1 - home
        new = router.add()
        assert new == 2 and router.replicas == sorted({1 - home, 2})


def test_no_live_replica_is_a_clear_error():
    router = Router("least-loaded", 2)
    dead = [ReplicaLoad(0, 0, 0, alive=False), ReplicaLoad(1, 0, 0, alive=False)]
    with pytest.raises(RuntimeError, match="no live replica to route request 5"):
        router.route(5, PROMPT, dead)


def test_a_reason_holds_counts_not_tokens():
    router = Router("prefix-aware", 2)
    secret = [4242] * 64
    router.route(0, secret, idle(2))
    route = router.route(1, secret, idle(2))
    assert "4242" not in route.reason and route.cached_tokens == 64
