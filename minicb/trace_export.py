"""Export events to the Chrome trace-event JSON that ui.perfetto.dev and chrome://tracing open.

Two processes in the viewer:

- "batch": one track of steps (each step a slice, with its schedule, forward and sample
  phases nested inside, laid end to end from the step's start; what is left over is
  input preparation and bookkeeping), counter tracks for KV blocks, queues and batch size,
  and a track of rejected requests;
- "requests": one track per request: "queued" until admitted, one slice per step it ran
  in (prefill, decode or padding), "waiting" while preempted or swapped out, and instant
  marks for its first token, its end or its abort.

Times are whole microseconds from the first event, as the format asks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from minicb.events import Event, StepEvent

BATCH, REQUESTS = 1, 2  # process ids
STEPS_TRACK, REJECTED_TRACK = 0, 1


def to_chrome_trace(
    events: Iterable[Event], header: dict[str, Any] | None = None
) -> dict[str, Any]:
    events = list(events)
    times = [t for e in events for t in _times(e)]
    t0 = min(times) if times else 0.0
    out = _Builder(t0)
    out.meta(BATCH, None, "process_name", "batch")
    out.meta(BATCH, STEPS_TRACK, "thread_name", "steps")
    out.meta(REQUESTS, None, "process_name", "requests")
    waiting: dict[int, tuple[str, float]] = {}  # request id -> (label, since)
    for e in events:
        if isinstance(e, StepEvent):
            _step(out, e)
            continue
        rid, kind = e.request_id, e.kind
        if kind == "arrived":
            out.meta(REQUESTS, rid, "thread_name", f"request {rid}")
            out.meta(REQUESTS, rid, "thread_sort_index", rid, key="sort_index")
            waiting[rid] = ("queued", e.time)
        elif kind in ("admitted", "swapped_in", "finished", "aborted") and rid in waiting:
            label, since = waiting.pop(rid)
            out.slice(REQUESTS, rid, label, since, e.time, {})
        if kind == "preempted":
            waiting[rid] = (f"waiting (preempted by {e.mode})", e.time)
        elif kind == "first_token":
            out.instant(REQUESTS, rid, "first token", e.time, {})
        elif kind == "finished":
            out.instant(
                REQUESTS, rid, f"finished ({e.finish_reason})", e.time, {"reason": e.reason}
            )
        elif kind == "aborted":
            out.instant(REQUESTS, rid, "aborted", e.time, {})
        elif kind == "rejected":
            out.meta(BATCH, REJECTED_TRACK, "thread_name", "rejected requests")
            out.instant(BATCH, REJECTED_TRACK, "rejected", e.time, {"error": e.error})
    end = max(times) if times else t0
    for rid, (label, since) in waiting.items():  # still waiting when the trace ends
        out.slice(REQUESTS, rid, label, since, end, {})
    return {"traceEvents": out.events, "displayTimeUnit": "ms", "otherData": _other(header)}


def write_chrome_trace(
    events: Iterable[Event], path: str | os.PathLike, header: dict[str, Any] | None = None
) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(to_chrome_trace(events, header), f)


def _times(e: Event) -> tuple[float, ...]:
    return (e.wall_start, e.wall_end) if isinstance(e, StepEvent) else (e.time,)


def _other(header: dict[str, Any] | None) -> dict[str, Any]:
    if not header:
        return {}
    keep = ("model", "schema_version", "config", "hardware", "versions")
    return {k: header[k] for k in keep if k in header}


def _step(out: _Builder, e: StepEvent) -> None:
    args = {
        "batching": e.batching,
        "rows": len(e.scheduled),
        "budget": f"{e.budget_used}/{e.budget_limit}",
        "slots": f"{e.slots_used}/{e.slots_limit}",
        "kv_blocks_used": e.kv_used,
        "decisions": [d.reason for d in e.admitted + e.preempted + e.swapped_in + e.finished],
        "notes": e.notes,
    }
    out.slice(BATCH, STEPS_TRACK, f"step {e.index}", e.wall_start, e.wall_end, args)
    t = e.wall_start
    for name, seconds in (
        ("schedule", e.schedule_s),
        ("forward", e.forward_s),
        ("sample", e.sample_s),
    ):
        # Clamp inside the step: wall and perf clocks may disagree by a microsecond.
        end = min(t + seconds, e.wall_end)
        if end > t:
            out.slice(BATCH, STEPS_TRACK, name, t, end, {})
        t = end
    out.counter(
        "KV blocks", e.wall_end, {"used": e.kv_used, "free": e.kv_free, "swapped": e.kv_swapped}
    )
    out.counter("queues", e.wall_end, {"waiting": e.num_waiting, "swapped": e.num_swapped})
    out.counter("batch", e.wall_start, {"rows": len(e.scheduled), "tokens": e.budget_used})
    for row in e.scheduled:
        row_args = {
            "tokens": row.num_tokens,
            "context_len": row.context_len,
            "blocks": row.num_blocks,
        }
        out.slice(REQUESTS, row.request_id, row.phase, e.wall_start, e.wall_end, row_args)


class _Builder:
    """Collects trace events with times turned into microseconds from ``t0``."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.events: list[dict[str, Any]] = []
        self._named: set[tuple[int, int | None, str]] = set()

    def _us(self, t: float) -> int:
        # Whole microseconds: exact integers, so adjacent slices meet without overlapping
        # and nested ones stay inside their parent whatever the viewer's rounding.
        return round((t - self.t0) * 1e6)

    def meta(self, pid: int, tid: int | None, name: str, value: Any, key: str = "name") -> None:
        if (pid, tid, name) in self._named:
            return
        self._named.add((pid, tid, name))
        event: dict[str, Any] = {"ph": "M", "pid": pid, "name": name, "args": {key: value}}
        if tid is not None:
            event["tid"] = tid
        self.events.append(event)

    def slice(self, pid: int, tid: int, name: str, start: float, end: float, args: dict) -> None:
        ts = self._us(start)
        dur = max(0, self._us(end) - ts)
        self.events.append(
            {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": ts, "dur": dur, "args": args}
        )

    def instant(self, pid: int, tid: int, name: str, t: float, args: dict) -> None:
        self.events.append(
            {
                "ph": "i",
                "s": "t",
                "pid": pid,
                "tid": tid,
                "name": name,
                "ts": self._us(t),
                "args": args,
            }
        )

    def counter(self, name: str, t: float, values: dict[str, float]) -> None:
        self.events.append(
            {"ph": "C", "pid": BATCH, "name": name, "ts": self._us(t), "args": values}
        )
