"""Traces: a run's events in a JSONL file, to replay, measure and draw later, and their
export to the Chrome trace-event JSON that ui.perfetto.dev and chrome://tracing open.

Line 1 is a header (format, event schema version, engine config, model, hardware,
library versions); every later line is one event as ``minicb.telemetry.events.to_dict``
gives it. Step events carry only what their step changed in the KV pool; the whole map is
a ``kv_snapshot`` line written first and every ``SNAPSHOT_EVERY`` steps, so a reader can
seek to any step from the snapshot before it (``kv_states``).

    with record_trace(llm.engine, "run.jsonl"):
        llm.generate(prompts)
    header, events = read_trace("run.jsonl")

A trace of event schema version 2 (every step listed every block table) is converted as it
is read; any other version is refused with an error that names its version and the one
this minicb reads.

The Perfetto export has two processes:

- "batch": one track of steps (each step a slice; with overlap scheduling, a step that
  begins before the last one ended goes on a second track), the host's lane (schedule,
  process outputs) and the device's lane (the runner: prepare inputs, forward, sample),
  each slice where it happened, so the gaps between them are the idle time (traces older
  than the lanes get the schedule, forward and sample phases end to end inside each step),
  counter tracks for KV blocks, queues and batch size, and a track of rejected requests;
- "requests": one track per request: "queued" until admitted, one slice per step it ran
  in (prefill, decode or padding), "waiting" while preempted or swapped out, and instant
  marks for its first token, its end or its abort.

Times are whole microseconds from the first event, as the format asks.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import orjson

from minicb.telemetry.events import (
    SCHEMA_VERSION,
    EngineReset,
    Event,
    KVSnapshotEvent,
    RequestFirstToken,
    StepEvent,
    StepTokens,
    from_dict,
    to_dict,
)
from minicb.telemetry.kv_state import KVState

TRACE_FORMAT = "minicb-trace"
# A whole KV map every this many steps: a replay seeks from the one before the step it
# wants. At a GPU's 30,000 blocks a map is a few hundred kB: a step every 256 stays small.
SNAPSHOT_EVERY = 256


def _encode_line(data: dict[str, Any]) -> bytes:
    """One compact JSON line in UTF-8. orjson, not the standard library: a step event of 16
    rows took about 470 us to encode with the C encoder of ``json`` and 7 us with orjson, on
    the per-step path of the engine thread (docs/performance.md, host costs). orjson writes
    a NaN or an infinity as null, so a line is always strict JSON."""
    # Integer keys (block tables by request id) become strings, as json.dumps makes them.
    return orjson.dumps(data, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS)


class TraceError(ValueError):
    """A file that is not a minicb trace, or one this minicb cannot read."""


@dataclass
class Trace:
    header: dict[str, Any]
    events: list[Event]


# ---- the header ------------------------------------------------------------------------
def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def trace_header(engine: Any = None, **extra: Any) -> dict[str, Any]:
    """Config, model, hardware and versions of the run; ``extra`` adds workload facts."""
    header: dict[str, Any] = {
        "type": "header",
        "format": TRACE_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "created": time.time(),
        "versions": {
            "minicb": _version("minicb"),
            "python": platform.python_version(),
            **{p: _version(p) for p in ("torch", "transformers", "triton", "prometheus_client")},
        },
        "hardware": {
            "platform": platform.platform(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
        },
    }
    if engine is not None:  # an LLMEngine, or anything shaped like one (a fleet's replica)
        described = engine.describe()
        header["config"] = described["config"]
        header["model"] = described["model"]
        header["hardware"].update(described["runner"])
        # A run on a simulated GPU (minicb/sim/runner.py) is no measurement: say so.
        header["simulated"] = bool(header["hardware"].get("simulated"))
    header.update(extra)
    return header


# ---- writing ---------------------------------------------------------------------------
class TraceWriter:
    """An event listener that appends each event to a JSONL file, header first.

    ``snapshot()``, if given, returns the engine's whole KV map as an event: written after
    the header, after a reset, and after every ``SNAPSHOT_EVERY``-th step."""

    def __init__(
        self,
        path: str | os.PathLike,
        header: dict[str, Any],
        snapshot: Callable[[], KVSnapshotEvent] | None = None,
    ) -> None:
        self.path = Path(path)
        self.num_events = 0
        self._snapshot = snapshot
        self._file: IO[bytes] = open(self.path, "wb")  # noqa: SIM115
        self._write(header)
        self._write_snapshot()

    def _write(self, data: dict[str, Any]) -> None:
        self._file.write(_encode_line(data))

    def _write_snapshot(self) -> None:
        if self._snapshot is not None:
            self._write(to_dict(self._snapshot()))
            self.num_events += 1

    def __call__(self, events: Sequence[Event]) -> None:
        """A step's events (a bus listener), one line each."""
        write = self._file.write
        for event in events:
            write(_encode_line(to_dict(event)))
        self.num_events += len(events)
        last = events[-1] if events else None
        if isinstance(last, EngineReset) or any(
            isinstance(e, StepEvent) and e.plan.step % SNAPSHOT_EVERY == 0 for e in events
        ):
            self._write_snapshot()

    def close(self) -> None:
        self._file.close()


