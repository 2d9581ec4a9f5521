"""RowSums: what one step's rows add up to, counted once for every listener.

The metrics collector, Prometheus and the server's frames each want the same sums over a
step's rows (tokens by phase, rows by phase, drafted and accepted tokens, the KV tokens
held). At 256 rows each walking the rows in its own Python loop cost more than the step
event itself (docs/performance.md, the live view at scale). ``StepEvent.row_sums`` counts
them once per step, in one pass over the rows, and every listener reads the same numbers.
Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PREFILL, DECODE, PADDING = "prefill", "decode", "padding"  # as core/scheduler/plan.py names them


@dataclass(frozen=True, slots=True)
class RowSums:
    """Sums over one step's rows. Drafts and acceptances count decode rows only (the rows
    that verify speculative tokens); the KV figures count every row, padding included."""

    rows: int = 0
    prefill_rows: int = 0
    decode_rows: int = 0
    padding_rows: int = 0
    tokens: int = 0  # fed to the model, every row
    prefill_tokens: int = 0
    padding_tokens: int = 0
    drafted_rows: int = 0  # decode rows that verified at least one draft token
    draft_tokens: int = 0
    accepted_tokens: int = 0
    context_tokens: int = 0  # tokens the rows attend to after the step: the live KV tokens
    blocks: int = 0  # KV blocks the rows hold
    last_block_slack: int = 0  # empty token slots in each row's last needed block

    @property
    def useful_rows(self) -> int:
        """Rows doing real work: prefill and decode, not padding."""
        return self.rows - self.padding_rows


def row_sums(rows: Sequence[Any], block_size: int) -> RowSums:
    """The sums over ``rows`` (a plan's ScheduledRequests) with blocks of ``block_size``."""
    # One pass that reads each row once: listeners run after the forward, when the rows
    # have left the CPU's cache, and a pass per column (six of them) fetched them six
    # times (52 -> 37 us a step at 256 rows in the engine: docs/performance.md).
    tokens = prefill_tokens = padding_tokens = context_tokens = blocks = slack = 0
    prefill_rows = decode_rows = padding_rows = 0
    drafted = []  # decode rows that verified draft tokens
    for row in rows:
        num_tokens, context = row.num_tokens, row.context_len
        tokens += num_tokens
        context_tokens += context
        slack += -context % block_size  # empty token slots in the last needed block
        blocks += row.num_blocks
        phase = row.phase
        if phase == DECODE:
            decode_rows += 1
            if row.num_draft_tokens:
                drafted.append(row)
        elif phase == PREFILL:
            prefill_rows += 1
            prefill_tokens += num_tokens
        elif phase == PADDING:
            padding_rows += 1
            padding_tokens += num_tokens
    return RowSums(
        rows=len(rows),
        prefill_rows=prefill_rows,
        decode_rows=decode_rows,
        padding_rows=padding_rows,
        tokens=tokens,
        prefill_tokens=prefill_tokens,
        padding_tokens=padding_tokens,
        drafted_rows=len(drafted),
        draft_tokens=sum([r.num_draft_tokens for r in drafted]),
        accepted_tokens=sum([r.num_accepted_tokens for r in drafted]),
        context_tokens=context_tokens,
        blocks=blocks,
        last_block_slack=slack,
    )
