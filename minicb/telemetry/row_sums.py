"""RowSums: what one step's rows add up to, counted once for every listener.

The metrics collector, Prometheus and the server's frames each want the same sums over a
step's rows (tokens by phase, rows by phase, drafted and accepted tokens, the KV tokens
held). At 256 rows each walking the rows in its own Python loop cost more than the step
event itself (docs/performance.md, the live view at scale). ``StepEvent.row_sums`` counts
them once per step, column by column in C (``map`` of ``attrgetter``, ``list.count``,
``sum``), and every listener reads the same numbers. Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import attrgetter, eq, floordiv, neg
from typing import Any

PREFILL, DECODE, PADDING = "prefill", "decode", "padding"  # as minicb.scheduler.plan names them
_PHASE, _TOKENS, _CONTEXT, _BLOCKS, _DRAFTS, _ACCEPTED = map(
    attrgetter,
    ("phase", "num_tokens", "context_len", "num_blocks", "num_draft_tokens",
     "num_accepted_tokens"),
)  # fmt: skip


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
    if not rows:
        return RowSums()
    # One column at a time, each a list of values the rows already hold: no tuple per row,
    # so nothing here brings the garbage collector's next pass closer.
    phases, tokens = list(map(_PHASE, rows)), list(map(_TOKENS, rows))
    contexts, drafts = list(map(_CONTEXT, rows)), list(map(_DRAFTS, rows))
    n_prefill, n_decode = phases.count(PREFILL), phases.count(DECODE)
    n_padding = phases.count(PADDING)
    accepted: list[int] | None = None  # read only where some row drafted
    if n_decode < len(rows):  # only decode rows verify drafts
        drafts = list(compress(drafts, map(eq, phases, repeat(DECODE))))
    drafted_rows = len(drafts) - drafts.count(0)
    if drafted_rows:
        accepted = list(map(_ACCEPTED, rows))
        if n_decode < len(rows):
            accepted = list(compress(accepted, map(eq, phases, repeat(DECODE))))
    context_tokens = sum(contexts)
    # blocks each row's live tokens need: -(-c // bs), a ceiling division per row
    needed = -sum(map(floordiv, map(neg, contexts), repeat(block_size)))
    return RowSums(
        rows=len(rows),
        prefill_rows=n_prefill,
        decode_rows=n_decode,
        padding_rows=n_padding,
        tokens=sum(tokens),
        prefill_tokens=_sum_where(tokens, phases, PREFILL) if n_prefill else 0,
        padding_tokens=_sum_where(tokens, phases, PADDING) if n_padding else 0,
        drafted_rows=drafted_rows,
        draft_tokens=sum(drafts),
        accepted_tokens=sum(accepted) if accepted else 0,
        context_tokens=context_tokens,
        blocks=sum(map(_BLOCKS, rows)),
        last_block_slack=needed * block_size - context_tokens,
    )


def _sum_where(values: Sequence[int], phases: Sequence[str], phase: str) -> int:
    return sum(compress(values, map(eq, phases, repeat(phase))))
