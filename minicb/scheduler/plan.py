"""StepPlan: what one iteration will compute, and why.

The scheduler fills it, the runner executes it, the events and the visualizer read it.
It holds copies of everything the runner needs (token ids, block table) so that no one
reaches into the scheduler's request objects behind its back. Pure Python, JSON-safe
through ``to_dict``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from minicb.sampling_params import SamplingParams

PREFILL, DECODE, PADDING = "prefill", "decode", "padding"


@dataclass(slots=True)  # one per request per iteration: keep it light
class ScheduledRequest:
    """One row group of the flat batch: a request's tokens for this iteration."""

    request_id: int
    phase: str  # PREFILL (a chunk of prompt or recompute), DECODE, or PADDING (static only)
    token_ids: list[int]  # the tokens fed to the model this step
    start_position: int  # position of token_ids[0] in the request's sequence
    context_len: int  # tokens attended to after this step's tokens are stored
    block_table: list[int]
    store_kv: bool  # padding rows recompute an old token and must not overwrite it
    samples: bool  # True when this step ends the uncomputed tokens: a new token is drawn
    params: SamplingParams
    num_output_tokens: int  # tokens generated so far: the index of the token drawn next

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class Decision:
    """A scheduler decision about one request, with its reason in plain words."""

    request_id: int
    reason: str
    mode: str | None = None  # preemption mode: "recompute" or "swap"


@dataclass
class StepPlan:
    step: int
    batching: str
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    admitted: list[Decision] = field(default_factory=list)
    preempted: list[Decision] = field(default_factory=list)
    swapped_out: list[Decision] = field(default_factory=list)
    swapped_in: list[Decision] = field(default_factory=list)
    finished: list[Decision] = field(default_factory=list)  # filled after the step ran
    notes: list[str] = field(default_factory=list)  # other reasons: why nobody was admitted
    # (device block, cpu block) copies before the step; (cpu block, device block) after those.
    swap_out_map: list[tuple[int, int]] = field(default_factory=list)
    swap_in_map: list[tuple[int, int]] = field(default_factory=list)
    budget_used: int = 0
    budget_limit: int = 0
    slots_used: int = 0
    slots_limit: int = 0
    kv_used: int = 0
    kv_free: int = 0
    kv_total: int = 0
    kv_swapped: int = 0
    num_waiting: int = 0
    num_swapped: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(r.num_tokens for r in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    def explain(self) -> list[str]:
        """Every decision of this iteration, in words, for the single-step mode."""
        lines = [f"request {d.request_id} {d.reason}" for d in self.admitted]
        lines += [f"request {d.request_id} {d.reason}" for d in self.preempted]
        lines += [f"request {d.request_id} {d.reason}" for d in self.swapped_in]
        lines += list(self.notes)
        lines += [f"request {d.request_id} {d.reason}" for d in self.finished]
        return lines

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for row in data["scheduled"]:
            row.pop("params")  # settings, not state: sent once when the request arrives
        return data
