"""Reading a trace: the JSONL file back into its header and events, older schemas
converted, and the KV map after every step.

    header, events = read_trace("run.jsonl")
    for step, kv in kv_states(events): ...

A trace of event schema version 2 (every step listed every block table) or 3 (one
``token`` line per token) is converted to this schema as it is read: version 2's tables
become the changes between each step's and the previous one's (``kv_ops``), version 3's
token lines the step's one ``tokens`` event. Any other version is refused with an error
that names its version and the one this minicb reads. minicb.telemetry.trace writes
traces; minicb.telemetry.perfetto exports them for ui.perfetto.dev. Pure Python.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from minicb.core.events import (
    SCHEMA_VERSION,
    EngineReset,
    Event,
    KVChanges,
    KVSnapshotEvent,
    StepEvent,
)
from minicb.core.request_events import RequestFirstToken, StepTokens
from minicb.telemetry.event_json import from_dict
from minicb.telemetry.kv_state import KVState
from minicb.telemetry.trace import TRACE_FORMAT


class TraceError(ValueError):
    """A file that is not a minicb trace, or one this minicb cannot read."""


@dataclass
class Trace:
    header: dict[str, Any]
    events: list[Event]


def read_trace(path: str | os.PathLike) -> Trace:
    """Header and events of a trace file. Raises TraceError saying what is wrong."""
    with open(path, encoding="utf-8") as f:
        lines = iter(enumerate(f, start=1))
        first = next(lines, (1, ""))[1]
        if not first.strip():
            raise TraceError(f"{path} is empty: not a minicb trace")
        try:
            header = _parse(first)
        except ValueError as err:
            raise TraceError(f"{path}, line 1: {err}") from err
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
                data = _parse(line)
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
    in place: copy it to keep it). A snapshot line replaces the map; a reset empties it;
    changes made between two steps count in the map of the step before them."""
    state = KVState()
    for e in events:
        if isinstance(e, KVSnapshotEvent):
            state = KVState.from_snapshot(e)
        elif isinstance(e, EngineReset):
            state = KVState()
        elif isinstance(e, KVChanges):
            state.apply(e.kv_ops)
        elif isinstance(e, StepEvent):
            state.apply(e.plan.kv_ops)
            yield e, state


def _parse(line: str) -> dict[str, Any]:
    """One line's object. Python's json reads NaN, Infinity and -Infinity, and a number too
    large for a float (1e400) as an infinity; none is JSON (a page's ``JSON.parse``
    refuses the replay that carries one) nor a time or a count: refused, naming the field."""
    try:
        data = json.loads(line, parse_constant=_not_finite, parse_float=_finite)
    except _NotFinite as err:
        raise ValueError(f"{_where_not_finite(line)} holds {err}, which is no JSON number") from err
    except json.JSONDecodeError as err:
        raise ValueError(f"not valid JSON ({err.msg})") from err
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    return data


class _NotFinite(ValueError):
    """A NaN or an infinity in a line (its text is the message)."""


def _not_finite(text: str) -> float:
    raise _NotFinite(text)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def _where_not_finite(line: str) -> str:
    """The field of ``line`` that holds the first NaN or infinity, as "field 'a.b[2]'":
    read again with each one kept as a marker, then found (only for a line refused)."""
    marker = object()
    data = json.loads(line, parse_constant=lambda _: marker,
                      parse_float=lambda t: _finite_or(t, marker))  # fmt: skip
    try:
        return f"field {_path_to(data, marker)!r}"
    except RecursionError:  # json's parser nests as deep as this walk may
        return "a field nested too deep to name"


def _finite_or(text: str, marker: object) -> Any:
    value = float(text)
    return value if math.isfinite(value) else marker


def _path_to(value: Any, marker: object, path: str = "") -> str | None:
    """Where ``marker`` first is in ``value`` (JSON: dicts, lists, scalars), as a path."""
    if value is marker:
        return path
    if isinstance(value, dict):
        steps = ((f"{path}.{k}" if path else k, item) for k, item in value.items())
    elif isinstance(value, list):
        steps = ((f"{path}[{i}]", item) for i, item in enumerate(value))
    else:
        return None
    for where, item in steps:
        found = _path_to(item, marker, where)
        if found is not None:
            return found
    return None
