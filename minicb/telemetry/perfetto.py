"""The Perfetto export: a run's events as the Chrome trace-event JSON that
ui.perfetto.dev and chrome://tracing open (``minicb replay run.jsonl --perfetto out.json``).

Two processes:

- "batch": one track of steps (each step a slice; with overlap scheduling, a step that
  begins before the last one ended goes on a second track), the host's lane (schedule,
  process outputs) and the device's lane (the runner: prepare inputs, forward, sample),
  each slice where it happened, so the gaps between them are the idle time (traces older
  than the lanes get the schedule, forward and sample phases end to end inside each step),
  counter tracks for KV blocks, queues and batch size, and a track of rejected requests;
- "requests": one track per request: "queued" until admitted, one slice per step it ran
  in (prefill, decode or padding), "waiting" while preempted or swapped out, and instant
  marks for its first token, its end or its abort.

Times are whole microseconds from the first event, as the format asks. Pure Python.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from minicb.core.events import EngineReset, Event, KVChanges, KVSnapshotEvent, StepEvent
from minicb.core.request_events import StepTokens

BATCH, REQUESTS = 1, 2  # process ids
STEPS_TRACK, REJECTED_TRACK, HOST_TRACK, DEVICE_TRACK, OVERLAPPED_TRACK = 0, 1, 2, 3, 4


def to_chrome_trace(
    events: Iterable[Event], header: dict[str, Any] | None = None
) -> dict[str, Any]:
    events = list(events)
    times = [t for e in events for t in _times(e)]
    t0 = min(times) if times else 0.0
    out = _Builder(t0)
    out.meta(BATCH, None, "process_name", "batch")
    out.meta(BATCH, STEPS_TRACK, "thread_name", "steps")
    if any(isinstance(e, StepEvent) and e.device_start is not None for e in events):
        out.meta(BATCH, HOST_TRACK, "thread_name", "host (schedule, process outputs)")
        out.meta(BATCH, DEVICE_TRACK, "thread_name", "device (prepare inputs, forward, sample)")
    out.meta(REQUESTS, None, "process_name", "requests")
    waiting: dict[int, tuple[str, float]] = {}  # request id -> (label, since)
    for e in events:
        if isinstance(e, StepEvent):
            _step(out, e)
            continue
        if isinstance(e, EngineReset | KVSnapshotEvent | KVChanges | StepTokens):  # nothing to draw
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
    keep = ("model", "simulated", "schema_version", "config", "hardware", "versions")
    return {k: header[k] for k in keep if k in header}


def _step(out: _Builder, e: StepEvent) -> None:
    p = e.plan
    args = {
        "batching": p.batching,
        "rows": len(p.scheduled),
        "budget": f"{p.budget_used}/{p.budget_limit}",
        "slots": f"{p.slots_used}/{p.slots_limit}",
        "kv_blocks_used": p.kv_used,
        "decisions": [d.reason for d in p.admitted + p.preempted + p.swapped_in + p.finished],
        "notes": p.notes,
    }
    if e.device_start is None:  # an older trace: the phases end to end inside the step
        out.slice(BATCH, STEPS_TRACK, f"step {p.step}", e.wall_start, e.wall_end, args)
        _end_to_end(out, STEPS_TRACK, e.wall_start, e.wall_end, _phases(e))
    else:
        # Overlapped steps overlap in time: a step that starts before the last one on the
        # steps track ended goes on a second track, so slices nest as the format wants.
        track = STEPS_TRACK if e.wall_start >= out.ends.get(STEPS_TRACK, -1.0) else OVERLAPPED_TRACK
        if track == OVERLAPPED_TRACK:
            out.meta(BATCH, OVERLAPPED_TRACK, "thread_name", "steps (overlapped)")
        out.ends[track] = e.wall_end
        out.slice(BATCH, track, f"step {p.step}", e.wall_start, e.wall_end, args)
        _lanes(out, e)
    out.counter(
        "KV blocks", e.wall_end, {"used": p.kv_used, "free": p.kv_free, "swapped": p.kv_swapped}
    )
    out.counter("queues", e.wall_end, {"waiting": p.num_waiting, "swapped": p.num_swapped})
    out.counter("batch", e.wall_start, {"rows": len(p.scheduled), "tokens": p.budget_used})
    for row in p.scheduled:
        row_args = {
            "tokens": row.num_tokens,
            "context_len": row.context_len,
            "blocks": row.num_blocks,
        }
        out.slice(REQUESTS, row.request_id, row.phase, e.wall_start, e.wall_end, row_args)


def _phases(e: StepEvent) -> list[tuple[str, float]]:
    return [("schedule", e.schedule_s), ("forward", e.forward_s), ("sample", e.sample_s)]


def _end_to_end(
    out: _Builder, track: int, t: float, limit: float, phases: list[tuple[str, float]]
) -> None:
    """Slices laid end to end from ``t``, none past ``limit``."""
    for name, seconds in phases:
        # Clamp: wall and perf clocks may disagree by a microsecond.
        end = min(t + seconds, limit)
        if end > t:
            out.slice(BATCH, track, name, t, end, {})
        t = end


def _lanes(out: _Builder, e: StepEvent) -> None:
    """The host's lane (the engine's thread: schedule, process outputs) and the device's
    (the runner: its input preparation, then forward and sample), each where it happened:
    with overlap scheduling the next step's host work lies inside this step's device time."""
    step = f" {e.plan.step}"
    _end_to_end(out, HOST_TRACK, e.wall_start, e.wall_end, [("schedule" + step, e.schedule_s)])
    process_s = e.process_s or 0.0
    _end_to_end(
        out, HOST_TRACK, e.wall_end - process_s, e.wall_end, [("process" + step, process_s)]
    )
    device = [("prepare" + step, e.prepare_s or 0.0), ("forward" + step, e.forward_s)]
    device.append(("sample" + step, e.sample_s))
    _end_to_end(out, DEVICE_TRACK, e.device_start, float("inf"), device)


class _Builder:
    """Collects trace events with times turned into microseconds from ``t0``."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.events: list[dict[str, Any]] = []
        self._named: set[tuple[int, int | None, str]] = set()
        self.ends: dict[int, float] = {}  # track -> the end of its last step slice

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
