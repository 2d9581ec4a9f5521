"""AttentionMetadata: how the flat ragged batch maps onto requests and KV-cache slots.

The runner builds one per iteration from the StepPlan. Token ``t`` of the batch belongs to
request ``i`` when ``query_start[i] <= t < query_start[i+1]``. Request ``i`` attends to
``context_lens[i]`` tokens held in the blocks ``block_tables[i]``; its query tokens are the
last ``query_len`` of that context, so query ``j`` sits at absolute position
``context_lens[i] - query_len + j`` and sees keys ``0 ..`` that position (causal).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # (T,) int64, cache slot of each token; -1: do not store
    block_tables: torch.Tensor  # (B, max_blocks) int32, padded with 0
    context_lens: torch.Tensor  # (B,) int32, tokens attended to, this step's included
    query_start: torch.Tensor  # (B+1,) int32, cumulative query lengths
    max_query_len: int
    max_context_len: int
    # Host copies, so the reference path can loop without device->host syncs.
    query_lens_host: list[int]
    context_lens_host: list[int]

    @property
    def num_requests(self) -> int:
        return len(self.query_lens_host)

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
        slot_mapping: list[int],
        device: torch.device | str,
    ) -> AttentionMetadata:
        max_blocks = max((len(t) for t in block_tables), default=0) or 1
        table = torch.zeros((len(block_tables), max_blocks), dtype=torch.int32)
        for i, blocks in enumerate(block_tables):
            if blocks:
                table[i, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        starts = [0]
        for q in query_lens:
            starts.append(starts[-1] + q)
        return cls(
            slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64, device=device),
            block_tables=table.to(device),
            context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
            query_start=torch.tensor(starts, dtype=torch.int32, device=device),
            max_query_len=max(query_lens, default=0),
            max_context_len=max(context_lens, default=0),
            query_lens_host=list(query_lens),
            context_lens_host=list(context_lens),
        )
