"""RequestLatencies: the requests in flight, followed through their events into the
Prometheus latency histograms (TTFT, ITL, TPOT, end to end, queue time) and the counts
of requests waiting, running and swapped.

Prometheus's listener (prometheus.py) hands each request event here; this keeps what the
histograms need of each request (its arrival, whether it was admitted yet, its first
token) and observes each figure the moment it is known, with the one definition of each
(minicb.core.latency). A step costs what changed, not a write per token: at steady state
every row's inter-token gap is the time since the previous step, one value observed
``len(rows)`` times. Pure Python, in the engine thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from minicb.core.latency import e2e, queue_time, tpot, ttft
from minicb.telemetry.metric_values import Histogram


@dataclass
class _Live:
    """What the histograms need to remember about a request in flight."""

    arrival: float
    state: str = "waiting"  # "waiting", "running" or "swapped"
    admitted: bool = False
    first: float | None = None  # first token time


class RequestLatencies:
    def __init__(
        self, ttft: Histogram, itl: Histogram, tpot: Histogram, e2e: Histogram, queue: Histogram
    ) -> None:
        self.ttft, self.itl, self.tpot, self.e2e, self.queue = ttft, itl, tpot, e2e, queue
        self.counts = {"waiting": 0, "running": 0, "swapped": 0}  # the count gauges
        self._live: dict[int, _Live] = {}  # requests in flight
        # Their latest token's time (``_latest``), kept so that a step costs what changed:
        # those that had a token in the latest tokens event are ``_prev`` (that event was at
        # ``_prev_time``); ``_last`` holds the time for the others, set when one misses a
        # step. At steady state every row's gap is the time since the previous step, one
        # value: a few set operations in C, not a dictionary write per token.
        self._prev: set[int] = set()
        self._prev_time = 0.0
        self._last: dict[int, float] = {}

    def move(self, request_id: int, state: str | None) -> _Live | None:
        """Move a request to ``state`` (None: gone): the three count gauges read the counts.
        A request that arrived before the listener subscribed is not followed."""
        live = self._live.get(request_id)
        if live is None:
            return None
        self.counts[live.state] -= 1
        if state is None:
            del self._live[request_id]
            self._last.pop(request_id, None)
            self._prev.discard(request_id)
        else:
            live.state = state
            self.counts[state] += 1
        return live

    def arrived(self, request_id: int, time: float) -> None:
        self._live[request_id] = _Live(time)
        self.counts["waiting"] += 1

    def admitted(self, request_id: int, time: float) -> None:
        live = self.move(request_id, "running")
        if live is not None and not live.admitted:  # a readmission after preemption is not queueing
            live.admitted = True
            self.queue.observe(queue_time(live.arrival, time))

    def _latest(self, request_id: int) -> float | None:
        """When the request's latest token came; None before its first."""
        if request_id in self._prev:
            return self._prev_time
        return self._last.get(request_id)

    def tokens(self, rids: list[int], now: float) -> None:
        """A step's tokens (``rids``: one request id per token, in row order) at ``now``."""
        prev, live = self._prev, self._live
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
        be one we do not follow; ``tokens`` then moves the step's requests to _prev."""
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

    def finished(self, request_id: int, time: float, num_output_tokens: int) -> None:
        latest = self._latest(request_id)
        live = self.move(request_id, None)
        if live is None:
            return
        self.e2e.observe(e2e(live.arrival, time))
        if num_output_tokens > 1 and live.first is not None and latest is not None:
            self.tpot.observe(tpot(live.first, latest, num_output_tokens))
