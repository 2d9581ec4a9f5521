"""The event schema: what the engine reports, one iteration and one request at a time.

Three families of events, all plain dataclasses of JSON-safe values (ints, floats, strings,
lists, dicts, None), so that a trace file, a WebSocket and a notebook all see the same thing:

- ``StepEvent``: one per iteration: the StepPlan itself (what ran, with each row's block
  ids, what the scheduler decided and why, budgets, slots, KV pool, queues) and timings;
- request events (``RequestArrived`` ... ``RequestRejected``): one request's life, stamped
  with the engine's clock;
- ``StepTokens``: the tokens of one iteration, every request's at once;
- ``EngineReset``: an engine was rebuilt with new settings (request ids start again);
- ``KVSnapshotEvent``: the whole KV map (every request's blocks), now and then: a step
  event carries only the changes its step made (``kv_ops``), so a reader that joins late
  or seeks starts from a snapshot (minicb.telemetry.kv_state.KVState);
- ``KVChanges``: changes made to the pool between two steps (a prefill engine freeing the
  KV it has sent, an abort on an engine that then idles), published when they are made.

``to_dict``/``from_dict`` convert to and from JSON-ready dicts; the ``type`` key names the
event. ``SCHEMA_VERSION`` changes whenever a field is renamed, removed or changes meaning;
docs/events.md documents every field. Pure Python: no torch.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import cached_property
from operator import attrgetter
from typing import TYPE_CHECKING, Any, ClassVar

from minicb.request import TokenDelta
from minicb.scheduler.plan import StepPlan, check_keys
from minicb.telemetry.row_sums import RowSums, row_sums

if TYPE_CHECKING:
    from minicb.request import Request, RequestOutput

# 4: a step's tokens are one "tokens" event (parallel lists), not one "token" event each:
# at 256 running the per-token events were most of what instrumentation cost.
# 3: a step event carries the KV changes its step made (kv_ops) and each row's block count
# (num_blocks); the whole map is a kv_snapshot event, now and then. v2 carried every
# request's block table in every step event (416 kB a step at 256 running).
# trace.py converts a v2 or v3 trace on reading. v1 carried block counts only.
SCHEMA_VERSION = 4
STEP_TIMING_FIELDS = ("wall_start", "wall_end", "schedule_s", "forward_s", "sample_s")
# Tensor parallelism, with defaults (traces written before them read as one rank).
STEP_PARALLEL_FIELDS = ("tensor_parallel_size", "collective_s")
# How busy the hardware was, 0..1, with defaults (None: unknown, and in older traces).
STEP_UTILISATION_FIELDS = ("bandwidth_util", "flop_util")
# The engine's own clock, seconds of its steps (None in older traces): docs/events.md.
STEP_CLOCK_FIELDS = ("busy_s",)
# The host's and the device's lanes (None in older traces): docs/events.md.
STEP_LANE_FIELDS = ("device_start", "prepare_s", "process_s")
STEP_OPTIONAL_FIELDS = (
    STEP_PARALLEL_FIELDS + STEP_UTILISATION_FIELDS + STEP_CLOCK_FIELDS + STEP_LANE_FIELDS
)


# ---- one iteration ---------------------------------------------------------------------
@dataclass
class StepEvent:
    """One iteration: the scheduler's own StepPlan (rows with their block ids, decisions
    with their reasons, budgets, slots, KV pool, queues) and how long the step took."""

    kind: ClassVar[str] = "step"

    plan: StepPlan
    wall_start: float  # engine clock when scheduling began
    wall_end: float  # engine clock when the step's results were ready
    schedule_s: float  # seconds in Scheduler.schedule()
    forward_s: float  # seconds the runner spent on the forward pass
    sample_s: float  # seconds the runner spent sampling
    tensor_parallel_size: int = 1  # ranks the model is split over
    collective_s: float = 0.0  # seconds in tensor-parallel collectives (within the above)
    bandwidth_util: float | None = None  # bytes streamed / (peak bandwidth x step seconds)
    flop_util: float | None = None  # FLOPs / (peak FLOP/s x step seconds)
    # Seconds this engine spent in its own steps, this one included: its own clock at the
    # step's end, which leaves out the other engines' steps that one thread runs in between.
    busy_s: float | None = None
    # The two lanes: the host schedules (schedule_s), prepares the runner's inputs
    # (prepare_s: the runner's execute less its forward and sample) and processes the
    # outputs (process_s: tokens, stops, retirements; it ends at wall_end); the device
    # computes (forward_s + sample_s) from device_start + prepare_s. With overlap
    # scheduling the next step's host work runs inside this step's device time.
    device_start: float | None = None  # engine clock when the runner took the plan up
    prepare_s: float | None = None
    process_s: float | None = None

    @property
    def host_s(self) -> float:
        """Seconds of host work for this step: schedule, prepare inputs, process outputs."""
        return self.schedule_s + (self.prepare_s or 0.0) + (self.process_s or 0.0)

    @property
    def device_s(self) -> float:
        """Seconds the device computed this step: the runner's forward and sample."""
        return self.forward_s + self.sample_s

    @cached_property
    def row_sums(self) -> RowSums:
        """What the plan's rows add up to, counted once for every listener (row_sums.py)."""
        return row_sums(self.plan.scheduled, self.plan.block_size)


