"""StepPlan: what one iteration will compute, and why.

The scheduler fills it, the runner executes it, and the same object, with the step's
timings beside it, is the step event that metrics, traces and the visualizer read: one
shape per iteration. It holds copies of everything the runner needs (token ids, block
tables) so that no one reaches into the scheduler's request objects behind its back.

Fields marked ``RUNNER_ONLY`` (token ids, block tables, sampling settings) are inputs of
the forward pass, not facts about the schedule: the event's JSON form leaves them out
(minicb/telemetry/event_json.py), so an event says what was decided without repeating
every prompt or every block table. What the step did to the KV pool is ``kv_ops``, the
block manager's changes in order: an event costs what the step changed, never what the
pool holds (docs/events.md). Everything else goes into the event, generated from these
dataclass fields. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minicb.core.config import SamplingParams

PREFILL, DECODE, PADDING = "prefill", "decode", "padding"
RUNNER_ONLY = {"runner_only": True}  # field metadata: not part of the event (nor of ==)


@dataclass(slots=True)  # one per request per iteration: keep it light
class ScheduledRequest:
    """One row group of the flat batch: a request's tokens for this iteration."""

    request_id: int
    phase: str  # PREFILL (a chunk of prompt or recompute), DECODE, or PADDING (static only)
    num_tokens: int  # tokens fed to the model for this request this step
    start_position: int  # position of the first of those tokens in the request's sequence
    context_len: int  # tokens attended to after this step's tokens are stored
    # The KV blocks it holds this step, in order: the runner's, not the event's (the
    # event's kv_ops say how tables changed; num_blocks says how many this row holds).
    block_table: list[int] = field(compare=False, metadata=RUNNER_ONLY)
    num_blocks: int
    store_kv: bool  # padding rows recompute an old token and must not overwrite it
    samples: bool  # True when this step ends the uncomputed tokens: a new token is drawn
    # Speculative decoding: the last num_draft_tokens of the row's tokens are guesses,
    # sampled at every position; num_accepted_tokens of them became output (after the step).
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    token_ids: list[int] = field(default_factory=list, compare=False, metadata=RUNNER_ONLY)
    params: SamplingParams | None = field(default=None, compare=False, metadata=RUNNER_ONLY)
    # Tokens generated so far: the index of the token drawn next (seeded sampling).
    num_output_tokens: int = field(default=0, compare=False, metadata=RUNNER_ONLY)

    @property
    def num_bonus_tokens(self) -> int:
        """1 when every guess was accepted: the row's last token is then the model's own
        token after the draft, a bonus no guess paid for; 0 otherwise (its last token then
        replaced the first rejected guess). Follows from the two counts, so it is not a field
        of the event: a reader of a trace works it out the same way."""
        return int(0 < self.num_draft_tokens == self.num_accepted_tokens)


@dataclass
class Decision:
    """A scheduler decision about one request, with its reason in plain words."""

    request_id: int
    reason: str
    mode: str | None = None  # preemption mode: "recompute" or "swap"
    # Admissions: tokens found in the prefix cache, which this request does not compute.
    num_cached_tokens: int = 0


DECISION_LISTS = ("admitted", "preempted", "swapped_out", "swapped_in", "drafted", "finished")


@dataclass
class StepPlan:
    step: int  # the scheduler's iteration number, from 1
    batching: str  # "continuous" or "static"
    block_size: int  # token slots per KV block, to turn blocks into tokens
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    admitted: list[Decision] = field(default_factory=list)
    preempted: list[Decision] = field(default_factory=list)
    swapped_out: list[Decision] = field(default_factory=list)
    swapped_in: list[Decision] = field(default_factory=list)
    drafted: list[Decision] = field(default_factory=list)  # speculative drafts, and whence
    # The proposer whose drafts this step's rows verify (the speculation record's word:
    # "ngram", "draft", "early_exit"); None in a step that drafted nothing.
    proposer: str | None = None
    finished: list[Decision] = field(default_factory=list)  # filled after the step ran
    notes: list[str] = field(default_factory=list)  # other reasons: why nobody was admitted
    # (device block, cpu block) copies before the step; (cpu block, device block) after those.
    swap_out_map: list[tuple[int, int]] = field(default_factory=list)
    swap_in_map: list[tuple[int, int]] = field(default_factory=list)
    # The prefix cache's host tier (host_tier.py): (device block, host block) copies of
    # evicted cached blocks, made with the swap-outs; (host block, device block) copies of
    # host hits, made with the swap-ins, before the forward.
    offload_map: list[tuple[int, int]] = field(default_factory=list)
    reload_map: list[tuple[int, int]] = field(default_factory=list)
    budget_used: int = 0
    budget_limit: int = 0
    slots_used: int = 0
    slots_limit: int = 0
    # Read after the step, once finished requests have released their blocks: the pool's
    # figures, the queues, and the changes the step made to the pool.
    kv_used: int = 0
    kv_free: int = 0
    kv_total: int = 0
    kv_swapped: int = 0
    kv_cached: int = 0  # free blocks still holding a cached prefix (evictable), in kv_free
    kv_shared: int = 0  # blocks held by more than one request (reference count above 1)
    kv_host_cached: int = 0  # host-tier blocks holding a cached prefix (0 without the tier)
    # Prefix cache lookups of this iteration's admissions, in tokens: looked up, found, and
    # of those found, those found in the host tier (copied back, not computed).
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    prefix_host_hit_tokens: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    # The block manager's changes since the previous step, in order (block_manager.py):
    # applied to the map before the step (minicb.telemetry.kv_state), they give the map after.
    kv_ops: list[list] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(r.num_tokens for r in self.scheduled)

    @property
    def num_draft_tokens(self) -> int:
        return sum(r.num_draft_tokens for r in self.scheduled)

    @property
    def num_accepted_tokens(self) -> int:
        return sum(r.num_accepted_tokens for r in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    def explain(self) -> list[str]:
        """Every decision of this iteration, in words, for the single-step mode."""
        lines = [f"request {d.request_id} {d.reason}" for d in self.admitted]
        lines += [f"request {d.request_id} {d.reason}" for d in self.preempted]
        lines += [f"request {d.request_id} {d.reason}" for d in self.swapped_in]
        lines += [f"request {d.request_id} {d.reason}" for d in self.drafted]
        lines += list(self.notes)
        lines += [f"request {d.request_id} {d.reason}" for d in self.finished]
        return lines
