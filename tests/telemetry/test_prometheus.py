"""Prometheus exposition: vLLM-style minicb: names, values that match a scripted run, one
registry per engine, an honest fallback if a colon name is ever refused, and after every
step the same figures as prometheus_client's own Counter and Histogram fed event by event."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from minicb.core.engine import LLMEngine
from minicb.core.scheduler import RequestRejected
from minicb.telemetry.prometheus import (
    E2E_BUCKETS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    PrometheusMetrics,
)
from tests.helpers import add, fake_engine


def scripted(prom: PrometheusMetrics, preemption_mode: str = "recompute") -> LLMEngine:
    """Same run as tests/telemetry/test_metrics.py: A, B, C arrive at once; 2 slots; steps of
    known length."""
    engine = fake_engine(
        step_times=[0.25, 0.125, 0.125, 0.5],
        start=1000.0,
        block_size=4,
        max_num_batched_tokens=8,
        max_num_seqs=2,
        preemption_mode=preemption_mode,
    )
    engine.bus.subscribe(prom)
    add(engine, 6, 3, token=1)
    add(engine, 4, 2, token=1)
    add(engine, 2, 1, token=1)
    return engine


def samples(prom: PrometheusMetrics) -> dict[str, float]:
    """name{labels-without-model} -> value, parsed back from the exposition text."""
    out = {}
    for family in text_string_to_metric_families(prom.exposition().decode()):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def test_names_follow_vllm_with_a_minicb_prefix():
    prom = PrometheusMetrics(model_name="tiny")
    text = prom.exposition().decode()
    for name in (
        "minicb:num_requests_running",
        "minicb:num_requests_waiting",
        "minicb:kv_cache_usage_perc",
        "minicb:num_preemptions_total",
        "minicb:prompt_tokens_total",
        "minicb:generation_tokens_total",
        "minicb:time_to_first_token_seconds_bucket",
        "minicb:request_time_per_output_token_seconds_count",
    ):
        assert name in text
    assert 'model_name="tiny"' in text and prom.renamed == {}


def test_values_follow_the_scripted_run():
    prom = PrometheusMetrics()
    engine = scripted(prom)
    s = samples(prom)
    assert s["minicb:num_requests_waiting"] == 3 and s["minicb:num_requests_running"] == 0
    engine.step()  # A and B admitted, C waits for a slot
    s = samples(prom)
    assert (s["minicb:num_requests_running"], s["minicb:num_requests_waiting"]) == (2, 1)
    assert s["minicb:kv_cache_usage_perc"] == pytest.approx(3 / 64)
    engine.run_until_done()
    s = samples(prom)
    assert (s["minicb:num_requests_running"], s["minicb:num_requests_waiting"]) == (0, 0)
    assert s["minicb:kv_cache_usage_perc"] == 0.0
    assert s["minicb:generation_tokens_total"] == 6
    assert s["minicb:prompt_tokens_total"] == 12
    assert s["minicb:iterations_total"] == 4
    assert s["minicb:request_success_total{finished_reason=length}"] == 3
    # TTFT 0.25, 0.375, 1.0; TPOT 0.125 twice; end-to-end 0.5, 0.5, 1.0; queue 0, 0, 0.5
    assert s["minicb:time_to_first_token_seconds_count"] == 3
    assert s["minicb:time_to_first_token_seconds_sum"] == pytest.approx(1.625)
    assert s["minicb:time_to_first_token_seconds_bucket{le=0.25}"] == 1
    assert s["minicb:request_time_per_output_token_seconds_sum"] == pytest.approx(0.25)
    assert s["minicb:inter_token_latency_seconds_count"] == 3
    assert s["minicb:e2e_request_latency_seconds_sum"] == pytest.approx(2.0)
    assert s["minicb:request_queue_time_seconds_sum"] == pytest.approx(0.5)


def test_preemptions_and_aborts_are_counted():
    prom = PrometheusMetrics()
    engine = fake_engine(
        num_kv_blocks=6, step_time=0.1, block_size=4, max_num_batched_tokens=64, max_num_seqs=4
    )
    engine.bus.subscribe(prom)
    preempted = []  # the scheduler's own decisions, to count against
    engine.bus.subscribe(
        lambda es: preempted.extend(d for e in es for d in e.plan.preempted), kinds=["step"]
    )
    for _ in range(3):
        add(engine, 8, 8, token=1)
    victim = add(engine, 2, 2, token=1)
    engine.abort_request(victim)
    engine.run_until_done()
    s = samples(prom)
    assert s["minicb:num_preemptions_total"] == len(preempted) >= 1
    assert s["minicb:request_success_total{finished_reason=abort}"] == 1
    assert s["minicb:num_requests_waiting"] == s["minicb:num_requests_running"] == 0


def test_two_engines_do_not_share_a_registry():
    a, b = PrometheusMetrics("a"), PrometheusMetrics("b")
    scripted(a).run_until_done()
    assert samples(a)["minicb:generation_tokens_total"] == 6
    assert samples(b)["minicb:generation_tokens_total"] == 0


def test_a_refused_colon_name_falls_back_to_underscores(monkeypatch):
    class StrictCounterFamily(CounterMetricFamily):
        """Stands in for a prometheus_client that refuses ':' in metric names."""

        def __init__(self, name, *args, **kwargs):
            if ":" in name:
                raise ValueError(f"invalid metric name {name}")
            super().__init__(name, *args, **kwargs)

    monkeypatch.setattr("minicb.telemetry.prometheus.CounterMetricFamily", StrictCounterFamily)
    prom = PrometheusMetrics()
    assert prom.renamed["minicb:generation_tokens"] == "minicb_generation_tokens"
    text = prom.exposition().decode()
    assert "minicb_generation_tokens_total" in text and "minicb:num_requests_running" in text


# ---- the same figures as prometheus_client's own objects, fed one event at a time ---------
class PerEvent:
    """The reference: prometheus_client's Counter and Histogram (a lock per inc and per
    observe), one call per token and per request, straight from each event as it comes."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        label = {"labelnames": ["model_name"], "registry": self.registry}
        self.tokens = Counter("minicb:generation_tokens", "", **label).labels("")
        self.prompt = Counter("minicb:prompt_tokens", "", **label).labels("")
        self.iterations = Counter("minicb:iterations", "", **label).labels("")
        self.preemptions = Counter("minicb:num_preemptions", "", **label).labels("")
        self.success = Counter(
            "minicb:request_success", "", ["model_name", "finished_reason"], registry=self.registry
        )
        self.rejected = Counter("minicb:request_rejected", "", **label).labels("")
        self.hist = {
            name: Histogram(f"minicb:{name}", "", buckets=b, **label).labels("")
            for name, b in (
                ("time_to_first_token_seconds", TTFT_BUCKETS),
                ("inter_token_latency_seconds", TPOT_BUCKETS),
                ("request_time_per_output_token_seconds", TPOT_BUCKETS),
                ("e2e_request_latency_seconds", E2E_BUCKETS),
                ("request_queue_time_seconds", E2E_BUCKETS),
            )
        }
        self.arrival, self.admitted, self.times = {}, set(), {}

    def __call__(self, events) -> None:
        for e in events:  # one event at a time
            self.one(e)

    def one(self, e) -> None:
        rid, h = getattr(e, "request_id", None), self.hist
        if e.kind == "step":
            self.iterations.inc()
            self.preemptions.inc(len(e.plan.preempted))
            self.prompt.inc(sum(r.num_tokens for r in e.plan.scheduled if r.phase == "prefill"))
        elif e.kind == "arrived":
            self.arrival[rid], self.times[rid] = e.time, []
        elif rid is not None and e.kind != "rejected" and rid not in self.arrival:
            if e.kind in ("finished", "aborted"):  # arrived before we listened: counted
                label = e.finish_reason if e.kind == "finished" else "abort"
                self.success.labels("", label).inc()
        elif e.kind == "admitted" and rid not in self.admitted:
            self.admitted.add(rid)
            h["request_queue_time_seconds"].observe(e.time - self.arrival[rid])
        elif e.kind == "tokens":
            for rid in e.request_ids:
                self.tokens.inc()
                times = self.times.get(rid)
                if times is None:  # arrived before we listened: its times are unknown
                    continue
                if times:
                    h["inter_token_latency_seconds"].observe(e.time - times[-1])
                else:
                    h["time_to_first_token_seconds"].observe(e.time - self.arrival[rid])
                times.append(e.time)
        elif e.kind == "finished":
            self.success.labels("", e.finish_reason).inc()
            h["e2e_request_latency_seconds"].observe(e.time - self.arrival[rid])
            times = self.times[rid]
            if e.num_output_tokens > 1:
                gap = (times[-1] - times[0]) / (e.num_output_tokens - 1)
                h["request_time_per_output_token_seconds"].observe(gap)
        elif e.kind == "aborted":
            self.success.labels("", "abort").inc()
        elif e.kind == "rejected":
            self.rejected.inc()


