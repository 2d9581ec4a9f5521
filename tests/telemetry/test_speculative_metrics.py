"""Speculative decoding's figures, worked out by hand on one scripted request: the step
event's rows, the finished event, the metrics summary, Prometheus, and a trace replay.

The request: prompt 3 4 5 6 7 8 3, max_tokens 7, up to 3 drafts a step; the fake model
says 4 5 6 99 8 3 4.

- step 1: the prompt; token 4.
- step 2: "3 4" occurred at 0: drafts 5 6 7; the model says 5 6 99: 2 accepted, then 99.
- step 3: 99 never occurred before: no draft; token 8.
- step 4: "8" occurred at 5: max_tokens leaves room for 1 draft: 3; accepted, bonus 4.

So 3 decode rows, 2 drafted, 4 draft tokens, 3 accepted, 7 tokens in 4 steps.
"""

from __future__ import annotations

import pytest

from minicb import SamplingParams
from minicb.telemetry.event_json import from_dict, to_dict
from minicb.telemetry.metrics import MetricsCollector, compute_metrics
from minicb.telemetry.prometheus import PrometheusMetrics
from tests.helpers import fake_engine
from tests.telemetry.test_prometheus import samples

MODEL = [4, 5, 6, 99, 8, 3, 4]


def _run():
    engine = fake_engine(speculative="ngram", num_speculative_tokens=3, step_time=0.5)
    engine.runner.token_fn = lambda rid, i: MODEL[i]
    collector, prom, events = MetricsCollector(), PrometheusMetrics(), []
    for listener in (collector, prom, events.extend):
        engine.bus.subscribe(listener)
    params = SamplingParams(max_tokens=7, temperature=0.0)
    engine.add_request([3, 4, 5, 6, 7, 8, 3], params)
    outs = engine.run_until_done()
    return outs[0], collector, prom, events


def test_rows_and_the_finished_event_carry_the_counts():
    out, _, _, events = _run()
    assert out.token_ids == MODEL
    rows = [e.plan.scheduled[0] for e in events if e.kind == "step"]
    assert [(r.num_draft_tokens, r.num_accepted_tokens) for r in rows] == [
        (0, 0),
        (3, 2),
        (0, 0),
        (1, 1),
    ]
    # a fully accepted draft ends in a bonus token; the proposer is named where rows drafted
    assert [r.num_bonus_tokens for r in rows] == [0, 0, 0, 1]
    steps = [e for e in events if e.kind == "step"]
    assert [e.plan.proposer for e in steps] == [None, "ngram", None, "ngram"]
    assert [from_dict(to_dict(e)).plan.proposer for e in steps] == [None, "ngram", None, "ngram"]
    finished = next(e for e in events if e.kind == "finished")
    assert (finished.num_draft_tokens, finished.num_accepted_tokens) == (4, 3)
    assert (out.metrics.num_draft_tokens, out.metrics.num_accepted_tokens) == (4, 3)


def test_the_summary_gives_acceptance_rate_and_tokens_per_row():
    _, collector, _, events = _run()
    spec = collector.summary()["speculative"]
    assert spec == {
        "drafted_rows": 2,
        "draft_tokens": 4,
        "accepted_tokens": 3,
        "acceptance_rate": pytest.approx(3 / 4),
        "accepted_tokens_per_step": pytest.approx(3 / 4),
        "tokens_per_decode_row": pytest.approx(6 / 3),  # the 3 decode rows gave 3, 1 and 2 tokens
    }
    # a replayed trace gives the same figures: the counts survive the dict form
    replayed = compute_metrics([from_dict(to_dict(e)) for e in events])
    assert replayed["speculative"] == spec


def test_prometheus_counts_drafts_and_accepted_tokens():
    _, _, prom, _ = _run()
    s = samples(prom)
    drafts = s["minicb:spec_decode_num_drafts_total{proposer=ngram}"]
    draft_tokens = s["minicb:spec_decode_num_draft_tokens_total{proposer=ngram}"]
    accepted = s["minicb:spec_decode_num_accepted_tokens_total{proposer=ngram}"]
    assert (drafts, draft_tokens, accepted) == (2, 4, 3)
    assert s["minicb:generation_tokens_total"] == 7
    # what a dashboard works out from them: the acceptance rate, and the mean accepted
    # length (tokens a drafted row got a round: 3 at step 2, 2 at step 4)
    assert accepted / draft_tokens == pytest.approx(3 / 4)
    assert 1 + accepted / drafts == pytest.approx((3 + 2) / 2)


def test_prometheus_keeps_each_proposers_counts_apart():
    """The same steps, once as n-gram drafts and once as a draft model's (relabelled):
    two series per counter, each with its own proposer's counts."""
    _, _, _, events = _run()
    prom = PrometheusMetrics()
    for e in events:
        prom([e])
        if e.kind == "step" and e.plan.proposer:
            twin = from_dict(to_dict(e))
            twin.plan.proposer = "draft"
            prom([twin])
    s = samples(prom)
    for proposer in ("ngram", "draft"):
        assert s[f"minicb:spec_decode_num_drafts_total{{proposer={proposer}}}"] == 2
        assert s[f"minicb:spec_decode_num_draft_tokens_total{{proposer={proposer}}}"] == 4
        assert s[f"minicb:spec_decode_num_accepted_tokens_total{{proposer={proposer}}}"] == 3


def test_without_speculation_every_decode_row_gives_one_token():
    engine = fake_engine()
    collector = MetricsCollector()
    engine.bus.subscribe(collector)
    engine.add_request([3, 4, 3, 4], SamplingParams(max_tokens=5, temperature=0.0))
    engine.run_until_done()
    spec = collector.summary()["speculative"]
    assert spec["draft_tokens"] == 0 and spec["acceptance_rate"] is None
    assert spec["tokens_per_decode_row"] == 1.0
