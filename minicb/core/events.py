"""The event schema: what the engine reports, one iteration and one request at a time.

Every event is a plain dataclass of JSON-safe values (ints, floats, strings, lists, dicts,
None), so that a trace file, a WebSocket and a notebook all see the same thing:

- ``StepEvent``: one per iteration: the StepPlan itself (what ran, with each row's block
  ids, what the scheduler decided and why, budgets, slots, KV pool, queues) and timings;
- request events (``RequestArrived`` ... ``KVTransfer``) and ``StepTokens``, the tokens of
  one iteration: one request's life, in minicb/core/request_events.py;
- ``EngineReset``: an engine was rebuilt with new settings (request ids start again);
- ``KVSnapshotEvent``: the whole KV map (every request's blocks), now and then: a step
  event carries only the changes its step made (``kv_ops``), so a reader that joins late
  or seeks starts from a snapshot (minicb.telemetry.kv_state.KVState);
- ``KVChanges``: changes made to the pool between two steps (a prefill engine freeing the
  KV it has sent, an abort on an engine that then idles), published when they are made.

``EVENT_TYPES`` names every kind; ``to_dict``/``from_dict`` (event_json.py) convert to and
from JSON-ready dicts, whose ``type`` key names the event. ``SCHEMA_VERSION`` changes
whenever a field is renamed, removed or changes meaning; docs/events.md documents every
field. Pure Python: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

from minicb.core.request_events import (
    KVTransfer,
    RequestAborted,
    RequestAdmitted,
    RequestArrived,
    RequestEvent,
    RequestFinished,
    RequestFirstToken,
    RequestPreempted,
    RequestRejected,
    RequestRouted,
    RequestSwappedIn,
    RequestSwappedOut,
    StepTokens,
)
from minicb.core.row_sums import RowSums, row_sums
from minicb.core.scheduler.plan import StepPlan

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