# ---- one request's life ----------------------------------------------------------------
@dataclass(kw_only=True)
class RequestEvent:
    """Base of the request events: when, and which request."""

    kind: ClassVar[str] = "request"

    time: float  # seconds on the engine's clock (the wall clock unless a runner's virtual one)
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
class StepTokens:
    """Every token one iteration gave, in the order of its rows: one entry per token in
    each list (a request that speculated may have several). One event per step, not one
    per token: a listener handles a step's tokens in one call, a trace writes one line."""

    kind: ClassVar[str] = "tokens"

    time: float  # the step's end, when its results were ready
    step: int
    request_ids: list[int]
    token_ids: list[int]
    indexes: list[int]  # each token's place in its request's output, 0 for the first
    texts: list[str]  # the text each adds ("" while a multi-byte character is incomplete)

    def deltas(self) -> Iterator[TokenDelta]:
        """The tokens one by one, as the engine hands them out."""
        for rid, token, text, index in zip(
            self.request_ids, self.token_ids, self.texts, self.indexes, strict=True
        ):
            yield TokenDelta(rid, token, text, index)


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
    num_draft_tokens: int = 0  # speculative tokens verified for it over its life
    num_accepted_tokens: int = 0  # of those, the ones kept as output


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


@dataclass(kw_only=True)
class RequestRouted(RequestEvent):
    """A fleet's router sent the request to a replica (minicb/fleet/router.py), published on
    that replica's bus just before the replica's own ``arrived``: the id is the replica's
    own request id, as its other events and the API's X-Minicb-Request-Id give it."""

    kind: ClassVar[str] = "routed"

    replica: int  # the replica's index in the fleet
    policy: str  # "round-robin", "least-loaded" or "prefix-aware"
    reason: str  # in words, counts only: "replica 1: 96 of 128 prompt tokens cached there"
    cached_tokens: int  # the router's estimate of the prompt tokens cached on that replica


@dataclass(kw_only=True)
class KVTransfer(RequestEvent):
    """A request's KV cache moving from a prefill engine to a decode engine (disaggregated
    serving, minicb/fleet/disagg_fleet.py), on the decode engine's bus: the id is the
    decode engine's own request id. One event per change of ``status``: "waiting" (no room
    on the decode side: the KV stays on the prefill side, ``reason`` says why), "receiving"
    (blocks allocated here, the bytes on their way), "done" or "failed" (``reason``)."""

    kind: ClassVar[str] = "kv_transfer"

    from_engine: str  # the prefill engine's name, e.g. "prefill0"
    to_engine: str  # the decode engine's name, e.g. "decode0"
    blocks: int  # blocks allocated for it on the decode side
    bytes: int  # bytes of KV (values and 8-bit scales) sent; 0 until "done"
    seconds: float  # from the receive's start to the last byte; 0 until "done"
    status: str  # "waiting", "receiving", "done" or "failed"
    reason: str  # in words, counts only


@dataclass(kw_only=True)
class EngineReset:
    """The engine was rebuilt with new settings: forget its requests; ids start again."""

    kind: ClassVar[str] = "reset"

    time: float
    info: dict[str, Any]  # the new engine's description (settings, pool size, ...)


@dataclass(kw_only=True)
class KVSnapshotEvent:
    """The whole KV map after step ``step``: where a reader starts before applying the
    ``kv_ops`` of the steps after it. Request ids are ints here and strings in JSON."""

    kind: ClassVar[str] = "kv_snapshot"

    time: float
    step: int  # the engine's iterations so far: the map is the one after this step
    block_tables: dict[int, list[int]]  # request id -> its device blocks, in order
    swap_tables: dict[int, list[int]]  # request id -> its CPU swap blocks
    cached_blocks: list[int]  # evictable blocks that keep a cached prefix, oldest first
    # The prefix cache's host tier: host blocks holding a prefix, least recently used first.
    host_cached_blocks: list[int] = field(default_factory=list)


@dataclass(kw_only=True)
class KVChanges:
    """Changes made to the KV pool between two steps, published when they are made (the
    engine's ``publish_kv_changes``): without it a map drawn from the events would show a
    released request's blocks until the engine's next step, which may never come. The
    same ``kv_ops`` a step event carries, and the pool's counts after them."""

    kind: ClassVar[str] = "kv_changes"

    time: float
    step: int  # the engine's iterations so far: the changes come after this step
    kv_ops: list[list]  # [kind, request id, blocks], in order (as a step event's)
    kv_used: int
    kv_free: int
    kv_cached: int


Event = StepEvent | RequestEvent | StepTokens | EngineReset | KVSnapshotEvent | KVChanges

