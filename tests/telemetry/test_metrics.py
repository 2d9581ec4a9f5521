"""Metrics from events, checked against figures worked out by hand for scripted runs.

The runs use the real engine and schedulers over FakeRunner, whose steps take scripted
times on a VirtualClock (tests/helpers.py: fake_engine), so every timestamp is known.
Block size 4, a token budget of 8 and 2 slots; three requests arrive together at t=1000:
A (6-token prompt, 3 new tokens), B (4-token prompt, 2 new), C (2-token prompt, 1 new).
"""

from __future__ import annotations

import pytest

from minicb.core.events import EngineReset
from minicb.core.request_events import (
    RequestAdmitted,
    RequestArrived,
    RequestFinished,
    RequestPreempted,
    RequestSwappedIn,
    StepTokens,
)
from minicb.telemetry.metrics import (
    MetricsCollector,
    compute_metrics,
    distribution,
    jain_index,
    percentile,
)
from tests.helpers import add, fake_engine

approx = pytest.approx


def scripted_run(batching: str, step_times: list[float]) -> dict:
    engine = fake_engine(
        step_times=step_times,
        start=1000.0,
        batching=batching,
        block_size=4,
        max_num_batched_tokens=8,
        max_num_seqs=2,
    )
    collector = MetricsCollector()
    engine.bus.subscribe(collector)
    add(engine, 6, 3, token=1)  # A
    add(engine, 4, 2, token=1)  # B
    add(engine, 2, 1, token=1)  # C
    engine.run_until_done()
    assert not engine.runner.steps_left, "the run took a different number of steps than worked out"
    return collector.summary(ttft_slo=0.4, tpot_slo=0.125)


def test_continuous_run_matches_hand_figures():
    # step 1 (1000 -> 1000.25): A prefills 6 (token 1), B prefills a 2-token chunk; C: no slot
    # step 2 (-> 1000.375): A decodes (token 2), B prefills its last 2 (token 1)
    # step 3 (-> 1000.5): A decodes (token 3, done), B decodes (token 2, done)
    # step 4 (-> 1001.0): C admitted, prefills 2 (token 1, done)
    m = scripted_run("continuous", [0.25, 0.125, 0.125, 0.5])
    lat = m["latency"]
    # TTFT: A 0.25, B 0.375, C 1.0
    assert lat["ttft_s"] == approx(
        {"count": 3, "mean": 1.625 / 3, "p50": 0.375, "p90": 0.875, "p99": 0.9875, "max": 1.0}
    )
    assert lat["tpot_s"]["count"] == 2 and lat["tpot_s"]["mean"] == approx(0.125)  # A and B
    assert lat["itl_s"]["count"] == 3 and lat["itl_s"]["max"] == approx(0.125)
    assert lat["e2e_s"] == approx(
        {"count": 3, "mean": 2 / 3, "p50": 0.5, "p90": 0.9, "p99": 0.99, "max": 1.0}
    )
    assert lat["queue_s"]["max"] == approx(0.5) and lat["queue_s"]["p50"] == 0.0  # C waited
    assert m["duration_s"] == approx(1.0)
    assert m["throughput"] == approx(
        {"output_tokens_per_s": 6.0, "total_tokens_per_s": 18.0, "requests_per_s": 3.0}
    )
    b = m["batch"]
    assert b["steps"] == 4
    assert b["slot_occupancy"] == approx(7 / 8)  # rows 2, 2, 2, 1 of 2 slots
    assert b["padding_waste"] == 0.0
    assert b["token_budget_use"] == approx(15 / 32)  # 8 + 3 + 2 + 2 tokens of 4 x 8
    assert b["mean_forward_s"] == approx(0.25)
    # rows (context, blocks): (6,2) (2,1) | (7,2) (4,1) | (8,2) (5,2) | (2,1)
    # live 34 of 11 blocks x 4 = 44 slots; empty slots in last blocks 2+2+1+0+0+3+2 = 10
    kv = m["kv"]
    assert kv["utilisation"] == approx(34 / 44)
    assert kv["internal_fragmentation"] == approx(10 / 44)
    assert kv["reservation_waste"] == 0.0
    assert kv["mean_pool_usage"] == approx((3 + 3 + 0 + 0) / 4 / 64)  # read after each step
    assert kv["peak_pool_usage"] == approx(3 / 64)
    assert m["preemptions"]["total"] == 0
    # normalised latency: A 0.5/3, B 0.5/2, C 1.0/1
    x = [0.5 / 3, 0.5 / 2, 1.0]
    assert m["fairness"]["jain_index"] == approx(sum(x) ** 2 / (3 * sum(v * v for v in x)))
    assert m["fairness"]["longest_wait_s"] == approx(0.5)
    assert m["fairness"]["longest_wait_request"] == 2
    # targets TTFT <= 0.4 and TPOT <= 0.125: A and B meet them, C (TTFT 1.0) does not
    assert m["goodput"] == approx(
        {
            "ttft_slo_s": 0.4,
            "tpot_slo_s": 0.125,
            "requests": 2,
            "fraction": 2 / 3,
            "requests_per_s": 2.0,
        }
    )


