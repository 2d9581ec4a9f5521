"""RequestHistory: each request's life as a page draws it, kept for a page that joins late.

A page that opens mid-run (or falls behind and is sent a fresh view) must draw the requests
the engine holds and the latest that ended, each on its timeline row, without the events
it missed. So the frame folder (frames.py, ``StepFolder``) keeps, for each request: what it
is (prompt, lengths, the first step it could run in), its times (its record,
``RequestMetrics``, stamped by the one collector of them, minicb/telemetry/request_times.py:
arrival and first token), and its ``history``, the pairs ``[step, page code]`` at each
change of what its row shows (a phase while it runs, what it waits as otherwise: the codes
of viz/model.js). That is a few numbers for a request's whole life, written at the cost of
what a step changed. A view lists those in the batch, the latest that wait and the latest
that ended, never ten thousand queued requests (megabytes for a few hundred rows drawn).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from minicb.core.request import RequestMetrics
from minicb.core.scheduler.plan import StepPlan
from minicb.telemetry.request_times import RequestTimes

VIEW_WAITING = 512  # waiting requests a view lists (the latest): a page draws no more rows
VIEW_ENDED = 256  # ended requests a view lists (the latest): a GPU's full batch of rows
# What a request not in the batch waits as, in the page's codes: queued (0), preempted to
# recompute (4) or swapped out (5).
QUEUED, PREEMPTED, SWAPPED = 0, 4, 5
# The times of a request the engine held when the folder began (LLMEngine.live_requests),
# the engine's own clock included: they make its record.
TOLD_TIMES = ("arrival", "first_token_time", "arrival_busy_s", "first_token_busy_s")


class RequestHistory:
    def __init__(self, live: Iterable[dict[str, Any]], ended_total: int) -> None:
        """``live``: the requests the engine held when the folder began (its description's
        "requests"); ``ended_total``: how many had ended by then."""
        # request id -> what a joining page needs to draw it, but its times
        self.requests: dict[int, dict[str, Any]] = {}
        self.times = RequestTimes()  # their records, while they are held
        self.told: set[int] = set()  # those whose own-clock times the engine told
        for r in live:
            rid = r["request_id"]
            self.requests[rid] = {k: v for k, v in r.items() if k not in TOLD_TIMES}
            self.requests[rid]["history"] = []
            self.times.records[rid] = RequestMetrics(
                r["arrival"], first_token_time=r["first_token_time"],
                arrival_busy_s=r["arrival_busy_s"], first_token_busy_s=r["first_token_busy_s"],
            )  # fmt: skip
            self.told.add(rid)
        # the latest VIEW_ENDED, oldest first, each with its record and whether it was told
        self.ended: dict[int, tuple[dict[str, Any], RequestMetrics, bool]] = {}
        # every request that ended, those before this folder began too: the page's count
        self.ended_total = ended_total

    def note(self, data: dict[str, Any], last_step: int) -> None:
        """A request event (as a dict): keep what a joining page needs of each live request.
        ``last_step``: the latest step folded."""
        rid, kind = data.get("request_id"), data["type"]
        if kind == "arrived":
            self.times.arrived(rid, data["time"], data["num_prompt_tokens"])
            self.requests[rid] = {
                "request_id": rid,
                "prompt": data["prompt"],
                "num_prompt_tokens": data["num_prompt_tokens"],
                "max_tokens": data["max_tokens"],
                "start_step": last_step + 1,  # the first it could run in
                "history": [],
            }
        elif kind == "first_token" and rid in self.requests:
            # the folder follows no clock of the engine's own: a first token heard here
            # has none (a told request's stays None)
            self.times.records[rid].first_token(data["time"], None)
            self.requests[rid]["first_token_step"] = data["step"]
        elif kind == "finished":  # after its step, which ended it: the reason is added here
            self.end(rid, data["step"])
            if rid in self.ended:
                self.ended[rid][0]["finish_reason"] = data["finish_reason"]
        elif kind == "aborted":
            self.end(rid, last_step, "abort")

    def note_step(self, plan: StepPlan, rows: dict[int, int], changes: list[list[int]]) -> None:
        """What each request this step touched shows now (its row's phase, ``rows``, or what
        it waits as), noted where that changed (``changes``: the rows that did). What it
        waits as is decided in the step that takes it out of the batch and holds until it
        runs again, so only this step's decisions are needed."""
        waits = {d.request_id: QUEUED for d in (*plan.admitted, *plan.swapped_in)}
        waits |= {d.request_id: SWAPPED for d in plan.swapped_out}
        waits |= {d.request_id: SWAPPED if d.mode == "swap" else PREEMPTED for d in plan.preempted}
        for rid in {rid for rid, _ in changes} | waits.keys():
            record = self.requests.get(rid)
            if record is None:
                continue
            code = rows.get(rid) or waits.get(rid, QUEUED)
            history = record["history"]
            if (history[-1][1] if history else QUEUED) != code:
                history.append([plan.step, code])

    def end(self, rid: int, step: int, reason: str | None = None) -> None:
        """A request left the engine at ``step``: it moves to the latest ended, with its
        record (the collector's table keeps only the requests held)."""
        record = self.requests.pop(rid, None)
        if record is None:
            return
        self.ended_total += 1
        times, told = self.times.forget(rid), rid in self.told
        self.told.discard(rid)
        self.ended[rid] = record | {"end_step": step, "finish_reason": reason}, times, told
        if len(self.ended) > VIEW_ENDED:
            del self.ended[next(iter(self.ended))]

    def listed(self, rows: dict[int, int]) -> list[dict[str, Any]]:
        """A view's requests, in the order they came: those in the batch (``rows``: request
        id -> its row's phase code) with ``row``, then the latest that wait and the latest
        that ended (``end_step``, ``finish_reason``) with ``row`` None."""
        held = self.requests.items()
        times = self.times.records
        requests = [_drawn(r, times[rid], rid in self.told, rows[rid]) for rid, r in held
                    if rid in rows]  # fmt: skip
        waiting = [(rid, r) for rid, r in held if rid not in rows]
        requests += [_drawn(r, times[rid], rid in self.told) for rid, r in waiting[-VIEW_WAITING:]]
        requests += [_drawn(r, t, told) for r, t, told in self.ended.values()]
        requests.sort(key=lambda r: r["request_id"])  # ids are given in order of arrival
        return requests


def _drawn(
    request: dict[str, Any], times: RequestMetrics, told: bool, row: int | None = None
) -> dict[str, Any]:
    """A request as a view lists it: what it is, its history, its row, and its times read
    from its record (the engine's own clock too, where the engine told it)."""
    drawn = {**request, "arrival": times.arrival_time, "first_token_time": times.first_token_time}
    if told:
        drawn.update(
            arrival_busy_s=times.arrival_busy_s, first_token_busy_s=times.first_token_busy_s
        )
    drawn["row"] = row
    return drawn
