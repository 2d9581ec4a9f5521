"""The event schema: what the engine reports, one iteration and one request at a time.

Two families of events, all plain dataclasses of JSON-safe values (ints, floats, strings,
lists, dicts, None), so that a trace file, a WebSocket and a notebook all see the same thing:

- ``StepEvent``: one per iteration: what ran (one ``RowInfo`` per scheduled request),
  what the scheduler decided and why (``DecisionInfo``), budgets, slots, KV blocks, queues
  and timings.
- request events (``RequestArrived`` ... ``RequestRejected``): one request's life, stamped
  with wall-clock seconds.

``to_dict``/``from_dict`` convert to and from JSON-ready dicts; the ``type`` key names the
event. ``SCHEMA_VERSION`` changes whenever a field is renamed, removed or changes meaning;
docs/events.md documents every field. Pure Python: no torch.
"""

from __future__ import annotations

import copy
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

SCHEMA_VERSION = 1


# ---- one iteration ---------------------------------------------------------------------
@dataclass
class RowInfo:
    """One scheduled request in a step: which phase, how many tokens, how much context."""

    request_id: int
    phase: str  # "prefill" (a prompt chunk, or a recompute), "decode" or "padding"
    num_tokens: int  # tokens fed to the model for this request this step
    start_position: int  # position of the first of those tokens
    context_len: int  # tokens in its KV cache once this step's tokens are stored
    num_blocks: int  # KV blocks it holds this step


@dataclass
class DecisionInfo:
    """A scheduler decision about one request, with the scheduler's reason in words."""

    request_id: int
    reason: str
    mode: str | None = None  # for preemptions: "recompute" or "swap"


@dataclass
class StepEvent:
    kind: ClassVar[str] = "step"

    index: int  # the scheduler's iteration number, from 1
    batching: str  # "continuous" or "static"
    wall_start: float  # time.time() when scheduling began
    wall_end: float  # time.time() when the step's results were ready
    schedule_s: float
    forward_s: float
    sample_s: float
    block_size: int  # token slots per KV block, to turn blocks into tokens
    scheduled: list[RowInfo] = field(default_factory=list)
    admitted: list[DecisionInfo] = field(default_factory=list)
    preempted: list[DecisionInfo] = field(default_factory=list)
    swapped_out: list[DecisionInfo] = field(default_factory=list)
    swapped_in: list[DecisionInfo] = field(default_factory=list)
    finished: list[DecisionInfo] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # other reasons, e.g. why nobody was admitted
    budget_used: int = 0
    budget_limit: int = 0
    slots_used: int = 0
    slots_limit: int = 0
    # KV figures are read after the step, once finished requests have released their blocks.
    kv_used: int = 0
    kv_free: int = 0
    kv_total: int = 0
    kv_swapped: int = 0
    num_waiting: int = 0
    num_swapped: int = 0


# ---- one request's life ----------------------------------------------------------------
@dataclass(kw_only=True)
class RequestEvent:
    """Base of the request events: when, and which request."""

    kind: ClassVar[str] = "request"

    time: float  # wall-clock seconds (time.time())
    request_id: int


@dataclass(kw_only=True)
class RequestArrived(RequestEvent):
    kind: ClassVar[str] = "arrived"

    prompt: str | None  # the prompt text, or None when it was given as token ids
    num_prompt_tokens: int
    max_tokens: int
    priority: int
    params: dict[str, Any]  # every SamplingParams field


@dataclass(kw_only=True)
class StepRequestEvent(RequestEvent):
    """A request event caused by an iteration; ``step`` is that StepEvent's index."""

    step: int


@dataclass(kw_only=True)
class RequestAdmitted(StepRequestEvent):
    kind: ClassVar[str] = "admitted"

    reason: str


@dataclass(kw_only=True)
class RequestFirstToken(StepRequestEvent):
    kind: ClassVar[str] = "first_token"


@dataclass(kw_only=True)
class RequestToken(StepRequestEvent):
    kind: ClassVar[str] = "token"

    token_id: int
    index: int  # 0 for the first generated token
    text: str  # the text this token adds ("" while a multi-byte character is incomplete)


@dataclass(kw_only=True)
class RequestPreempted(StepRequestEvent):
    kind: ClassVar[str] = "preempted"

    mode: str  # "recompute" or "swap"
    reason: str


@dataclass(kw_only=True)
class RequestSwappedOut(StepRequestEvent):
    kind: ClassVar[str] = "swapped_out"

    reason: str


@dataclass(kw_only=True)
class RequestSwappedIn(StepRequestEvent):
    kind: ClassVar[str] = "swapped_in"

    reason: str


@dataclass(kw_only=True)
class RequestFinished(StepRequestEvent):
    kind: ClassVar[str] = "finished"

    finish_reason: str | None  # "stop" or "length"
    reason: str
    num_prompt_tokens: int
    num_output_tokens: int
    num_preemptions: int


@dataclass(kw_only=True)
class RequestAborted(RequestEvent):
    kind: ClassVar[str] = "aborted"

    num_output_tokens: int


@dataclass(kw_only=True)
class RequestRejected(RequestEvent):
    """A request refused at the door; it never got an id, so ``request_id`` is -1."""

    kind: ClassVar[str] = "rejected"

    request_id: int = -1
    prompt: str | None  # the prompt text, or None when it was not a string
    num_prompt_tokens: int | None  # its length when it was a list of token ids
    error: str


Event = StepEvent | RequestEvent

EVENT_TYPES: dict[str, type] = {
    cls.kind: cls
    for cls in (
        StepEvent,
        RequestArrived,
        RequestAdmitted,
        RequestFirstToken,
        RequestToken,
        RequestPreempted,
        RequestSwappedOut,
        RequestSwappedIn,
        RequestFinished,
        RequestAborted,
        RequestRejected,
    )
}
EVENT_KINDS = frozenset(EVENT_TYPES)
_DECISION_LISTS = ("admitted", "preempted", "swapped_out", "swapped_in", "finished")
REQUEST_EVENT_KINDS = EVENT_KINDS - {"step"}


# ---- to and from plain dicts -----------------------------------------------------------
def to_dict(event: Event) -> dict[str, Any]:
    """A JSON-ready dict with the event's ``type`` first; it shares nothing with the event."""
    # Built by hand rather than with dataclasses.asdict, which deep-copies field by field
    # and made a step's trace line several times dearer.
    data = {"type": event.kind, **vars(event)}
    if isinstance(event, StepEvent):
        data["scheduled"] = [dict(vars(r)) for r in event.scheduled]
        for name in _DECISION_LISTS:
            data[name] = [dict(vars(d)) for d in data[name]]
        data["notes"] = list(event.notes)
    elif "params" in data:
        data["params"] = copy.deepcopy(data["params"])
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
    _check_keys(cls, values, kind)
    if cls is StepEvent:
        values["scheduled"] = [
            _build(RowInfo, r, "scheduled row") for r in values.get("scheduled", [])
        ]
        for name in _DECISION_LISTS:
            values[name] = [_build(DecisionInfo, d, name) for d in values.get(name, [])]
    return cls(**values)


def _check_keys(cls: type, values: dict[str, Any], what: str) -> None:
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"{what} event has unknown field(s): {', '.join(unknown)}")
    required = {
        f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
    }
    missing = sorted(required - set(values))
    if missing:
        raise ValueError(f"{what} event lacks field(s): {', '.join(missing)}")


def _build(cls: type, data: Any, what: str) -> Any:
    if not isinstance(data, dict):
        raise ValueError(f"{what} entry must be a JSON object, got {data!r}")
    _check_keys(cls, data, what)
    return cls(**data)