def test_static_run_matches_hand_figures():
    # step 1: batch {A, B} reserves 3 + 2 blocks; A prefills 6 (token 1), B a 2-token chunk
    # step 2: B prefills its last 2 (token 1); A waits, the batch still prefills
    # step 3: A token 2, B token 2 (B done)
    # step 4: A token 3 (done), B is a padding row; the batch ends
    # step 5: C forms a new batch (1 block), prefills 2 (token 1, done)
    m = scripted_run("static", [0.125] * 5)
    b = m["batch"]
    assert b["steps"] == 5
    assert b["slot_occupancy"] == approx(7 / 10)  # useful rows 2, 1, 2, 1, 1
    assert b["padding_waste"] == approx(1 / 16)  # tokens 8, 2, 2, 2 (1 padding), 2
    # rows (context, blocks held): (6,3) (2,2) | (4,2) | (7,3) (5,2) | (8,3) (5,2 padding) | (2,1)
    kv = m["kv"]
    assert kv["utilisation"] == approx(39 / 72)
    assert kv["internal_fragmentation"] == approx(13 / 72)
    assert kv["reservation_waste"] == approx(20 / 72)
    lat = m["latency"]
    assert lat["ttft_s"]["p50"] == approx(0.25)  # A 0.125, B 0.25, C 0.625
    assert lat["e2e_s"]["max"] == approx(0.625)
    # A and B leave together when the batch ends, whatever their own last token
    assert lat["e2e_s"]["p50"] == approx(0.5)


def test_waits_count_preemption_and_swap_time():
    ev = [
        RequestArrived(
            time=0.0,
            request_id=1,
            prompt=None,
            num_prompt_tokens=4,
            max_tokens=2,
            priority=0,
            params={},
        ),
        RequestAdmitted(time=1.0, request_id=1, step=1, reason="admitted"),
        RequestPreempted(time=2.0, request_id=1, step=2, mode="recompute", reason="no blocks"),
        RequestAdmitted(time=4.0, request_id=1, step=3, reason="admitted again"),
        RequestPreempted(time=5.0, request_id=1, step=4, mode="swap", reason="no blocks"),
        RequestSwappedIn(time=5.5, request_id=1, step=5, reason="blocks free"),
        StepTokens(time=6.0, step=5, request_ids=[1], token_ids=[3], indexes=[0], texts=["a"]),
        StepTokens(time=7.0, step=6, request_ids=[1], token_ids=[3], indexes=[1], texts=["b"]),
        RequestFinished(
            time=7.0,
            request_id=1,
            step=6,
            finish_reason="length",
            reason="done",
            num_prompt_tokens=4,
            num_output_tokens=2,
            num_preemptions=2,
        ),
    ]
    m = compute_metrics(ev)
    assert m["fairness"]["longest_wait_s"] == approx(1.0 + 2.0 + 0.5)
    assert m["latency"]["queue_s"]["max"] == approx(1.0)  # first admission only
    assert m["latency"]["ttft_s"]["max"] == approx(6.0)
    assert m["latency"]["tpot_s"]["max"] == approx(1.0)


