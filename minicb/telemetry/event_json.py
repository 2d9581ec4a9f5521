"""Events to and from JSON-ready dicts: what a trace line, a browser's frame and a replay
hold.

``to_dict(event)`` gives a dict whose first key, ``type``, names the event; it shares
nothing with the event, so a listener may keep or change it. ``from_dict`` turns one back
and raises ValueError naming an unknown type, an unknown field or a missing one. A step
event is flat: its plan's fields (``plan_to_dict``: every field but the RUNNER_ONLY ones,
the forward's inputs), then its timings. The schema itself, with every field's meaning,
is in events.py, request_events.py and minicb/core/scheduler/plan.py; none of it runs while a
step is made and heard in-process, only where events are written or sent. Pure Python.
"""

from __future__ import annotations

import copy
from dataclasses import MISSING, fields
from operator import attrgetter
from typing import Any

from minicb.core.events import (
    EVENT_TYPES,
    STEP_OPTIONAL_FIELDS,
    STEP_TIMING_FIELDS,
    Event,
    KVSnapshotEvent,
    StepEvent,
)
from minicb.core.scheduler.plan import DECISION_LISTS, Decision, ScheduledRequest, StepPlan


def to_dict(event: Event) -> dict[str, Any]:
    """A JSON-ready dict with the event's ``type`` first; it shares nothing with the event.

    A step event is flat: the plan's fields, then the timings."""
    if isinstance(event, StepEvent):
        timings = {name: getattr(event, name) for name in STEP_TIMING_FIELDS}
        timings.update((name, getattr(event, name)) for name in STEP_OPTIONAL_FIELDS)
        return {"type": event.kind, **plan_to_dict(event.plan), **timings}
    data = {"type": event.kind, **vars(event)}
    for name in ("params", "info", "kv_ops"):
        if name in data:
            data[name] = copy.deepcopy(data[name])
    if isinstance(event, KVSnapshotEvent):
        for name in ("block_tables", "swap_tables"):
            data[name] = {str(r): list(t) for r, t in data[name].items()}
        data["cached_blocks"] = list(event.cached_blocks)
        data["host_cached_blocks"] = list(event.host_cached_blocks)
    return data


def from_dict(data: dict[str, Any]) -> Event:
    """Rebuild an event from ``to_dict`` output. Raises ValueError naming what is wrong."""
    if not isinstance(data, dict):
        raise ValueError(f"an event must be a JSON object, got {type(data).__name__}")
    kind = data.get("type")
    cls = EVENT_TYPES.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown event type {kind!r}; known: {', '.join(sorted(EVENT_TYPES))}")
    values = {k: v for k, v in data.items() if k != "type"}
    if cls is StepEvent:
        missing = [name for name in STEP_TIMING_FIELDS if name not in values]
        if missing:
            raise ValueError(f"step event lacks field(s): {', '.join(missing)}")
        timings = {name: values.pop(name) for name in STEP_TIMING_FIELDS}
        timings.update((name, values.pop(name)) for name in STEP_OPTIONAL_FIELDS if name in values)
        return StepEvent(plan=plan_from_dict(values), **timings)
    check_keys(cls, values, kind)
    if cls is KVSnapshotEvent:
        for name in ("block_tables", "swap_tables"):
            values[name] = {int(r): list(t) for r, t in values[name].items()}
    return cls(**values)


# ---- a step's plan ----------------------------------------------------------------------
def plan_to_dict(plan: StepPlan) -> dict[str, Any]:
    """A plan's event fields (not the RUNNER_ONLY ones), sharing nothing with the plan."""
    # Built from the fields by hand rather than with dataclasses.asdict, which
    # deep-copies value by value and made a step's trace line several times dearer.
    data = {f.name: getattr(plan, f.name) for f in _EVENT_FIELDS[StepPlan]}
    data["scheduled"] = [_row_dict(r) for r in plan.scheduled]
    for name in DECISION_LISTS:
        data[name] = [dict(vars(d)) for d in data[name]]
    data["notes"] = list(plan.notes)
    data["swap_out_map"] = [list(p) for p in plan.swap_out_map]
    data["swap_in_map"] = [list(p) for p in plan.swap_in_map]
    data["offload_map"] = [list(p) for p in plan.offload_map]
    data["reload_map"] = [list(p) for p in plan.reload_map]
    data["kv_ops"] = kv_ops_copy(plan.kv_ops)
    return data


def plan_from_dict(data: dict[str, Any]) -> StepPlan:
    """Rebuild a plan from ``plan_to_dict`` output. Raises ValueError naming what is wrong."""
    check_keys(StepPlan, data, "step")
    values = dict(data)
    rows = data.get("scheduled", [])
    values["scheduled"] = [_build(ScheduledRequest, r, "scheduled row") for r in rows]
    for name in DECISION_LISTS:
        values[name] = [_build(Decision, d, name) for d in data.get(name, [])]
    for name in ("swap_out_map", "swap_in_map", "offload_map", "reload_map"):
        values[name] = [tuple(p) for p in data.get(name, [])]
    values["kv_ops"] = [list(op) for op in data.get("kv_ops", [])]
    return StepPlan(**values)


def kv_ops_copy(ops: list[list]) -> list[list]:
    """A step's KV changes, JSON-ready and shared with nothing (a frame carries them too)."""
    return [[kind, rid, _copied(arg)] for kind, rid, arg in ops]


def _copied(arg: Any) -> Any:
    """A KV change's argument, shared with nothing: a count, blocks, or block pairs."""
    if not isinstance(arg, list):
        return arg
    return [list(x) if isinstance(x, list) else x for x in arg]


def _event_fields(cls: type) -> tuple:
    return tuple(f for f in fields(cls) if not f.metadata.get("runner_only"))


_EVENT_FIELDS = {cls: _event_fields(cls) for cls in (StepPlan, ScheduledRequest, Decision)}
_ROW_NAMES = tuple(f.name for f in _EVENT_FIELDS[ScheduledRequest])
_row_values = attrgetter(*_ROW_NAMES)  # one C call for a row's values: rows are many


def _row_dict(row: ScheduledRequest) -> dict[str, Any]:
    return dict(zip(_ROW_NAMES, _row_values(row), strict=True))


def check_keys(cls: type, values: dict[str, Any], what: str) -> None:
    """Raise ValueError naming unknown or missing fields of ``cls`` in ``values``."""
    event_fields = _EVENT_FIELDS.get(cls) or fields(cls)
    names = {f.name for f in event_fields}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"{what} event has unknown field(s): {', '.join(unknown)}")
    required = {
        f.name for f in event_fields if f.default is MISSING and f.default_factory is MISSING
    }
    missing = sorted(required - set(values))
    if missing:
        raise ValueError(f"{what} event lacks field(s): {', '.join(missing)}")


def _build(cls: type, data: Any, what: str) -> Any:
    if not isinstance(data, dict):
        raise ValueError(f"{what} entry must be a JSON object, got {data!r}")
    check_keys(cls, data, what)
    if cls is ScheduledRequest:  # a recorded row: its blocks are counted, not listed
        return cls(block_table=[], **data)
    return cls(**data)
