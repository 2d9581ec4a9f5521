"""The attention interface the model calls, and the torch backend behind it.

``AttentionMetadata`` says how the flat ragged batch maps onto requests and KV-cache
slots. The runner builds one per iteration from the StepPlan. Token ``t`` of the batch
belongs to request ``i`` when ``query_start[i] <= t < query_start[i+1]``. Request ``i``
attends to ``context_lens[i]`` tokens held in the blocks ``block_tables[i]``; its query
tokens are the last ``query_len`` of that context, so query ``j`` sits at absolute position
``context_lens[i] - query_len + j`` and sees keys ``0 ..`` that position (causal).

A backend has ``store_kv`` and ``attention``; the model calls only those two, so a backend
can be swapped without touching it. Which one runs is chosen once, when the runner is
built, from the registry in backend_choice.py: torch is the core's own; an optional one
(the Triton kernels, minicb/kernels/) registers there and is imported only when chosen.

``k_cache`` and ``v_cache`` are one layer's plain tensors, or in another KV format
(``kv_cache_dtype``, kv_layer.py) objects that write and read themselves: the 8-bit one
quantises in ``store_kv`` and dequantises on read in ``attention``, and the code here is
the same for both (kv_slots.py hands them the work).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from minicb.core.attention.kv_slots import storing, write_kv
from minicb.core.attention.torch_attention import StepIndex, step_attention


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # (T,) int64, cache slot of each token; -1: do not store
    block_tables: torch.Tensor  # (B, max_blocks) int32, padded with 0
    context_lens: torch.Tensor  # (B,) int32, tokens attended to, this step's included
    query_start: torch.Tensor  # (B+1,) int32, cumulative query lengths
    max_query_len: int
    max_context_len: int
    # Host copies, so the reference and StepIndex can loop without device->host syncs.
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


class AttentionBackend(Protocol):
    name: str
    reason: str  # why this backend, in words (runner.describe() reports it)

    def store_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None: ...

    def attention(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor: ...


class TorchBackend:
    """Plain torch. Every step gathers through a ``StepIndex`` that the first layer builds
    and every later layer of the same step reuses (the step's metadata object is the key);
    which tokens store is likewise found once per step (the slot tensor is the key)."""

    name = "torch"

    def __init__(self, reason: str = "asked for") -> None:
        self.reason = reason
        self._step: tuple[AttentionMetadata, StepIndex] | None = None
        self._stores: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def store_kv(self, key, value, k_cache, v_cache, slot_mapping) -> None:
        # As reference.store_kv, but which tokens store is asked in the first layer only
        # (a host sync, on a GPU a device sync), not in all of them.
        if self._stores is None or self._stores[0] is not slot_mapping:
            self._stores = (slot_mapping, storing(slot_mapping))
        write_kv(key, value, k_cache, v_cache, slot_mapping, self._stores[1])

    def attention(self, query, k_cache, v_cache, meta, scale) -> torch.Tensor:
        if self._step is None or self._step[0] is not meta:
            self._step = (meta, StepIndex.build(meta, k_cache.shape[1]))
        return step_attention(query, k_cache, v_cache, self._step[1], scale)
