"""The fleet at data-centre scale, SIMULATED (minicb/fleet/simulated.py): the same router
decides as for hand-fed loads, time runs in order, autoscaling waits for start-up, and
the reproductions' shapes hold at a small size."""

import time

import pytest

from minicb.bench.all_reproductions import render, render_html, run_all
from minicb.chat_workload import ChatSessions, chat_conversations
from minicb.core.config import EngineConfig
from minicb.fleet import fleet_reproductions
from minicb.fleet.autoscale import Autoscaler, FleetState
from minicb.fleet.router import Router
from minicb.fleet.simulated import SimulatedFleet, gpu_price
from minicb.workload import Arrivals, from_lengths, with_arrivals

PROFILE = "L4:smollm2-135m"
CONFIG = EngineConfig(max_num_seqs=32, max_num_batched_tokens=512)


def chats(n=12, turns=3):
    return chat_conversations(
        n,
        turns=turns,
        system_len=128,
        num_system_prompts=4,
        user_mean=32,
        answer_mean=16,
        rate=4.0,
        think_mean_s=0.2,
        seed=3,
    )


def test_chat_turns_extend_the_previous_turn_and_share_system_prompts():
    convs = chats()
    for c in convs:
        for before, after in zip(c.turns, c.turns[1:], strict=False):
            assert after.prompt[: len(before.prompt)] == before.prompt
            assert len(after.prompt) > len(before.prompt) + before.max_tokens
    assert convs[0].turns[0].prompt[:128] == convs[4].turns[0].prompt[:128]
    assert convs[0].turns[0].prompt[:128] != convs[1].turns[0].prompt[:128]


def test_chat_sessions_release_a_turn_only_after_the_answer():
    convs = chats(n=2)
    sessions = ChatSessions(convs)
    first = sessions.due(100.0)
    assert [r.group for r in first] == ["chat-0", "chat-1"] and sessions.next_time is None
    sessions.answered(first[1], 50.0)
    assert sessions.next_time == pytest.approx(50.0 + convs[1].think_s[0])
    (second,) = sessions.due(60.0)
    assert second.prompt == convs[1].turns[1].prompt
    assert second.arrival == pytest.approx(50.0 + convs[1].think_s[0])


def test_a_turn_sends_back_the_answer_the_model_gave():
    convs = chats(n=1)
    sessions = ChatSessions(convs)
    (first,) = sessions.due(0.0)
    answer = [7] * 5  # what the model said, not the workload's answer
    sessions.answered(first, 1.0, answer)
    (second,) = sessions.due(10.0)
    written = convs[0].turns
    user = written[1].prompt[len(written[0].prompt) + written[0].output_tokens :]
    assert second.prompt == first.prompt + answer + user
    assert second.output_tokens == written[1].output_tokens


