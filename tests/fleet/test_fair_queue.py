"""The fair queue (minicb/fleet/tenancy/): bands, deficit round robin over uncached
tokens, bounded queues, token-rate limits, cancellation; and the simulated fleet behind it
(a noisy neighbour cannot raise the light tenant's TTFT past the stated bound)."""

from __future__ import annotations

import pytest

from minicb.fleet.router import ReplicaLoad, Router
from minicb.fleet.tenancy.fair_queue import FairQueue, Refused
from minicb.fleet.tenancy.tenant import Tenant, parse_tenant
from minicb.fleet.tenancy.token_bucket import TokenBucket
from minicb.fleet.tenancy.uncached import uncached_tokens


def drain(q: FairQueue) -> list[str]:
    out = []
    while (entry := q.pop()) is not None:
        out.append(entry.item)
    return out


def test_one_tenant_is_fifo():
    q = FairQueue()
    for i in range(5):
        q.push(f"r{i}", "default", 100, 100, 0.0)
    assert drain(q) == [f"r{i}" for i in range(5)]
    assert len(q) == 0


def test_deficit_round_robin_shares_tokens_not_requests():
    """A tenant of 100-token prompts gets five requests out for each 500-token one of the
    other: the same tokens each, whatever the request sizes or counts."""
    q = FairQueue(quantum=500)
    for i in range(20):
        q.push(f"big{i}", "big", 500, 500, 0.0)
    for i in range(20):
        q.push(f"small{i}", "small", 100, 100, 0.0)
    first = drain(q)[:24]
    assert sum(x.startswith("big") for x in first) == 4
    assert sum(x.startswith("small") for x in first) == 20


def test_a_flood_does_not_delay_a_late_light_request_behind_its_backlog():
    q = FairQueue()
    for i in range(50):
        q.push(f"heavy{i}", "heavy", 512, 600, 0.0)
    q.pop()  # heavy is mid-turn
    q.push("light", "light", 512, 600, 1.0)
    order = drain(q)
    assert order.index("light") <= 2


def test_a_lower_priority_value_is_a_higher_band_always_first():
    q = FairQueue([Tenant("paid", priority=0), Tenant("free", priority=1)])
    for i in range(3):
        q.push(f"free{i}", "free", 10, 10, 0.0)
    for i in range(3):
        q.push(f"paid{i}", "paid", 1000, 1000, 0.0)
    assert drain(q) == ["paid0", "paid1", "paid2", "free0", "free1", "free2"]


def test_an_idle_tenant_saves_no_deficit():
    q = FairQueue(quantum=1000)
    q.push("a0", "a", 10, 10, 0.0)
    assert q.pop().item == "a0"
    assert q.lanes["a"].deficit == 0 and q.lanes["a"].fresh


def test_a_full_tenant_queue_is_refused_naming_the_limit_and_others_still_queue():
    q = FairQueue([Tenant("a", max_queued=2)])
    q.push(1, "a", 1, 1, 0.0)
    q.push(2, "a", 1, 1, 0.0)
    with pytest.raises(Refused) as err:
        q.push(3, "a", 1, 1, 0.0)
    assert err.value.reason == "queue_full" and "2 requests queued" in err.value.message
    q.push(4, "b", 1, 1, 0.0)  # another tenant (default settings) is not affected
    assert q.snapshot()["a"]["rejected"] == {"queue_full": 1}


def test_rate_limit_refuses_with_the_seconds_until_the_bucket_holds_enough():
    q = FairQueue([Tenant("a", tokens_per_s=100, burst_tokens=1000)])
    q.push(1, "a", 500, 900, 0.0)
    with pytest.raises(Refused) as err:
        q.push(2, "a", 500, 600, 0.0)  # 100 left: 500 more needs 5 s
    assert err.value.reason == "rate_limited" and err.value.retry_after_s == 5
    assert "100 tokens/s" in err.value.message
    q.push(3, "a", 500, 600, 5.0)  # refilled by then
    with pytest.raises(Refused) as err:
        q.push(4, "a", 5000, 5000, 100.0)
    assert err.value.reason == "too_large" and err.value.retry_after_s is None
    assert q.snapshot()["a"]["rejected"] == {"rate_limited": 1, "too_large": 1}