def parsed(text: str) -> dict[str, float]:
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


# recompute and swap: preempted requests miss steps; speculation: several tokens of one
# request in a step; late: requests that arrived before Prometheus listened are not followed
@pytest.mark.parametrize("mode", ["recompute", "swap", "speculation", "late"])
def test_the_figures_equal_prometheus_clients_own_fed_one_event_at_a_time(mode):
    engine = fake_engine(
        num_kv_blocks=10,
        num_swap_blocks=16 if mode == "swap" else 0,
        step_times=[0.003 * (i % 7 + 1) for i in range(400)],
        block_size=4,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        preemption_mode="swap" if mode == "swap" else "recompute",
        **({"speculative": "ngram", "num_speculative_tokens": 3} if mode == "speculation" else {}),
    )
    prom, reference, preempted, tokens = PrometheusMetrics(), PerEvent(), [], []

    def listen() -> None:
        engine.bus.subscribe(prom)
        engine.bus.subscribe(reference)  # one event at a time
        engine.bus.subscribe(
            lambda es: preempted.extend(d for e in es for d in e.plan.preempted), kinds=["step"]
        )
        engine.bus.subscribe(lambda es: tokens.extend(es), kinds=["tokens"])

    if mode != "late":
        listen()
    ids = [add(engine, 3 + i % 9, 2 + i * 3 % 11, token=1) for i in range(12)]
    with pytest.raises(RequestRejected):
        add(engine, 300, 4)  # longer than the model
    if mode == "late":
        engine.step()  # some running, some with tokens already
        listen()
    checked = 0
    while engine.has_unfinished():
        engine.step()
        if engine.step_count == 2:
            engine.abort_request(ids[5])
        ours, theirs = (
            parsed(prom.exposition().decode()),
            parsed(generate_latest(reference.registry).decode()),
        )
        assert theirs and {k: ours[k] for k in theirs} == theirs  # after every step, exactly
        checked += 1
    assert checked > 10 and (len(preempted) >= 1 or mode == "speculation")
    if mode == "speculation":  # a request with several tokens in one step
        assert any(len(set(e.request_ids)) < len(e.request_ids) for e in tokens)
    rejected = 0 if mode == "late" else 1  # the refusal came before a late listener
    assert ours["minicb:request_rejected_total[('model_name', '')]"] == rejected