def test_a_simulated_replica_finds_the_previous_answer_of_a_conversation_cached():
    """One replica, one conversation: turn 2's prompt holds turn 1's prompt and the
    answer the replica decoded, so the prefix cache holds all but the part of the last
    block still being filled (the answer's blocks were cached as it was decoded)."""
    convs = chats(n=1, turns=2)
    fleet = SimulatedFleet(PROFILE, CONFIG, "round-robin", 1)
    routed = []
    fleet.bus.subscribe(routed.extend, kinds=["routed"])
    hits = []
    fleet.replicas[0].engine.bus.subscribe(
        lambda events: hits.extend(e.plan.prefix_hit_tokens for e in events), kinds=["step"]
    )
    fleet.run(ChatSessions(convs))
    first = convs[0].turns[0]
    held = len(first.prompt) + first.output_tokens - 1  # the last token's KV is never written
    block = CONFIG.block_size
    assert sum(hits) >= (held // block) * block > (len(first.prompt) // block) * block


def test_the_router_decides_alike_for_simulated_replicas_and_hand_fed_loads():
    fleet = SimulatedFleet(PROFILE, CONFIG, "prefix-aware", 3)
    seen = []
    fleet.bus.subscribe(seen.extend, kinds=["routed"])
    result = fleet.run(ChatSessions(chats()))
    assert result["simulated"] is True and result["summary"]["requests"]["finished"] == 36
    replay = Router("prefix-aware", 3, block_size=CONFIG.block_size)
    hand_fed = [replay.route(rid, prompt, loads) for rid, prompt, loads in fleet.told]
    assert hand_fed == fleet.routes
    # each decision is also a routed event, with its reason and the fleet's virtual time
    assert [(e.request_id, e.replica, e.reason) for e in seen] == [
        (r.request_id, r.replica, r.reason) for r in fleet.routes
    ]
    assert [e.time for e in seen] == sorted(e.time for e in seen)
    assert len({r.replica for r in fleet.routes}) == 3  # it spread the conversations
    assert any(r.cached_tokens >= 128 for r in fleet.routes)  # later turns followed
    assert any(load.waiting or load.running for _, _, loads in fleet.told for load in loads)


def test_requests_run_in_time_order_across_replicas():
    reqs = with_arrivals(from_lengths([64] * 40, [16] * 40), [i * 0.01 for i in range(40)])
    fleet = SimulatedFleet(PROFILE, CONFIG, "round-robin", 4)
    fleet.run(Arrivals(reqs))
    for replica in fleet.replicas:
        records = replica.metrics.requests.values()
        assert len(records) == 10
        # no replica computed a request's first token before the request arrived
        assert all(r.arrival <= r.token_times[0] for r in records)


def test_cost_is_gpu_hours_at_the_catalogue_price():
    fleet = SimulatedFleet(PROFILE, CONFIG.with_(tensor_parallel_size=2), "least-loaded", 2)
    result = fleet.run(Arrivals(from_lengths([32] * 8, [8] * 8)))
    duration = result["summary"]["duration_s"]
    assert result["gpu_hours"] == pytest.approx(2 * 2 * duration / 3600)
    assert result["usd"] == pytest.approx(result["gpu_hours"] * gpu_price(fleet.profile))
    assert result["usd_per_m_output_tokens"] == pytest.approx(result["usd"] / 64 * 1e6)


def state(**kw):
    base = dict(now=10.0, ready=2, starting=0, waiting=0, attainment=None, idle_s={})
    return FleetState(**{**base, **kw})


def test_the_autoscaler_adds_on_a_queue_or_missed_targets_one_at_a_time():
    scaler = Autoscaler(min_replicas=1, max_replicas=3, max_waiting_per_replica=4)
    assert scaler.decide(state(waiting=9)).action == "add"
    assert "4.5 each" in scaler.decide(state(waiting=9)).reason
    assert scaler.decide(state(waiting=8)) is None
    assert "SLO attainment 80.0%" in scaler.decide(state(attainment=0.8)).reason
    assert scaler.decide(state(waiting=99, starting=1)) is None  # wait for the new one
    assert scaler.decide(state(waiting=99, ready=3)) is None  # at the maximum


def test_the_autoscaler_waits_a_window_after_a_replica_is_ready():
    scaler = Autoscaler(min_replicas=1, max_replicas=4, window_s=20)
    assert scaler.decide(state(attainment=0.5, since_ready_s=10.0)) is None  # settling
    assert scaler.decide(state(attainment=0.5, since_ready_s=25.0)).action == "add"
    assert scaler.decide(state(attainment=0.5)).action == "add"  # none added yet


def test_the_autoscaler_removes_the_longest_idle_down_to_the_minimum():
    scaler = Autoscaler(min_replicas=1, max_replicas=3, idle_s=30)
    decision = scaler.decide(state(idle_s={0: 31.0, 1: 45.0}))
    assert (decision.action, decision.replica) == ("remove", 1)
    assert scaler.decide(state(idle_s={0: 20.0})) is None
    assert scaler.decide(state(ready=1, idle_s={0: 99.0})) is None
    with pytest.raises(ValueError, match="min_replicas"):
        Autoscaler(min_replicas=3, max_replicas=2)


@pytest.fixture(scope="module")
def fleet_results():
    """The three fleet reproductions at a small size, as ``minicb bench --simulate`` runs them;
    the router's with the two policies the test compares (all five cost the fast tier 3 s)."""
    start = time.perf_counter()
    router = fleet_reproductions.router(0.15, policies=("round-robin", "prefix-aware"))
    router.update(simulated=True, wall_s=time.perf_counter() - start)  # what run_all adds
    return {"router": router, **run_all(["replicas", "autoscale"], "H100:llama-3.1-8b", size=0.15)}


def test_a_doubled_load_adds_replicas_and_they_help(fleet_results):
    result = fleet_results["autoscale"]
    rows = {r["system"]: r for r in result["rows"]}
    adds = [s for s in result["scaling"] if s["action"] == "add"]
    assert adds, "the doubled load added no replica"
    scaled = rows["autoscaled from 1"]
    assert scaled["replicas_max"] > 1
    assert scaled["slo_attainment"] >= rows["fixed, 1 replica"]["slo_attainment"]
    assert scaled["gpu_hours"] < 4 * rows["fixed, 1 replica"]["gpu_hours"]


def test_an_unstarted_replica_is_told_to_the_router_as_not_alive():
    scaler = Autoscaler(min_replicas=1, max_replicas=2, max_waiting_per_replica=1,
                        interval_s=0.5, window_s=5, idle_s=1e9)  # fmt: skip
    # a slow step (an 8B model on an L4): two slots cannot keep up, a queue forms
    fleet = SimulatedFleet("L4:llama-3.1-8b", CONFIG.with_(max_num_seqs=2), "least-loaded",
                           1, autoscaler=scaler, startup_s=3.0)  # fmt: skip
    reqs = with_arrivals(from_lengths([64] * 30, [64] * 30), [i * 0.3 for i in range(30)])
    fleet.run(Arrivals(reqs))
    (added,) = [r for r in fleet.replicas if r.index == 1]
    assert added.ready_at == pytest.approx(added.added + 3.0)
    for (_, _, loads), route in zip(fleet.told, fleet.routes, strict=True):
        told = {load.replica: load for load in loads}
        assert told[route.replica].alive
    assert any(route.replica == 1 for route in fleet.routes)


def test_prefix_aware_routing_computes_fewer_prompt_tokens_than_round_robin(fleet_results):
    rows = {r["policy"]: r for r in fleet_results["router"]["rows"]}
    rr, pa = rows["round-robin"], rows["prefix-aware"]
    assert pa["hit_rate"] > rr["hit_rate"]
    assert pa["prefill_tokens"] < rr["prefill_tokens"]
    assert pa["finished"] == rr["finished"]


def test_replicas_against_one_big_batch_run_the_same_requests(fleet_results):
    rows = fleet_results["replicas"]["rows"]
    assert [r["finished"] for r in rows] == [90, 90]
    assert rows[0]["replicas_max"] == 4 and rows[1]["replicas_max"] == 1
    assert rows[0]["gpu_hours"] > 0 and rows[1]["gpu_hours"] > 0


def test_the_fleet_report_says_simulated_and_draws_each(fleet_results):
    markdown = render(fleet_results)
    for title in ("prefix-aware against round-robin", "one big batch", "a load that doubles"):
        assert title in markdown
    assert markdown.count("(SIMULATED, ") == 3 and "SGLang" in markdown
    page = render_html(fleet_results, markdown)
    for chart in ("Router policies", "Replicas against one big batch", "Autoscaled replicas"):
        assert "SIMULATED" in page and chart in page
    series = fleet_results["autoscale"]["replicas_over_time"]
    assert series["replicas"][0] == 1 and max(series["replicas"]) > 1
