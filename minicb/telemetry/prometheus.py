"""Prometheus exposition of the engine's live gauges, counters and latency histograms.

``PrometheusMetrics`` is an event listener that keeps prometheus_client metrics in its own
CollectorRegistry (never the global one, so two engines, or two tests, do not clash);
``exposition()`` gives the text for a server's ``/metrics``. Names follow vLLM's
``vllm:`` metrics with a ``minicb:`` prefix, e.g. ``minicb:num_requests_running``,
``minicb:kv_cache_usage_perc``; counters get prometheus_client's ``_total`` suffix.

About the colon: the Prometheus data model allows ``:`` in metric names (it is meant for
recording rules, which is why vLLM's use of it is debated), and prometheus_client accepts
it in metric names under both its legacy and its UTF-8 validation; it rejects ``:`` in
label names, so labels here are plain (``model_name``, ``finished_reason``). If a future
prometheus_client refuses a colon name, the metric is registered with ``_`` instead and
listed in ``renamed``, rather than failing the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from minicb.telemetry.events import Event
from minicb.telemetry.metrics import e2e, handlers, queue_time, tpot, ttft

# Bucket edges (seconds), close to vLLM's, widened at the slow end for CPU runs.
# fmt: off
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                1.0, 2.5, 5.0)
E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0)
# fmt: on


@dataclass
class _Live:
    """What the histograms need to remember about a request in flight."""

    arrival: float
    state: str = "waiting"  # "waiting", "running" or "swapped"
    admitted: bool = False
    first: float | None = None  # first token time
    last: float = 0.0  # latest token time


class PrometheusMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str = "", registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.renamed: dict[str, str] = {}  # names refused with ':' -> the names used instead
        self.model_name = model_name
        self._live: dict[int, _Live] = {}  # requests in flight
        self._counts = {"waiting": 0, "running": 0, "swapped": 0}
        gauge, counter, hist = (self._factory(c) for c in (Gauge, Counter, Histogram))
        self.running = gauge("minicb:num_requests_running", "Requests holding a batch slot.")
        self.waiting = gauge("minicb:num_requests_waiting", "Requests waiting to be admitted.")
        self.swapped = gauge("minicb:num_requests_swapped", "Requests swapped out to CPU.")
        self.kv_usage = gauge(
            "minicb:kv_cache_usage_perc", "KV-cache block usage, 1 means 100 percent."
        )
        self.preemptions = counter("minicb:num_preemptions", "Preemptions, recompute and swap.")
        self.prompt_tokens = counter(
            "minicb:prompt_tokens", "Prefill tokens computed, recomputes included."
        )
        self.generation_tokens = counter("minicb:generation_tokens", "Tokens generated.")
        # As vLLM's: the hit rate is hits / queries, both in tokens, over any window.
        self.prefix_queries = counter(
            "minicb:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        self.prefix_hits = counter(
            "minicb:prefix_cache_hits", "Prompt tokens found in the prefix cache."
        )
        self.iterations = counter("minicb:iterations", "Engine iterations.")
        # As vLLM's spec_decode counters: acceptance rate = accepted / draft tokens.
        self.spec_drafts = counter(
            "minicb:spec_decode_num_drafts", "Decode rows that verified speculative drafts."
        )
        self.spec_draft_tokens = counter(
            "minicb:spec_decode_num_draft_tokens", "Speculative tokens proposed and verified."
        )
        self.spec_accepted_tokens = counter(
            "minicb:spec_decode_num_accepted_tokens", "Speculative tokens kept as output."
        )
        self.success = counter("minicb:request_success", "Finished requests.", ["finished_reason"])
        self.rejected = counter("minicb:request_rejected", "Requests refused at the door.")
        self.ttft = hist(
            "minicb:time_to_first_token_seconds", "Time to first token.", buckets=TTFT_BUCKETS
        )
        self.itl = hist(
            "minicb:inter_token_latency_seconds", "Gap between tokens.", buckets=TPOT_BUCKETS
        )
        self.tpot = hist(
            "minicb:request_time_per_output_token_seconds",
            "Mean gap per request.",
            buckets=TPOT_BUCKETS,
        )
        self.e2e = hist(
            "minicb:e2e_request_latency_seconds", "Arrival to finish.", buckets=E2E_BUCKETS
        )
        self.queue = hist(
            "minicb:request_queue_time_seconds", "Arrival to admission.", buckets=E2E_BUCKETS
        )
        self._handlers = handlers(self)

    def _factory(self, cls: type) -> Callable[..., Any]:
        """Makes metrics of ``cls`` labelled with the model name, colon name if allowed."""

        def make(name: str, doc: str, labels: list[str] | None = None, **kw: Any) -> Any:
            labelnames = ["model_name", *(labels or [])]
            try:
                metric = cls(name, doc, labelnames, registry=self.registry, **kw)
            except ValueError:
                fallback = name.replace(":", "_")
                metric = cls(fallback, doc, labelnames, registry=self.registry, **kw)
                self.renamed[name] = fallback
            # Bind the model label once: looking a child up per event costs a lock and a dict.
            return metric if labels else metric.labels(model_name=self.model_name)

        return make

    def exposition(self) -> bytes:
        """The text format for ``GET /metrics``; serve it with ``content_type``."""
        return generate_latest(self.registry)

    # ---- events --------------------------------------------------------------------------
    def __call__(self, event: Event) -> None:
        handler = self._handlers.get(event.kind)
        if handler is not None:
            handler(event)

    def _on_step(self, e: Any) -> None:
        plan = e.plan
        self.iterations.inc()
        self.kv_usage.set(plan.kv_used / plan.kv_total if plan.kv_total else 0.0)
        if plan.preempted:
            self.preemptions.inc(len(plan.preempted))
        prefill = sum(r.num_tokens for r in plan.scheduled if r.phase == "prefill")
        if prefill:
            self.prompt_tokens.inc(prefill)
        if plan.prefix_query_tokens:
            self.prefix_queries.inc(plan.prefix_query_tokens)
            self.prefix_hits.inc(plan.prefix_hit_tokens)
        drafted = plan.num_draft_tokens
        if drafted:
            self.spec_drafts.inc(sum(1 for r in plan.scheduled if r.num_draft_tokens))
            self.spec_draft_tokens.inc(drafted)
            self.spec_accepted_tokens.inc(plan.num_accepted_tokens)

    # Request counts follow each request's own events, so they are right between steps too
    # (an arrival, an abort) and after the last step; requests that arrived before this
    # listener subscribed are not counted.
    def _move(self, request_id: int, state: str | None) -> _Live | None:
        """Move a request to ``state`` (None: gone) and refresh the three count gauges."""
        live = self._live.get(request_id)
        if live is None:
            return None
        self._counts[live.state] -= 1
        if state is None:
            del self._live[request_id]
        else:
            live.state = state
            self._counts[state] += 1
        self._show_counts()
        return live

    def _show_counts(self) -> None:
        self.running.set(self._counts["running"])
        self.waiting.set(self._counts["waiting"])
        self.swapped.set(self._counts["swapped"])

    def _on_arrived(self, e: Any) -> None:
        self._live[e.request_id] = _Live(e.time)
        self._counts["waiting"] += 1
        self._show_counts()

    def _on_admitted(self, e: Any) -> None:
        live = self._move(e.request_id, "running")
        if live is not None and not live.admitted:  # a readmission after preemption is not queueing
            live.admitted = True
            self.queue.observe(queue_time(live.arrival, e.time))

    def _on_preempted(self, e: Any) -> None:
        self._move(e.request_id, "swapped" if e.mode == "swap" else "waiting")

    def _on_swapped_in(self, e: Any) -> None:
        self._move(e.request_id, "running")

    def _on_token(self, e: Any) -> None:
        self.generation_tokens.inc()
        live = self._live.get(e.request_id)
        if live is None:  # arrived before we started listening
            return
        if live.first is None:
            live.first = e.time
            self.ttft.observe(ttft(live.arrival, e.time))
        else:
            self.itl.observe(e.time - live.last)
        live.last = e.time

    def _on_finished(self, e: Any) -> None:
        self.success.labels(model_name=self.model_name, finished_reason=e.finish_reason or "").inc()
        live = self._move(e.request_id, None)
        if live is None:
            return
        self.e2e.observe(e2e(live.arrival, e.time))
        if e.num_output_tokens > 1 and live.first is not None:
            self.tpot.observe(tpot(live.first, live.last, e.num_output_tokens))

    def _on_aborted(self, e: Any) -> None:
        self.success.labels(model_name=self.model_name, finished_reason="abort").inc()
        self._move(e.request_id, None)

    def _on_rejected(self, e: Any) -> None:
        self.rejected.inc()
