"""The figures a scenario's claims compare, computed from one side's events, and the claims.

Every time is on the side's own clock: the seconds its engine spent in its own steps
before that moment (each step event's ``busy_s``, which the engine keeps and the page's
counters read too). On a simulated GPU that is its VirtualClock (it moves only in steps);
for the real model it leaves out the other side's steps, which the demo's one thread runs
in between on the same CPU (the wall clock would charge one side the other's stall). A
claim such as ``"chunked.max_tbt < 0.5 * whole.max_tbt"`` reads a figure of each side (or
a number) and holds or not; ``check_claim`` says which, with both figures, so a failing
test shows what the run really did. Pure Python.
"""

from __future__ import annotations

import bisect
import operator
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from minicb.core.scheduler.plan import DECODE, PADDING, PREFILL
from minicb.scenarios.schema import CLAIM
from minicb.telemetry.request_times import RequestTimes

OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}  # fmt: skip

# Figures of one request group (the worst of its requests): "side.wait:long".
REQUEST_METRICS = {
    "wait": "seconds from arrival to first admission",
    "ttft": "seconds from arrival to first token",
    "latency": "seconds from arrival to finishing",
    "max_tbt": "longest gap between two of its tokens",
}
# Figures of one side's whole run: "side.max_tbt".
METRICS = {
    "mean_ttft": "mean seconds from arrival to first token",
    "max_ttft": "longest seconds from arrival to first token",
    "max_tbt": "longest gap between two tokens of one request",
    "makespan": "seconds from the first arrival to the last finish",
    "throughput": "output tokens per second over the makespan",
    "steps": "iterations run",
    "preemptions": "requests preempted (recompute or swap)",
    "swaps": "requests swapped out",
    "cached_tokens": "prompt tokens found in the prefix cache at admission",
    "padding_tokens": "tokens computed for padding rows (static batching)",
    "idle_slots": "mean share of batch slots holding no real row, over the iterations",
    "decode_step_s": "mean seconds of an iteration that only decodes",
    "full_decode_step_s": "mean seconds of an iteration that only decodes, every slot a real row",
    "mean_rows": "mean real rows per iteration",
    "max_rows": "most real rows in one iteration (the largest batch it ran)",
    "kv_blocks": "blocks in the KV pool (its size, read from the first step)",
    "prefill_tokens": "tokens computed in prefill rows (prompts, and recomputes after preemption)",
    "host_hit_tokens": "prompt tokens found in the prefix cache's host tier and copied back",
    "host_cached_blocks": "the most host-tier blocks holding a cached prefix at once",
    "routed": "requests a fleet scenario's router sent to this side",
    "kv_transfers": "KV caches that arrived here from the prefill engine (disaggregated)",
    "cache_hits": "admissions that found part of their prompt in the prefix cache",
}


class SideRecord:
    """One engine's events as the run produced them (the narration's triggers read them),
    each request's times (its record, in the one collector of them: request_times.py), and
    the request groups by id."""

    def __init__(self, groups: dict[int, str]) -> None:
        self.groups = groups  # request id -> its group's name
        self.steps: list[Any] = []  # StepEvents
        self.requests: dict[str, list[Any]] = defaultdict(list)  # kind -> request events
        self.times = RequestTimes()
        self._ends: list[float] | None = None  # steps' ends, for own()

    def __call__(self, events: Sequence[Any]) -> None:
        """A bus listener: keep a step's events, and fold their times."""
        self.times(events)
        for event in events:
            if event.kind == "step":
                self.steps.append(event)
            else:
                self.requests[event.kind].append(event)

    def own(self, t: float) -> float:
        """Seconds of this side's own steps before engine time ``t``: the engine's own clock
        (each step event's ``busy_s``, the page's counters read the same), and the part of
        a step under way at ``t``."""
        if self._ends is None or len(self._ends) != len(self.steps):
            self._ends = [s.wall_end for s in self.steps]
        i = bisect.bisect_right(self._ends, t)  # steps ended by t
        done = self.steps[i - 1].busy_s if i else 0.0
        if i < len(self.steps) and self.steps[i].wall_start < t:  # one under way at t
            done += t - self.steps[i].wall_start
        return done

    def since_arrival(self, moment: str) -> dict[int, float]:
        """Each request's own-clock seconds from its arrival to ``moment``, a time of its
        record (``first_scheduled_time``, ``first_token_time`` or ``finished_time``)."""
        out: dict[int, float] = {}
        for rid, r in self.times.records.items():
            t = getattr(r, moment)
            if t is not None and r.arrival_time is not None:
                out[rid] = self.own(t) - self.own(r.arrival_time)
        return out

    def token_gaps(self) -> dict[int, float]:
        """Each request's longest gap between two consecutive tokens."""
        last: dict[int, float] = {}
        worst: dict[int, float] = defaultdict(float)
        for e in self.requests["tokens"]:
            now = self.own(e.time)
            for rid in e.request_ids:
                if rid in last:
                    worst[rid] = max(worst[rid], now - last[rid])
                last[rid] = now
        return dict(worst)


