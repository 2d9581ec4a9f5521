"""RowSums, counted column by column in C, equal the plain loop over each row that the
metrics collector used to run, on every step of runs that make every kind of row:
chunked prefill, decode, static batching's padding, speculative drafts, preemption."""

from __future__ import annotations

import pytest

from minicb import SamplingParams
from minicb.core.row_sums import RowSums, row_sums
from tests.helpers import fake_engine


def reference(rows, block_size: int) -> RowSums:
    """The plain loop: one row at a time, every figure by its definition."""
    sums = dict.fromkeys(RowSums.__slots__, 0)
    for row in rows:
        sums["rows"] += 1
        sums[f"{row.phase}_rows"] += 1
        sums["tokens"] += row.num_tokens
        if row.phase in ("prefill", "padding"):
            sums[f"{row.phase}_tokens"] += row.num_tokens
        if row.phase == "decode":
            sums["drafted_rows"] += row.num_draft_tokens > 0
            sums["draft_tokens"] += row.num_draft_tokens
            sums["accepted_tokens"] += row.num_accepted_tokens
        sums["context_tokens"] += row.context_len
        sums["blocks"] += row.num_blocks
        needed = -(-row.context_len // block_size)
        sums["last_block_slack"] += needed * block_size - row.context_len
    return RowSums(**sums)


@pytest.mark.parametrize(
    "options",
    [
        {"max_num_batched_tokens": 8},  # chunked prefill beside decode rows
        {"batching": "static"},  # padding rows
        {"speculative": "ngram", "num_speculative_tokens": 3},  # drafts, some accepted
        {"num_kv_blocks": 8, "preemption_mode": "recompute"},  # preempted and recomputed
    ],
    ids=["chunked", "static", "speculative", "preemption"],
)
def test_row_sums_equal_the_plain_loop_on_every_step(options):
    engine = fake_engine(block_size=4, **options)
    engine.runner.token_fn = lambda rid, i: (1, 2, 3)[i % 3]  # repeats: drafts that hit
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2, 3], [4] * 13, [5, 6] * 6, [7, 8, 9]]
    for i, prompt in enumerate(prompts):
        engine.add_request(
            prompt, SamplingParams(max_tokens=6 + 3 * i, temperature=0.0, ignore_eos=True)
        )
    phases, drafted = set(), 0
    while engine.has_unfinished():
        event = engine.step().event
        rows = event.plan.scheduled
        assert event.row_sums == reference(rows, event.plan.block_size)
        assert event.row_sums is event.row_sums  # counted once, whoever asks
        phases |= {r.phase for r in rows}
        drafted += event.row_sums.draft_tokens
    static = options.get("batching") == "static"
    assert phases == {"prefill", "decode"} | ({"padding"} if static else set())
    assert drafted > 0 or "speculative" not in options


def test_no_rows_sum_to_zero():
    assert row_sums([], 16) == RowSums() and RowSums().useful_rows == 0
