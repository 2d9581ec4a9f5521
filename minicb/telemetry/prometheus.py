"""Prometheus exposition of the engine's live gauges, counters and latency histograms.

``PrometheusMetrics`` is an event listener that keeps its figures as plain Python numbers
(minicb's own counters and bucket counts) and is itself the Collector of its own
CollectorRegistry (never the global one, so two engines, or two tests, do not clash);
``exposition()`` gives the text for a server's ``/metrics``. Names follow vLLM's
``vllm:`` metrics with a ``minicb:`` prefix, e.g. ``minicb:num_requests_running``,
``minicb:kv_cache_usage_perc``; counters get prometheus_client's ``_total`` suffix.

The requests in flight, and the latency histograms and count gauges they feed, are kept
by a collaborator (request_latencies.py); this listener keeps the counters. Those numbers
are telemetry/metric_values.py's, which says why they are not prometheus_client's own
objects; the text is the same (``tests/telemetry/test_prometheus.py`` compares it with
prometheus_client's objects fed one event at a time).

About the colon: the Prometheus data model allows ``:`` in metric names (it is meant for
recording rules, which is why vLLM's use of it is debated), and prometheus_client accepts
it in metric names under both its legacy and its UTF-8 validation; it rejects ``:`` in
label names, so labels here are plain (``model_name``, ``finished_reason``). If a future
prometheus_client refuses a colon name, the metric is exposed with ``_`` instead and
listed in ``renamed``, rather than failing the engine.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Sample

from minicb.telemetry.listener import HandlerListener
from minicb.telemetry.metric_values import Counter, Gauge, Histogram
from minicb.telemetry.request_latencies import RequestLatencies

# Bucket edges (seconds), close to vLLM's, widened at the slow end for CPU runs.
# fmt: off
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                1.0, 2.5, 5.0)
E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0)
# fmt: on
# prometheus_client's own switch for the ``_created`` series, honoured the same way.
CREATED = os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "False").lower() not in (
    "true",
    "1",
    "t",
)  # fmt: skip


# (attribute, name, help) of each metric, in the order of the exposition.
GAUGES = (
    ("running", "minicb:num_requests_running", "Requests holding a batch slot."),
    ("waiting", "minicb:num_requests_waiting", "Requests waiting to be admitted."),
    ("swapped", "minicb:num_requests_swapped", "Requests swapped out to CPU."),
    ("kv_usage", "minicb:kv_cache_usage_perc", "KV-cache block usage, 1 means 100 percent."),
)
COUNTERS = (
    ("preemptions", "minicb:num_preemptions", "Preemptions, recompute and swap."),
    ("prompt_tokens", "minicb:prompt_tokens", "Prefill tokens computed, recomputes included."),
    ("generation_tokens", "minicb:generation_tokens", "Tokens generated."),
    # As vLLM's: the hit rate is hits / queries, both in tokens, over any window.
    ("prefix_queries", "minicb:prefix_cache_queries",
     "Prompt tokens looked up in the prefix cache."),
    ("prefix_hits", "minicb:prefix_cache_hits", "Prompt tokens found in the prefix cache."),
    # The same hits by where they were found: on the device, or in the host tier (copied
    # back; the host tier's kv_offload_blocks). device + host = prefix_cache_hits.
    ("prefix_tier_hits", "minicb:prefix_cache_hits_by_tier",
     "Prompt tokens found in the prefix cache, by tier (device or host memory)."),
    ("iterations", "minicb:iterations", "Engine iterations."),
    # As vLLM's spec_decode counters, by proposer (ngram, draft, early_exit): over any
    # window, acceptance rate = accepted / draft tokens, and mean accepted length (tokens a
    # drafted row gets a round) = 1 + accepted / drafts.
    ("spec_drafts", "minicb:spec_decode_num_drafts",
     "Decode rows that verified speculative drafts, by proposer."),
    ("spec_draft_tokens", "minicb:spec_decode_num_draft_tokens",
     "Speculative tokens proposed and verified, by proposer."),
    ("spec_accepted_tokens", "minicb:spec_decode_num_accepted_tokens",
     "Speculative tokens kept as output, by proposer."),
    ("success", "minicb:request_success", "Finished requests."),  # by finished_reason
    ("rejected", "minicb:request_rejected", "Requests refused at the door."),
    # set by the server (a step that raises emits no event): note_failures
    ("failed_steps", "minicb:engine_failed_steps",
     "Engine steps that raised; their requests ended with an error."),
)  # fmt: skip
LAST_ERROR = ("minicb:engine_last_error_info", "The latest failed step's error, as a label.")
HISTOGRAMS = (
    ("ttft", "minicb:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS),
    ("itl", "minicb:inter_token_latency_seconds", "Gap between tokens.", TPOT_BUCKETS),
    ("tpot", "minicb:request_time_per_output_token_seconds", "Mean gap per request.",
     TPOT_BUCKETS),
    ("e2e", "minicb:e2e_request_latency_seconds", "Arrival to finish.", E2E_BUCKETS),
    ("queue", "minicb:request_queue_time_seconds", "Arrival to admission.", E2E_BUCKETS),
)  # fmt: skip
# counters with a label beside model_name
LABELLED = {
    "success": "finished_reason",
    "prefix_tier_hits": "tier",
    **dict.fromkeys(("spec_drafts", "spec_draft_tokens", "spec_accepted_tokens"), "proposer"),
}


class PrometheusMetrics(HandlerListener):
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str = "", registry: CollectorRegistry | None = None) -> None:
        self.renamed: dict[str, str] = {}  # names refused with ':' -> the names used instead
        self.model_name = model_name
        # the requests in flight: the count gauges and the latency histograms
        self.requests = RequestLatencies(
            **{attr: Histogram(bounds) for attr, _, _, bounds in HISTOGRAMS}
        )
        self.kv_usage = Gauge()  # also set by the server before a scrape
        self.last_error: str | None = None  # likewise: note_failures
        for attr, *_ in COUNTERS:
            setattr(self, attr, Counter(labelled=attr in LABELLED))
        self._last_error_name = self._name(GaugeMetricFamily, LAST_ERROR[0])
        self._names = {
            attr: self._name(family, name)
            for kinds, family in ((GAUGES, GaugeMetricFamily), (COUNTERS, CounterMetricFamily),
                                  (HISTOGRAMS, HistogramMetricFamily))
            for attr, name, *_ in kinds
        }  # fmt: skip
        super().__init__()
        self.registry = registry if registry is not None else CollectorRegistry()
        self.registry.register(self)

    def _name(self, family: type, name: str) -> str:
        """``name``, or with ``_`` for ``:`` if this prometheus_client refuses the colon."""
        try:
            family(name, "", labels=["model_name"])
        except ValueError:
            self.renamed[name] = name.replace(":", "_")
            return self.renamed[name]
        return name

    def note_failures(self, failed_steps: int, last_error: str | None) -> None:
        """The engine's failed steps so far and the latest one's error, which the server
        keeps (a step that raises emits no event); set before a scrape."""
        self.failed_steps.values[""] = float(failed_steps)
        self.last_error = last_error

    def exposition(self) -> bytes:
        """The text format for ``GET /metrics``; serve it with ``content_type``."""
        return generate_latest(self.registry)

    # ---- the Collector: read by a scrape, in its own thread ------------------------------
    def collect(self) -> Iterator[Metric]:
        model = [self.model_name]
        for attr, _, doc in GAUGES:
            value = self.kv_usage.value if attr == "kv_usage" else self.requests.counts[attr]
            family = GaugeMetricFamily(self._names[attr], doc, labels=["model_name"])
            family.add_metric(model, value)
            yield family
        for attr, _, doc in COUNTERS:
            yield self._counter(attr, doc, model)
        if self.last_error is not None:
            labels = ["model_name", "error"]
            family = GaugeMetricFamily(self._last_error_name, LAST_ERROR[1], labels=labels)
            family.add_metric([*model, self.last_error[:200]], 1.0)
            yield family
        for attr, _, doc, _ in HISTOGRAMS:
            hist: Histogram = getattr(self.requests, attr)
            family = HistogramMetricFamily(self._names[attr], doc, labels=["model_name"])
            family.add_metric(model, hist.cumulative(), hist.sum)
            if CREATED:
                labels = {"model_name": self.model_name}
                family.samples.append(Sample(family.name + "_created", labels, hist.created))
            yield family

    def _counter(self, attr: str, doc: str, model: list[str]) -> CounterMetricFamily:
        counter: Counter = getattr(self, attr)
        label = LABELLED.get(attr)
        names = ["model_name"] if label is None else ["model_name", label]
        family = CounterMetricFamily(self._names[attr], doc, labels=names)
        values, created = dict(counter.values), dict(counter.created)  # copies: one C call each
        for key, value in values.items():
            labels = model if label is None else [*model, key]
            family.add_metric(labels, value, created.get(key) if CREATED else None)
        return family

    # ---- events (HandlerListener calls _on_<kind>) ---------------------------------------
    def _on_step(self, e: Any) -> None:
        plan = e.plan
        self.requests.step(e)
        self.iterations.inc()
        self.kv_usage.set(plan.kv_used / plan.kv_total if plan.kv_total else 0.0)
        if plan.preempted:
            self.preemptions.inc(len(plan.preempted))
        rows = e.row_sums  # counted once per step for every listener (row_sums.py)
        if rows.prefill_tokens:
            self.prompt_tokens.inc(rows.prefill_tokens)
        if plan.prefix_query_tokens:
            self.prefix_queries.inc(plan.prefix_query_tokens)
            self.prefix_hits.inc(plan.prefix_hit_tokens)
            host = plan.prefix_host_hit_tokens
            self.prefix_tier_hits.inc(plan.prefix_hit_tokens - host, label="device")
            self.prefix_tier_hits.inc(host, label="host")
        if rows.draft_tokens:
            proposer = plan.proposer or ""  # a trace written before plans named it: ""
            self.spec_drafts.inc(rows.drafted_rows, label=proposer)
            self.spec_draft_tokens.inc(rows.draft_tokens, label=proposer)
            self.spec_accepted_tokens.inc(rows.accepted_tokens, label=proposer)

    # Request counts follow each request's own events, so they are right between steps too
    # (an arrival, an abort) and after the last step; requests that arrived before this
    # listener subscribed are not counted.
    def _on_arrived(self, e: Any) -> None:
        self.requests.arrived(e.request_id, e.time, e.num_prompt_tokens)

    def _on_admitted(self, e: Any) -> None:
        self.requests.admitted(e.request_id)

    def _on_preempted(self, e: Any) -> None:
        self.requests.move(e.request_id, "swapped" if e.mode == "swap" else "waiting")

    def _on_swapped_in(self, e: Any) -> None:
        self.requests.move(e.request_id, "running")

    def _on_tokens(self, e: Any) -> None:
        self.generation_tokens.inc(len(e.request_ids))
        self.requests.tokens(e.request_ids, e.time)

    def _on_finished(self, e: Any) -> None:
        self.success.inc(label=e.finish_reason or "")
        self.requests.finished(e.request_id, e.time, e.num_output_tokens)

    def _on_aborted(self, e: Any) -> None:
        self.success.inc(label="abort")
        self.requests.move(e.request_id, None)

    def _on_rejected(self, e: Any) -> None:
        self.rejected.inc()