@contextmanager
def record_trace(
    engine: Any, path: str | os.PathLike | None, **extra: Any
) -> Iterator[TraceWriter | None]:
    """Record ``engine``'s events to ``path`` while the block runs; no-op if path is None."""
    if path is None:
        yield None
        return
    writer = TraceWriter(path, trace_header(engine, **extra), engine.kv_snapshot_event)
    engine.bus.subscribe(writer)
    try:
        yield writer
    finally:
        engine.bus.unsubscribe(writer)
        writer.close()


# The --trace FILE option of every subcommand that runs a workload:
#     add_trace_option(parser)              # when the parser is built
#     with traced(llm.engine, args):        # around the workload
def add_trace_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace",
        metavar="FILE",
        default=None,
        help="record every event to a JSONL trace (read it with `minicb replay FILE`)",
    )


def traced(engine: Any, args: argparse.Namespace, **header: Any) -> AbstractContextManager:
    """Record ``engine``'s events to ``args.trace`` while the block runs; nothing if unset."""
    return record_trace(
        engine, getattr(args, "trace", None), command=getattr(args, "command", None), **header
    )


# ---- reading ---------------------------------------------------------------------------
def read_trace(path: str | os.PathLike) -> Trace:
    """Header and events of a trace file. Raises TraceError saying what is wrong."""
    with open(path, encoding="utf-8") as f:
        lines = iter(enumerate(f, start=1))
        first = next(lines, (1, ""))[1]
        if not first.strip():
            raise TraceError(f"{path} is empty: not a minicb trace")
        header = _parse(first, path, 1)
        if header.get("format") != TRACE_FORMAT:
            raise TraceError(
                f"{path} is not a minicb trace: its first line has no minicb-trace header"
            )
        version = header.get("schema_version")
        if version not in (SCHEMA_VERSION, *CONVERTED):
            raise TraceError(
                f"{path} was written with event schema version {version!r}; this minicb reads "
                f"version {SCHEMA_VERSION} (and converts versions 2 and 3; docs/events.md says "
                "what changed): record the run again, or replay it with the minicb that wrote it"
            )
        upgrade = _V2Upgrade() if version == 2 else None
        events: list[Event] = []
        for number, line in lines:
            if not line.strip():
                continue
            try:
                data = _parse(line, path, number)
                if version in CONVERTED and data.get("type") == "token":
                    _fold_token(events, data)
                    continue
                events.append(from_dict(upgrade(data) if upgrade else data))
            except ValueError as err:
                raise TraceError(f"{path}, line {number}: {err}") from err
        if version in CONVERTED:
            header = {**header, "schema_version": SCHEMA_VERSION, "converted_from": version}
    return Trace(header, events)


CONVERTED = (2, 3)  # older schemas read_trace converts to this one


def _fold_token(events: list[Event], data: dict[str, Any]) -> None:
    """A version 2 or 3 ``token`` line (one token) into the step's ``tokens`` event: the
    previous event if it holds this step's tokens, else a new one. Those versions wrote a
    step's token lines one after another (first-token lines between them, which the
    conversion moves ahead of the step's tokens, where version 4 writes them)."""
    try:
        rid, token, text, index = (data[k] for k in ("request_id", "token_id", "text", "index"))
        time, step = data["time"], data["step"]
    except KeyError as err:
        raise ValueError(f"token event lacks field {err.args[0]!r}") from None
    i = len(events)
    while i and isinstance(events[i - 1], RequestFirstToken) and events[i - 1].step == step:
        i -= 1  # a first-token event of this step: the step's tokens come after it
    last = events[i - 1] if i else None
    if isinstance(last, StepTokens) and last.step == step:
        events.append(events.pop(i - 1))  # after this step's first-token events
        last.request_ids.append(rid)
        last.token_ids.append(token)
        last.texts.append(text)
        last.indexes.append(index)
    else:
        events.append(StepTokens(time=time, step=step, request_ids=[rid], token_ids=[token],
                                 indexes=[index], texts=[text]))  # fmt: skip