EVENT_TYPES: dict[str, type] = {
    cls.kind: cls
    for cls in (
        StepEvent,
        RequestArrived,
        RequestAdmitted,
        RequestFirstToken,
        StepTokens,
        RequestPreempted,
        RequestSwappedOut,
        RequestSwappedIn,
        RequestFinished,
        RequestAborted,
        RequestRejected,
        RequestRouted,
        KVTransfer,
        EngineReset,
        KVSnapshotEvent,
        KVChanges,
    )
}
EVENT_KINDS = frozenset(EVENT_TYPES)


# ---- to and from plain dicts -----------------------------------------------------------
def to_dict(event: Event) -> dict[str, Any]:
    """A JSON-ready dict with the event's ``type`` first; it shares nothing with the event.

    A step event is flat: the plan's fields, then the timings."""
    if isinstance(event, StepEvent):
        timings = {name: getattr(event, name) for name in STEP_TIMING_FIELDS}
        timings.update((name, getattr(event, name)) for name in STEP_OPTIONAL_FIELDS)
        return {"type": event.kind, **event.plan.to_dict(), **timings}
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
        return StepEvent(plan=StepPlan.from_dict(values), **timings)
    check_keys(cls, values, kind)
    if cls is KVSnapshotEvent:
        for name in ("block_tables", "swap_tables"):
            values[name] = {int(r): list(t) for r, t in values[name].items()}
    return cls(**values)


# ---- built from the engine's objects -----------------------------------------------------
def arrived(req: Request) -> RequestArrived:
    return RequestArrived(
        time=req.arrival_time,
        request_id=req.request_id,
        prompt=req.prompt,
        num_prompt_tokens=req.num_prompt_tokens,
        max_tokens=req.params.max_tokens,
        priority=req.priority,
        params=asdict(req.params),
    )


def rejected(prompt: Any, error: str, now: float) -> RequestRejected:
    text = prompt if isinstance(prompt, str) else None
    length = len(prompt) if isinstance(prompt, list | tuple) else None
    return RequestRejected(time=now, prompt=text, num_prompt_tokens=length, error=error)


_DELTA_COLUMNS = tuple(map(attrgetter, ("request_id", "token_id", "index", "text")))


def step_request_events(
    step: StepEvent,
    new_tokens: list[TokenDelta],
    finished: list[RequestOutput],
    wants: Callable[[str], bool],
) -> Iterator[RequestEvent | StepTokens]:
    """The request events of one step, in the documented order: preempted, swapped out,
    swapped in, admitted (stamped ``wall_start``, when the scheduler decided), then first
    token, the step's tokens and finished (stamped ``wall_end``, when results were ready).
    Nothing is built for a kind that ``wants`` refuses."""
    plan, start, end = step.plan, step.wall_start, step.wall_end
    n = plan.step
    if wants("preempted"):
        for d in plan.preempted:
            yield RequestPreempted(
                time=start, request_id=d.request_id, step=n, mode=d.mode or "", reason=d.reason
            )
    for kind, decisions, cls in (
        ("swapped_out", plan.swapped_out, RequestSwappedOut),
        ("swapped_in", plan.swapped_in, RequestSwappedIn),
        ("admitted", plan.admitted, RequestAdmitted),
    ):
        if wants(kind):
            for d in decisions:
                yield cls(time=start, request_id=d.request_id, step=n, reason=d.reason)
    if new_tokens and (wants("tokens") or wants("first_token")):
        # The tokens' columns, each a map in C: at 256 rows, four list comprehensions and a
        # loop for the first tokens were most of what building a step's events cost.
        rids, token_ids, indexes, texts = ([*map(c, new_tokens)] for c in _DELTA_COLUMNS)
        if wants("first_token") and 0 in indexes:
            for rid, index in zip(rids, indexes, strict=True):
                if index == 0:
                    yield RequestFirstToken(time=end, request_id=rid, step=n)
        if wants("tokens"):
            yield StepTokens(time=end, step=n, request_ids=rids, token_ids=token_ids,
                             indexes=indexes, texts=texts)  # fmt: skip
    if wants("finished"):
        yield from _finished_events(plan, finished, end)


def _finished_events(
    plan: StepPlan, finished: list[RequestOutput], end: float
) -> Iterator[RequestFinished]:
    outputs = {o.request_id: o for o in finished}
    for d in plan.finished:
        out = outputs.get(d.request_id)
        if out is None:  # aborted between steps: already told by its aborted event
            continue
        yield RequestFinished(
            time=end,
            request_id=d.request_id,
            step=plan.step,
            finish_reason=out.finish_reason,
            reason=d.reason,
            num_prompt_tokens=len(out.prompt_token_ids),
            num_output_tokens=len(out.token_ids),
            num_preemptions=out.metrics.num_preemptions,
            num_draft_tokens=out.metrics.num_draft_tokens,
            num_accepted_tokens=out.metrics.num_accepted_tokens,
        )
