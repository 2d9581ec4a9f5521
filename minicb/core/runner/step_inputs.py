"""A StepPlan flattened into the tensors of one ragged batch: what the model reads.

Every scheduled row contributes its tokens one after another (no padding between
requests): their ids and positions, the flat KV slot each one is stored to (-1 for a
static batch's padding rows, which store nothing), and which of them are sampled (a row's
last token, and each speculative draft before it). The attention metadata (query and
context lengths, block tables) comes with them. Rank 0 and every tensor-parallel worker
build the same batch from the same plan here (tensor parallelism: minicb/parallel/).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minicb.core.attention import AttentionMetadata
from minicb.core.scheduler.plan import StepPlan


@dataclass(frozen=True)
class StepInputs:
    """One step's ragged batch, ready for the model."""

    input_ids: torch.Tensor  # (T,) int64
    positions: torch.Tensor  # (T,) int64
    meta: AttentionMetadata
    sample_rows: list[int]  # indices into the T tokens whose logits are sampled, in order


def step_inputs(plan: StepPlan, block_size: int, device: torch.device) -> StepInputs:
    """The plan's scheduled rows, end to end, as tensors on ``device``."""
    bs = block_size
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    sample_rows: list[int] = []
    for row in plan.scheduled:
        input_ids += row.token_ids
        span = range(row.start_position, row.start_position + row.num_tokens)
        positions += span
        if row.store_kv:
            slots += [row.block_table[p // bs] * bs + p % bs for p in span]
        else:
            slots += [-1] * row.num_tokens
        if row.samples:  # the last token, and each draft before it (speculative rows)
            sample_rows += range(len(input_ids) - 1 - row.num_draft_tokens, len(input_ids))
    meta = AttentionMetadata.build(
        query_lens=[r.num_tokens for r in plan.scheduled],
        context_lens=[r.context_len for r in plan.scheduled],
        block_tables=[r.block_table for r in plan.scheduled],
        slot_mapping=slots,
        device=device,
    )
    ids = torch.tensor(input_ids, dtype=torch.long, device=device)
    pos = torch.tensor(positions, dtype=torch.long, device=device)
    return StepInputs(ids, pos, meta, sample_rows)
