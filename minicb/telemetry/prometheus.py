"""Prometheus exposition of the engine's live gauges, counters and latency histograms.

``PrometheusMetrics`` is an event listener that keeps its figures as plain Python numbers
(minicb's own counters and bucket counts) and is itself the Collector of its own
CollectorRegistry (never the global one, so two engines, or two tests, do not clash);
``exposition()`` gives the text for a server's ``/metrics``. Names follow vLLM's
``vllm:`` metrics with a ``minicb:`` prefix, e.g. ``minicb:num_requests_running``,
``minicb:kv_cache_usage_perc``; counters get prometheus_client's ``_total`` suffix.

Those numbers are telemetry/metric_values.py's, which says why they are not
prometheus_client's own objects; the text is the same (``tests/telemetry/test_prometheus.py``
compares it with prometheus_client's objects fed one event at a time).

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
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Sample

from minicb.core.latency import e2e, queue_time, tpot, ttft
from minicb.telemetry.listener import HandlerListener
from minicb.telemetry.metric_values import Counter, Gauge, Histogram

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


@dataclass
class _Live:
    """What the histograms need to remember about a request in flight."""

    arrival: float
    state: str = "waiting"  # "waiting", "running" or "swapped"
    admitted: bool = False
    first: float | None = None  # first token time


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
    # back; EngineConfig.kv_offload_blocks). device + host = prefix_cache_hits.
    ("prefix_tier_hits", "minicb:prefix_cache_hits_by_tier",
     "Prompt tokens found in the prefix cache, by tier (device or host memory)."),
    ("iterations", "minicb:iterations", "Engine iterations."),
    # As vLLM's spec_decode counters: acceptance rate = accepted / draft tokens.
    ("spec_drafts", "minicb:spec_decode_num_drafts",
     "Decode rows that verified speculative drafts."),
    ("spec_draft_tokens", "minicb:spec_decode_num_draft_tokens",
     "Speculative tokens proposed and verified."),
    ("spec_accepted_tokens", "minicb:spec_decode_num_accepted_tokens",
     "Speculative tokens kept as output."),
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
LABELLED = {"success": "finished_reason", "prefix_tier_hits": "tier"}


class PrometheusMetrics(HandlerListener):
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str = "", registry: CollectorRegistry | None = None) -> None:
        self.renamed: dict[str, str] = {}  # names refused with ':' -> the names used instead
        self.model_name = model_name
        self._live: dict[int, _Live] = {}  # requests in flight
        # Their latest token's time (``_latest``), kept so that a step costs what changed:
        # those that had a token in the latest tokens event are ``_prev`` (that event was at
        # ``_prev_time``); ``_last`` holds the time for the others, set when one misses a
        # step. At steady state every row's gap is the time since the previous step, one
        # value: a few set operations in C, not a dictionary write per token.
        self._prev: set[int] = set()
        self._prev_time = 0.0
        self._last: dict[int, float] = {}
        self._counts = {"waiting": 0, "running": 0, "swapped": 0}
        self.kv_usage = Gauge()  # also set by the server before a scrape
        self.last_error: str | None = None  # likewise: note_failures
        for attr, *_ in COUNTERS:
            setattr(self, attr, Counter(labelled=attr in LABELLED))
        for attr, _, _, bounds in HISTOGRAMS:
            setattr(self, attr, Histogram(bounds))
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
            value = self.kv_usage.value if attr == "kv_usage" else self._counts[attr]
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
            hist: Histogram = getattr(self, attr)
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
            self.spec_drafts.inc(rows.drafted_rows)
            self.spec_draft_tokens.inc(rows.draft_tokens)
            self.spec_accepted_tokens.inc(rows.accepted_tokens)

    # Request counts follow each request's own events, so they are right between steps too
    # (an arrival, an abort) and after the last step; requests that arrived before this
    # listener subscribed are not counted.
    def _move(self, request_id: int, state: str | None) -> _Live | None:
        """Move a request to ``state`` (None: gone): the three count gauges read the counts."""
        live = self._live.get(request_id)
        if live is None:
            return None
        self._counts[live.state] -= 1
        if state is None:
            del self._live[request_id]
            self._last.pop(request_id, None)
            self._prev.discard(request_id)
        else:
            live.state = state
            self._counts[state] += 1
        return live

    def _on_arrived(self, e: Any) -> None:
        self._live[e.request_id] = _Live(e.time)
        self._counts["waiting"] += 1

    def _on_admitted(self, e: Any) -> None:
        live = self._move(e.request_id, "running")
        if live is not None and not live.admitted:  # a readmission after preemption is not queueing
            live.admitted = True
            self.queue.observe(queue_time(live.arrival, e.time))

    def _on_preempted(self, e: Any) -> None:
        self._move(e.request_id, "swapped" if e.mode == "swap" else "waiting")

    def _on_swapped_in(self, e: Any) -> None:
        self._move(e.request_id, "running")

    def _latest(self, request_id: int) -> float | None:
        """When the request's latest token came; None before its first."""
        if request_id in self._prev:
            return self._prev_time
        return self._last.get(request_id)

    def _on_tokens(self, e: Any) -> None:
        rids, now, prev, live = e.request_ids, e.time, self._prev, self._live
        self.generation_tokens.inc(len(rids))
        current = set(rids)
        if not current <= live.keys():  # requests from before we listened are not followed
            current &= live.keys()
        if len(current) < len(rids):  # one of them repeats (speculation) or is not followed
            self._tokens_one_by_one(rids, now)
        else:
            back = current - prev  # first tokens, and requests that missed the last step
            firsts = [r for r in back if live[r].first is None]
            resumed = back.difference(firsts)
            if resumed:  # their gaps differ: every gap in row order, for the same sum
                gap = {r: now - self._last[r] for r in resumed}
                since_prev = now - self._prev_time
                gaps = [gap.get(r, since_prev) for r in rids if r in prev or r in gap]
                self.itl.observe_all(gaps)
            elif len(rids) > len(firsts):
                self.itl.observe_repeated(now - self._prev_time, len(rids) - len(firsts))
            for request_id in sorted(firsts, key=rids.index):  # in row order
                live[request_id].first = now
                self.ttft.observe(ttft(live[request_id].arrival, now))
        for request_id in prev - current:  # missed this step: its time is kept apart
            self._last[request_id] = self._prev_time
        self._prev, self._prev_time = current, now

    def _tokens_one_by_one(self, rids: list[int], now: float) -> None:
        """The step's tokens in order, where a request may have several (speculation) or
        be one we do not follow; ``_on_tokens`` then moves the step's requests to _prev."""
        this_step: set[int] = set()
        for request_id in rids:
            live = self._live.get(request_id)
            if live is None:
                continue
            if live.first is None:
                live.first = now
                self.ttft.observe(ttft(live.arrival, now))
            else:  # the gap since its previous token, 0 for a second token of this step
                latest = now if request_id in this_step else self._latest(request_id)
                self.itl.observe(now - latest)
            this_step.add(request_id)

    def _on_finished(self, e: Any) -> None:
        self.success.inc(label=e.finish_reason or "")
        latest = self._latest(e.request_id)
        live = self._move(e.request_id, None)
        if live is None:
            return
        self.e2e.observe(e2e(live.arrival, e.time))
        if e.num_output_tokens > 1 and live.first is not None and latest is not None:
            self.tpot.observe(tpot(live.first, latest, e.num_output_tokens))

    def _on_aborted(self, e: Any) -> None:
        self.success.inc(label="abort")
        self._move(e.request_id, None)

    def _on_rejected(self, e: Any) -> None:
        self.rejected.inc()