def test_a_cancelled_request_leaves_and_gives_its_tokens_back():
    q = FairQueue([Tenant("a", tokens_per_s=10, burst_tokens=100)])
    entry = q.push("x", "a", 80, 100, 0.0)
    assert q.snapshot()["a"]["queued_tokens"] == 80
    assert q.remove(entry) and not q.remove(entry)
    assert len(q) == 0 and q.pop() is None
    assert q.snapshot()["a"] == {
        "priority": 0,
        "tokens_per_s": 10,
        "queued": 0,
        "queued_tokens": 0,
        "dispatched": 0,
        "rejected": {},
    }
    q.push("y", "a", 80, 100, 0.0)  # the bucket was given its 100 back


def test_a_flood_of_cached_prompts_still_pays_for_its_turns():
    """Fully cached requests cost min_cost, not 0: their tenant's turn ends."""
    q = FairQueue(quantum=128, min_cost=64)
    for i in range(10):
        q.push(f"cached{i}", "a", 0, 10, 0.0)
    q.push("light", "b", 100, 100, 0.0)
    assert drain(q).index("light") == 2


def test_token_bucket_refills_at_its_rate_up_to_its_burst():
    b = TokenBucket(rate=10, burst=20)
    assert b.take(20, 0.0) == 0
    assert b.take(5, 0.0) == pytest.approx(0.5)
    assert b.take(5, 0.5) == 0
    assert b.take(20, 100.0) == 0  # never above the burst


def test_cost_is_the_prompt_less_what_the_router_expects_cached():
    router = Router("round-robin", 2, block_size=4)
    prompt = list(range(20))
    assert uncached_tokens(router, prompt) == 20
    router.route(0, prompt[:12], [ReplicaLoad(0, 0, 0), ReplicaLoad(1, 0, 0)])
    assert uncached_tokens(router, prompt) == 8


def test_parse_tenant():
    tenant, key = parse_tenant("alice:sk-a:1:2000")
    assert (tenant.name, key, tenant.priority, tenant.tokens_per_s) == ("alice", "sk-a", 1, 2000)
    assert tenant.burst == 20000
    assert parse_tenant("bob:k:0")[0].tokens_per_s is None
    for bad in ("alice", "alice:k", ":k:0", "a:k:x", "a:k:0:-1"):
        with pytest.raises(ValueError):
            parse_tenant(bad)


def test_simulated_noisy_neighbour_keeps_the_light_tenant_within_the_bound():
    from minicb.fleet.tenancy.noisy_neighbour import run

    result = run(size=0.25)
    solo, shared, fair = result["rows"]
    assert result["holds"], result
    # without the fair queue the light tenant waits behind the flood
    assert shared["light_ttft_p99_s"] > result["bound_s"]
    assert solo["light_refused"] == fair["light_refused"] == 0


def test_simulated_fleet_with_a_fair_queue_leaks_nothing():
    from minicb.core.config import EngineConfig
    from minicb.fleet.simulated import SimulatedFleet
    from minicb.fleet.tenancy.noisy_neighbour import tenant_requests
    from minicb.workload import Arrivals

    reqs = sorted(tenant_requests("a", 4, 10, 1) + tenant_requests("b", 4, 10, 2),
                  key=lambda r: r.arrival)  # fmt: skip
    queue = FairQueue([Tenant("a", max_queued=4)])
    fleet = SimulatedFleet("L4:llama-3.1-8b", EngineConfig(max_num_seqs=4), "least-loaded", 2,
                           queue=queue, max_in_flight=2)  # fmt: skip
    fleet.run(Arrivals(reqs))
    assert len(queue) == 0
    assert len(fleet.placed) + len(fleet.refused) == len(reqs)
    assert all(not r.requests and not r.engine.has_unfinished() for r in fleet.replicas)
    snap = queue.snapshot()
    assert snap["a"]["dispatched"] + snap["b"]["dispatched"] == len(fleet.placed)
