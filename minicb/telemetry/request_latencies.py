"""RequestLatencies: the requests in flight, followed through their events into the
Prometheus latency histograms (TTFT, ITL, TPOT, end to end, queue time) and the counts
of requests waiting, running and swapped.

Prometheus's listener (prometheus.py) hands each request event here. A request's times
are its record (``RequestMetrics``) in the one collector of them (request_times.py), kept
while it is in flight; this keeps only where each request is (waiting, running, swapped)
and observes each figure the moment it is known, with the one definition of each
(minicb.core.latency). A step costs what changed, not a write per token: at steady state
every row's inter-token gap is the time since the previous step, one value observed
``len(rows)`` times. Pure Python, in the engine thread.
"""

from __future__ import annotations

from typing import Any

from minicb.core.latency import e2e, queue_time, tpot, ttft
from minicb.core.request import RequestMetrics
from minicb.telemetry.metric_values import Histogram
from minicb.telemetry.request_times import RequestTimes


class RequestLatencies:
    def __init__(
        self, ttft: Histogram, itl: Histogram, tpot: Histogram, e2e: Histogram, queue: Histogram
    ) -> None:
        self.ttft, self.itl, self.tpot, self.e2e, self.queue = ttft, itl, tpot, e2e, queue
        self.counts = {"waiting": 0, "running": 0, "swapped": 0}  # the count gauges
        self.times = RequestTimes(late=False)  # the records of the requests followed
        # where each request followed is: "waiting", "running" or "swapped"
        self._state: dict[int, str] = {}
        # Their latest token's time (``_latest``), kept so that a step costs what changed:
        # those that had a token in the latest tokens event are ``_prev`` (that event was at
        # ``_prev_time``); ``_last`` holds the time for the others, set when one misses a
        # step. At steady state every row's gap is the time since the previous step, one
        # value: a few set operations in C, not a dictionary write per token.
        self._prev: set[int] = set()
        self._prev_time = 0.0
        self._last: dict[int, float] = {}

    def move(self, request_id: int, state: str | None) -> RequestMetrics | None:
        """Move a request to ``state`` (None: gone, and its record with it): the three
        count gauges read the counts. A request that arrived before the listener
        subscribed is not followed: None."""
        old = self._state.get(request_id)
        if state is None:
            record = self.times.forget(request_id)
            if old is None:
                return None
            del self._state[request_id]
            self._last.pop(request_id, None)
            self._prev.discard(request_id)
        elif old is None:
            return None
        else:
            record = self.times.records[request_id]
            self._state[request_id] = state
            self.counts[state] += 1
        self.counts[old] -= 1
        return record

    def arrived(self, request_id: int, time: float, num_prompt_tokens: int) -> None:
        self.times.arrived(request_id, time, num_prompt_tokens)
        self._state[request_id] = "waiting"
        self.counts["waiting"] += 1

    def step(self, e: Any) -> None:
        """A step's first admissions give their queue times (a readmission after
        preemption is not queueing), in the order it admitted them."""
        records, followed = self.times.records, self._state
        for d in e.plan.admitted:
            if d.request_id in followed and records[d.request_id].first_scheduled_time is None:
                self.queue.observe(queue_time(records[d.request_id].arrival_time, e.wall_start))
        self.times.step(e)

    def admitted(self, request_id: int) -> None:
        self.move(request_id, "running")

    def _latest(self, request_id: int) -> float | None:
        """When the request's latest token came; None before its first."""
        if request_id in self._prev:
            return self._prev_time
        return self._last.get(request_id)

    def tokens(self, rids: list[int], now: float) -> None:
        """A step's tokens (``rids``: one request id per token, in row order) at ``now``."""
        prev, records = self._prev, self.times.records
        current = set(rids)
        followed = self._state.keys()
        if not current <= followed:  # requests from before we listened are not followed
            current &= followed
        if len(current) < len(rids):  # one of them repeats (speculation) or is not followed
            self._tokens_one_by_one(rids, now)
        else:
            back = current - prev  # first tokens, and requests that missed the last step
            firsts = [r for r in back if records[r].first_token_time is None]
            resumed = back.difference(firsts)
            if resumed:  # their gaps differ: every gap in row order, for the same sum
                gap = {r: now - self._last[r] for r in resumed}
                since_prev = now - self._prev_time
                gaps = [gap.get(r, since_prev) for r in rids if r in prev or r in gap]
                self.itl.observe_all(gaps)
            elif len(rids) > len(firsts):
                self.itl.observe_repeated(now - self._prev_time, len(rids) - len(firsts))
            for request_id in sorted(firsts, key=rids.index):  # in row order
                self._first_token(records[request_id], now)
        for request_id in prev - current:  # missed this step: its time is kept apart
            self._last[request_id] = self._prev_time
        self._prev, self._prev_time = current, now

    def _tokens_one_by_one(self, rids: list[int], now: float) -> None:
        """The step's tokens in order, where a request may have several (speculation) or
        be one we do not follow; ``tokens`` then moves the step's requests to _prev."""
        this_step: set[int] = set()
        for request_id in rids:
            if request_id not in self._state:
                continue
            record = self.times.records[request_id]
            if record.first_token_time is None:
                self._first_token(record, now)
            else:  # the gap since its previous token, 0 for a second token of this step
                latest = now if request_id in this_step else self._latest(request_id)
                self.itl.observe(now - latest)
            this_step.add(request_id)

    def _first_token(self, record: RequestMetrics, now: float) -> None:
        record.first_token(now, self.times.busy_s)
        self.ttft.observe(ttft(record.arrival_time, now))

    def finished(self, request_id: int, time: float, num_output_tokens: int) -> None:
        latest = self._latest(request_id)
        record = self.move(request_id, None)
        if record is None:
            return
        self.e2e.observe(e2e(record.arrival_time, time))
        first = record.first_token_time
        if num_output_tokens > 1 and first is not None and latest is not None:
            self.tpot.observe(tpot(first, latest, num_output_tokens))
