"""Serving metrics, computed from events alone.

``MetricsCollector`` is an event listener (subscribe it to an EventBus, or feed it the
events of a trace); ``summary()`` turns what it saw into one JSON-safe dict. The same
events in the same order give exactly the same figures, live or replayed. Definitions
(docs/events.md has the long form):

- latency, per request: TTFT = first token - arrival; TPOT = (last token - first token) /
  (tokens - 1); inter-token latency (ITL) = gaps between consecutive tokens; end-to-end =
  finished - arrival; queue time = first admission - arrival. Each as count, mean, p50,
  p90, p99 and max (percentiles interpolate linearly, as numpy's default does).
- throughput over the run (first arrival or step to last event), counting finished
  requests: output tokens/s, total (prompt + output) tokens/s, requests/s.
- batch: slot occupancy = rows doing real work / slots available, summed over steps;
  padding waste = padding tokens / tokens computed; token budget use = tokens / budget.
- KV, over the scheduled rows of every step: utilisation = live tokens / token slots of
  the blocks they hold; internal fragmentation = empty slots in each row's last block /
  slots held; reservation waste = whole blocks held beyond the last (static batching
  reserves them up front) / slots held. The three add up to 1. Pool usage = used / total
  blocks after each step.
- prefix cache, in tokens over every admission: queries = tokens looked up, hits = tokens
  found (not computed), of which host hits were found in the host tier and copied back;
  hit rate = hits / queries. Prefill tokens = tokens of prefill rows
  actually computed (what the cache saves).
- fairness: Jain's index over normalised latency (end-to-end / output tokens) of finished
  requests (1 = all equal); longest wait = most time a request spent not running
  (queued, preempted or swapped out).
- goodput under TTFT/TPOT targets: finished requests that met both, per second.
- speculative decoding: draft tokens verified, accepted (kept as output); acceptance rate =
  accepted / drafted; accepted tokens per step = accepted / iterations; tokens per decode
  row = tokens the decode rows produced / decode rows (1 without speculation, at most
  1 + num_speculative_tokens): the mean tokens per request per iteration.

Pure Python: no torch.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from itertools import repeat
from typing import TYPE_CHECKING, Any

# The latency figures and statistics are defined in minicb.core.latency, and the
# listener's dispatch in minicb.telemetry.listener; their names are also importable here.
from minicb.core.latency import (
    distribution,
    e2e,
    jain_index,
    percentile,
    queue_time,
    tpot,
    ttft,
)
from minicb.telemetry.listener import HandlerListener, handlers
from minicb.telemetry.records import RequestRecord, StepTotals
from minicb.telemetry.request_times import RequestTimes
from minicb.telemetry.summary import summarise

if TYPE_CHECKING:
    from minicb.core.events import Event

__all__ = [
    "MetricsCollector",
    "compute_metrics",
    "distribution",
    "e2e",
    "handlers",
    "jain_index",
    "percentile",
    "queue_time",
    "tpot",
    "ttft",
]


# Steps of token times kept before they go onto the records (``MetricsCollector._settle``).
SETTLE_STEPS = 64


class MetricsCollector(HandlerListener):
    """Listens to events; ``summary()`` gives every figure at any moment."""

    def __init__(self) -> None:
        super().__init__()
        # Keyed by (engine generation, request id): ids start again at 0 after a rebuild
        # (a "reset" event), and a run that crosses one must not mix two requests.
        self._requests: dict[tuple[int, int], RequestRecord] = {}
        # Their times: this generation's records, in the one collector of them.
        self.times = RequestTimes()
        self.generation = 0
        self._current: dict[int, RequestRecord] = {}  # this generation's, by request id
        # Their token_times lists, by request id: a step's 256 appends find each list in one
        # dictionary read (``_settle``), not a read of the record and then of its field.
        self._token_times: dict[int, list[float]] = {}
        # Token times not yet on their records: (time, request ids) of each step since the
        # last settle. Appended to the records SETTLE_STEPS steps at a time, or when read.
        self._unsettled: list[tuple[float, list[int]]] = []
        self._settling = threading.Lock()
        self.steps = StepTotals()
        self.rejected = 0
        self.t_min: float | None = None
        self.t_max: float | None = None

    def _seen(self, start: float, end: float) -> None:
        if self.t_min is None or start < self.t_min:
            self.t_min = start
        if self.t_max is None or end > self.t_max:
            self.t_max = end

    def _req(self, event: Any) -> RequestRecord:
        self._seen(event.time, event.time)
        return self._record(event.request_id)

    def _record(self, request_id: int) -> RequestRecord:
        r = self._current.get(request_id)
        if r is None:  # only now: setdefault would build a RequestRecord for every event
            r = self._current[request_id] = RequestRecord(self.times.record(request_id))
            self._requests[(self.generation, request_id)] = r
            self._token_times[request_id] = r.token_times
        return r

    # ---- per-event updates ---------------------------------------------------------------
    def _on_step(self, e: Any) -> None:
        self._seen(e.wall_start, e.wall_end)
        self.times.step(e)
        plan, s = e.plan, self.steps
        s.count += 1
        s.slots += plan.slots_limit
        s.budget_used += plan.budget_used
        s.budget_limit += plan.budget_limit
        s.schedule_s += e.schedule_s
        s.forward_s += e.forward_s
        s.sample_s += e.sample_s
        rows = e.row_sums  # counted once per step for every listener (row_sums.py)
        s.tokens += rows.tokens
        s.padding_tokens += rows.padding_tokens
        s.prefill_tokens += rows.prefill_tokens
        s.useful_rows += rows.useful_rows
        s.decode_rows += rows.decode_rows
        s.drafted_rows += rows.drafted_rows
        s.draft_tokens += rows.draft_tokens
        s.accepted_tokens += rows.accepted_tokens
        s.kv_live += rows.context_tokens
        s.kv_held += rows.blocks * plan.block_size
        s.kv_last_block_slack += rows.last_block_slack
        if plan.kv_total:
            usage = plan.kv_used / plan.kv_total
            s.kv_usage_sum += usage
            s.kv_usage_peak = max(s.kv_usage_peak, usage)
        for d in plan.preempted:
            s.preempted[d.mode or "?"] = s.preempted.get(d.mode or "?", 0) + 1
        s.swapped_out += len(plan.swapped_out)
        s.swapped_in += len(plan.swapped_in)
        s.prefix_query_tokens += plan.prefix_query_tokens
        s.prefix_hit_tokens += plan.prefix_hit_tokens
        s.prefix_host_hit_tokens += plan.prefix_host_hit_tokens

    def _on_arrived(self, e: Any) -> None:
        r = self._req(e)
        r.times = self.times.arrived(e.request_id, e.time, e.num_prompt_tokens)
        r.wait_from = e.time

    def _on_admitted(self, e: Any) -> None:
        r = self._req(e)
        self.times.admitted(e.request_id, e.time)
        r.stop_waiting(e.time)

    def _on_preempted(self, e: Any) -> None:
        self._req(e).wait_from = e.time  # waiting again, for readmission or swap-in

    def _on_swapped_in(self, e: Any) -> None:
        self._req(e).stop_waiting(e.time)

    def _on_tokens(self, e: Any) -> None:
        self._seen(e.time, e.time)
        rids = e.request_ids
        if not all(map(self._token_times.__contains__, rids)):  # one from before we listened
            for request_id in rids:
                self._record(request_id)
        self.times.tokens(rids, e.indexes, e.time)
        self._unsettled.append((e.time, rids))  # the event's own list: read-only, shared
        if len(self._unsettled) >= SETTLE_STEPS:
            self._settle()

    def _settle(self) -> None:
        """Every unsettled token's time onto its request's record, in C, step by step.
        Many steps at once: the same records each step, still in the cache; one step at a
        time they had to be fetched from memory again every step."""
        with self._settling:  # a reader in another thread settles in turn, never between
            unsettled, self._unsettled = self._unsettled, []
            token_times = self._token_times
            for now, rids in unsettled:  # a deque of length 0 consumes the map (itertools)
                deque(map(list.append, map(token_times.__getitem__, rids), repeat(now)), maxlen=0)

    @property
    def requests(self) -> dict[tuple[int, int], RequestRecord]:
        """Every request's record by (engine generation, request id), tokens settled."""
        self._settle()
        return self._requests

    def _on_finished(self, e: Any) -> None:
        self._req(e).stop_waiting(e.time)
        self.times.finished(e)

    def _on_aborted(self, e: Any) -> None:
        r = self._req(e)
        r.aborted = True
        r.stop_waiting(e.time)

    def _on_reset(self, e: Any) -> None:
        self._seen(e.time, e.time)
        self._settle()  # onto the records of the generation that ends here
        self.generation += 1
        self._current, self._token_times = {}, {}
        self.times([e])

    def _on_rejected(self, e: Any) -> None:
        self._seen(e.time, e.time)
        self.rejected += 1

    def summary(
        self, ttft_slo: float | None = None, tpot_slo: float | None = None
    ) -> dict[str, Any]:
        """Every figure (the definitions above), JSON-safe, from what was seen so far."""
        return summarise(self, ttft_slo, tpot_slo)


def compute_metrics(
    events: Iterable[Event], ttft_slo: float | None = None, tpot_slo: float | None = None
) -> dict[str, Any]:
    """The summary of a whole sequence of events (a replayed trace, a test's list)."""
    collector = MetricsCollector()
    collector(list(events))
    return collector.summary(ttft_slo, tpot_slo)