def arrived_transfers(record: SideRecord) -> list[Any]:
    """The kv_transfer events of KV caches that have arrived on this side."""
    return [e for e in record.requests["kv_transfer"] if e.status == "done"]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def request_metric(record: SideRecord, metric: str, group: str) -> float:
    """The worst value of ``metric`` over the requests of ``group``."""
    per_request = {
        "wait": lambda: record.since_arrival("first_scheduled_time"),
        "ttft": lambda: record.since_arrival("first_token_time"),
        "latency": lambda: record.since_arrival("finished_time"),
        "max_tbt": record.token_gaps,
    }[metric]()
    values = [v for rid, v in per_request.items() if record.groups.get(rid) == group]
    if not values:
        raise ValueError(f"no request of group {group!r} reached {metric} in this run")
    return max(values)


def side_metric(record: SideRecord, metric: str) -> float:
    steps = record.steps
    real = [[r for r in s.plan.scheduled if r.phase != PADDING] for s in steps]
    if metric in ("mean_ttft", "max_ttft"):
        values = list(record.since_arrival("first_token_time").values())
        return _mean(values) if metric == "mean_ttft" else max(values, default=0.0)
    if metric == "max_tbt":
        return max(record.token_gaps().values(), default=0.0)
    if metric in ("makespan", "throughput"):
        records = record.times.records.values()
        start = min((record.own(r.arrival_time) for r in records if r.arrival_time is not None),
                    default=0.0)  # fmt: skip
        ended = [r for r in records if r.finished_time is not None]
        span = max((record.own(r.finished_time) for r in ended), default=start) - start
        tokens = sum(r.num_generated_tokens for r in ended)
        return span if metric == "makespan" else tokens / span if span > 0 else 0.0
    if metric in ("decode_step_s", "full_decode_step_s"):
        full = metric == "full_decode_step_s"  # the step time at the batch's full size
        decode = [s for s, rows in zip(steps, real, strict=True)
                  if rows and all(r.phase == DECODE for r in rows)
                  and (not full or len(rows) == s.plan.slots_limit)]  # fmt: skip
        return _mean([s.wall_end - s.wall_start for s in decode])
    counts: dict[str, Callable[[], float]] = {
        "steps": lambda: len(steps),
        "preemptions": lambda: len(record.requests["preempted"]),
        "swaps": lambda: len(record.requests["swapped_out"]),
        "cached_tokens": lambda: sum(d.num_cached_tokens for s in steps for d in s.plan.admitted),
        "padding_tokens": lambda: sum(
            r.num_tokens for s in steps for r in s.plan.scheduled if r.phase == PADDING
        ),
        "idle_slots": lambda: _mean(
            [1 - len(rows) / s.plan.slots_limit for s, rows in zip(steps, real, strict=True)]
        ),
        "mean_rows": lambda: _mean([len(rows) for rows in real]),
        "max_rows": lambda: max((len(rows) for rows in real), default=0),
        "kv_blocks": lambda: steps[0].plan.kv_total if steps else 0,
        "prefill_tokens": lambda: sum(
            r.num_tokens for s in steps for r in s.plan.scheduled if r.phase == PREFILL
        ),
        "host_hit_tokens": lambda: sum(s.plan.prefix_host_hit_tokens for s in steps),
        "host_cached_blocks": lambda: max((s.plan.kv_host_cached for s in steps), default=0),
        "routed": lambda: len(record.requests["routed"]),
        "kv_transfers": lambda: len(arrived_transfers(record)),
        "cache_hits": lambda: sum(1 for s in steps for d in s.plan.admitted if d.num_cached_tokens),
    }
    return float(counts[metric]())


def figure(records: dict[str, SideRecord], operand: str) -> float:
    """The value of one side of a claim: a number, "side.metric" or "side.metric:group"."""
    try:
        return float(operand)
    except ValueError:
        pass  # "side.metric"
    side, metric = operand.split(".", 1)
    metric, _, group = metric.partition(":")
    if group:
        return request_metric(records[side], metric, group)
    return side_metric(records[side], metric)


def check_claim(records: dict[str, SideRecord], claim: str) -> tuple[bool, str]:
    """Whether ``claim`` holds in the run, and the claim with its figures filled in."""
    match = CLAIM.match(claim)
    if match is None:
        raise ValueError(f"not a claim: {claim!r}")
    left = figure(records, match["left"])
    right = figure(records, match["right"]) * float(match["factor"] or 1)
    holds = OPS[match["op"]](left, right)
    return holds, f"{claim}: {left:.6g} {match['op']} {right:.6g} is {holds}"