class _V2Upgrade:
    """Version 2 step events listed every table after the step; version 3 lists what changed.
    The changes are found by comparing each step's tables with the previous step's, so the
    map after every step is the same as the one recorded."""

    def __init__(self) -> None:
        self.state = KVState()

    def __call__(self, data: dict[str, Any]) -> dict[str, Any]:
        if data.get("type") == "reset":
            self.state = KVState()
        if data.get("type") != "step":
            return data
        data = dict(data)
        tables = {int(r): list(t) for r, t in data.pop("block_tables", {}).items()}
        swaps = {int(r): list(t) for r, t in data.pop("swap_tables", {}).items()}
        cached = list(data.pop("cached_blocks", []))
        data["kv_ops"] = _changes(self.state, tables, swaps, cached)
        data["scheduled"] = [_v2_row(row) for row in data.get("scheduled", [])]
        self.state = KVState(tables, swaps, cached)
        return data


def _v2_row(row: Any) -> Any:
    if not isinstance(row, dict) or "block_table" not in row:
        return row
    row = dict(row)
    row["num_blocks"] = len(row.pop("block_table") or [])
    return row


def _changes(old: KVState, tables: dict, swaps: dict, cached: list[int]) -> list[list]:
    """The kv_ops that turn ``old`` into these tables (see block_manager.KVChange)."""
    ops: list[list] = []
    kept = set(old.cached) & set(cached)
    if [b for b in old.cached if b in kept] != [b for b in cached if b in kept]:
        kept = set()  # the order changed (a hit, then a park): list them all again
    gone = [b for b in old.cached if b not in kept]
    if gone:
        ops.append(["uncache", None, gone])
    rids = old.block_tables.keys() | old.swap_tables.keys() | tables.keys() | swaps.keys()
    for rid in sorted(rids):
        before, after = old.block_tables.get(rid), tables.get(rid)
        if rid in swaps and old.swap_tables.get(rid) != swaps[rid]:
            ops.append(["swap_out", rid, swaps[rid]])
        elif rid in old.swap_tables and rid not in swaps and after is not None:
            ops.append(["swap_in", rid, after])
        elif after is None and rid not in swaps:
            if before is not None or rid in old.swap_tables:
                ops.append(["free", rid, None])
        elif after is not None and before != after:
            if before and after[: len(before)] == before:
                ops.append(["append", rid, after[len(before) :]])
            elif before and before[: len(after)] == after:
                ops.append(["trim", rid, len(after)])
            else:
                if before is not None:
                    ops.append(["free", rid, None])
                ops.append(["append", rid, after])
    new = [b for b in cached if b not in kept]
    if new:
        ops.append(["cache", None, new])
    return ops


def kv_states(events: Iterable[Event]) -> Iterator[tuple[StepEvent, KVState]]:
    """Each step event of a trace with the KV map after it (the same KVState object, updated
    in place: copy it to keep it). A snapshot line replaces the map; a reset empties it."""
    state = KVState()
    for e in events:
        if isinstance(e, KVSnapshotEvent):
            state = KVState.from_snapshot(e)
        elif isinstance(e, EngineReset):
            state = KVState()
        elif isinstance(e, StepEvent):
            state.apply(e.plan.kv_ops)
            yield e, state


def _parse(line: str, path: Any, number: int) -> dict[str, Any]:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as err:
        raise TraceError(f"{path}, line {number}: not valid JSON ({err.msg})") from err
    if not isinstance(data, dict):
        raise TraceError(f"{path}, line {number}: expected a JSON object")
    return data


# ---- Perfetto / Chrome trace export ----------------------------------------------------
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
        if isinstance(e, EngineReset | KVSnapshotEvent | StepTokens):  # nothing to draw here
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
