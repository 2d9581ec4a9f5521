"""RequestTimes: the one collector of a request's times, folded from the engine's events.

Why this record and this collector. A request's times (arrival, first admission, first
token, end, cached prompt tokens, the engine's own clock at arrival and at the first
token) are the core's ``RequestMetrics``: a finished request's output must carry them, and
the core imports nothing above itself, so the record is the core's. The engine stamps the
records of its own requests in the step (minicb/core/output_processor.py). Everyone else
has only the events: a server's listeners (a request's stream, Prometheus, the metrics
summary, the page's folder), a scenario's sides, a replayed trace. They read the record
this collector builds from those events, with the record's own stamps, so the two agree
field for field (tests/telemetry/test_request_times.py) and no reader keeps a copy of the
times of its own.

What it hears: ``arrived`` opens a record (the engine's own clock then is the latest
step's ``busy_s``); a ``step`` stamps the requests its plan admitted (at its start, with
the prompt tokens they found cached) and sets the engine's own clock; ``admitted`` stamps
the same time (events made outside an engine's steps have only that); ``tokens`` stamps
first tokens (index 0, at the event's time, the step's end), as ``first_token`` does for a
listener that does not hear the tokens; ``finished`` the end and the counts. A ``reset``
(an engine rebuilt: ids start again at 0) starts an empty table. Records stay until
``forget``: a reader that follows only requests in flight forgets them as they end; the
metrics summary keeps every one. Pure Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from minicb.core.request import RequestMetrics

# The kinds of events the collector folds.
KINDS = ("arrived", "step", "admitted", "tokens", "finished", "reset")


class RequestTimes:
    """Request id -> its record (``RequestMetrics``), filled from the events heard."""

    def __init__(self, late: bool = True) -> None:
        """``late``: keep a record too for a request heard of after its arrival (a listener
        that joined mid-run); False: only for those it heard or was told arrive."""
        self.records: dict[int, RequestMetrics] = {}
        self.late = late
        self.busy_s = 0.0  # the engine's own clock at the latest step's end

    def __call__(self, events: Sequence[Any]) -> None:
        """A bus listener (subscribe it with ``kinds=KINDS``)."""
        for e in events:
            kind = e.kind
            if kind == "step":
                self.step(e)
            elif kind == "tokens":
                self.tokens(e.request_ids, e.indexes, e.time)
            elif kind == "arrived":
                self.arrived(e.request_id, e.time, e.num_prompt_tokens)
            elif kind == "admitted":
                self.admitted(e.request_id, e.time)
            elif kind == "first_token":
                self.first_token(e.request_id, e.time)
            elif kind == "finished":
                self.finished(e)
            elif kind == "reset":
                self.records = {}

    def record(self, request_id: int) -> RequestMetrics:
        """Its record; one that arrived before the collector listened has no arrival."""
        r = self.records.get(request_id)
        if r is None:
            r = self.records[request_id] = RequestMetrics(None)
        return r

    def _followed(self, request_id: int) -> RequestMetrics | None:
        """The record an event stamps: None for a request not followed (``late``)."""
        r = self.records.get(request_id)
        return self.record(request_id) if r is None and self.late else r

    def forget(self, request_id: int) -> RequestMetrics | None:
        return self.records.pop(request_id, None)

    # ---- one method per kind of event ---------------------------------------------------
    def arrived(
        self, request_id: int, time: float | None, num_prompt_tokens: int
    ) -> RequestMetrics:
        r = self.records[request_id] = RequestMetrics(time, num_prompt_tokens=num_prompt_tokens)
        r.arrival_busy_s = self.busy_s
        return r

    def step(self, e: Any) -> None:
        for d in e.plan.admitted:
            r = self._followed(d.request_id)
            if r is not None:
                r.scheduled(e.wall_start, d.num_cached_tokens)
        self.busy_s = e.busy_s

    def admitted(self, request_id: int, time: float) -> None:
        """An admitted event: its step has stamped it already (with the prompt tokens it
        found cached), unless the events were made outside an engine's steps (a baseline
        measured elsewhere, bench/transformers_systems.py), which tell no cached tokens."""
        r = self._followed(request_id)
        if r is not None:
            r.scheduled(time, 0)

    def first_token(self, request_id: int, time: float) -> None:
        """A first_token event: the time its step's tokens event tells too (a listener that
        does not hear the tokens, a page's folder at a GPU's scale, has only this)."""
        r = self._followed(request_id)
        if r is not None:
            r.first_token(time, self.busy_s)

    def tokens(self, request_ids: list[int], indexes: list[int], time: float) -> None:
        """A step's tokens: those of index 0 are first tokens (the rule of the first_token
        event), found by list.index, in C: a step has hundreds of tokens, few first."""
        row = -1
        try:
            while True:
                row = indexes.index(0, row + 1)
                self.first_token(request_ids[row], time)
        except ValueError:
            return

    def finished(self, e: Any) -> RequestMetrics | None:
        r = self._followed(e.request_id)
        if r is None:
            return None
        r.ended(e.time)
        r.num_prompt_tokens = e.num_prompt_tokens
        r.num_generated_tokens = e.num_output_tokens
        r.num_preemptions = e.num_preemptions
        r.num_draft_tokens = e.num_draft_tokens
        r.num_accepted_tokens = e.num_accepted_tokens
        return r


def continued(first: RequestMetrics, later: RequestMetrics) -> RequestMetrics:
    """The whole journey of a request that went on in another engine (disaggregated
    serving: ``first`` is its record on the prefill engine, ``later`` on the decode
    engine): its arrival, prompt, first admission and first token are the first engine's,
    its end and counts the other's, but for its tokens: those of both engines (the decode
    engine was given the first token as part of its prompt, so it counts only the rest)."""
    return replace(
        later,
        num_generated_tokens=first.num_generated_tokens + later.num_generated_tokens,
        arrival_time=first.arrival_time,
        first_scheduled_time=first.first_scheduled_time,
        first_token_time=first.first_token_time,
        num_cached_tokens=first.num_cached_tokens,
        num_prompt_tokens=first.num_prompt_tokens,
        arrival_busy_s=first.arrival_busy_s,
        first_token_busy_s=first.first_token_busy_s,
    )