def test_preemptions_are_counted_from_steps():
    engine = fake_engine(
        num_kv_blocks=6, step_time=0.1, block_size=4, max_num_batched_tokens=64, max_num_seqs=4
    )
    collector = MetricsCollector()
    engine.bus.subscribe(collector)
    steps = []
    engine.bus.subscribe(steps.extend, kinds=["step"])
    for n in (8, 8, 8):
        add(engine, n, 8, token=1)
    engine.run_until_done()
    m = collector.summary()
    preempted = sum(len(s.plan.preempted) for s in steps)
    assert preempted > 0, "the scenario was meant to run out of KV blocks"
    assert m["preemptions"]["total"] == m["preemptions"]["recompute"] == preempted
    assert m["requests"]["finished"] == 3 and m["requests"]["tokens_generated"] == 24


def test_statistics_helpers():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert distribution([])["mean"] is None
    assert jain_index([1.0, 1.0, 1.0]) == 1.0
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == approx(0.25)


def test_empty_and_partial_runs_do_not_crash():
    assert MetricsCollector().summary()["throughput"]["requests_per_s"] is None
    # a token of a request whose arrival we never saw (listener joined late) is tolerated
    m = compute_metrics(
        [StepTokens(time=1.0, step=1, request_ids=[9], token_ids=[1], indexes=[3], texts=[""])]
    )
    assert m["requests"]["arrived"] == 0 and m["latency"]["ttft_s"]["count"] == 0


def test_a_rebuild_starts_new_requests_instead_of_mixing_them_with_the_old():
    engine = fake_engine(step_times=[0.5] * 20, start=1000.0, block_size=4)
    collector = MetricsCollector()
    engine.bus.subscribe(collector)
    add(engine, 4, 2, token=1)
    engine.run_until_done()
    engine = engine.rebuilt(engine.config.with_(max_num_seqs=2))
    rid = add(engine, 4, 3, token=1)
    assert rid == 0  # the same id as the first engine's request
    engine.run_until_done()
    m = collector.summary()
    assert (m["requests"]["arrived"], m["requests"]["finished"]) == (2, 2)
    assert m["requests"]["tokens_generated"] == 5
    # each request's first token came one 0.5 s prefill step after its own arrival
    assert m["latency"]["ttft_s"]["count"] == 2
    assert m["latency"]["ttft_s"]["mean"] == approx(0.5)


def test_token_times_settled_many_steps_at_once_are_those_of_every_token_in_order(
    monkeypatch,
):
    """The collector puts token times onto the records SETTLE_STEPS steps at a time (or when
    read): every record still gets each of its tokens' times, in order, across a settle
    boundary, a reset (an engine rebuilt: request ids start again) and requests that arrived
    before it listened."""
    import minicb.telemetry.metrics as metrics_module

    monkeypatch.setattr(metrics_module, "SETTLE_STEPS", 5)
    engine = fake_engine(step_time=0.25, max_num_seqs=3)
    early = add(engine, 4, 9)  # arrives before the collector listens
    collector, seen = MetricsCollector(), []
    engine.bus.subscribe(collector)
    engine.bus.subscribe(seen.extend)
    for n in (3, 5, 7):
        add(engine, n, 6 + n)
    engine.run_until_done()
    engine.bus.emit(EngineReset(time=engine.clock(), info={}))  # a new generation begins
    later = [add(engine, n, 4 + n) for n in (2, 6)]
    engine.run_until_done()
    expected: dict[tuple[int, int], list[float]] = {}
    generation = 0
    for e in seen:
        if e.kind == "reset":
            generation += 1
        elif e.kind == "tokens":
            for rid in e.request_ids:
                expected.setdefault((generation, rid), []).append(e.time)
    got = {key: r.token_times for key, r in collector.requests.items() if r.token_times}
    assert got == expected
    assert (0, early) in got and all((1, rid) in got for rid in later)
    assert sum(map(len, got.values())) > 2 * 5  # more tokens than one settle holds
