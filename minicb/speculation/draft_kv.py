"""A draft's own paged KV cache, kept in step with the target's rows.

A draft model (or the target's first layers) attends to the request's tokens like the
target does, so it needs their keys and values, in its own shape (its layers, its heads).
It gets a small paged pool of its own, made of the core's parts: a ``KVPool`` for the memory
(minicb/core/runner/kv_pool.py) and a ``BlockManager`` for which blocks each request holds
(minicb/core/scheduler/block_manager.py), with no prefix cache and no swap space. Beside
them it remembers, for each request, the tokens whose KV it wrote (``seen``).

Keeping in step is then one rule, applied before each draft: the KV is right for the
longest common prefix of what it saw and the request's tokens now. Everything after it is
dropped (``valid`` trims the blocks), and the draft feeds the rest. That one rule covers
every case: tokens it never saw (the prompt, chunked prefill, the target's accepted tokens
and its bonus), guesses the target rejected (they differ from the request's tokens: rolled
back), an overlap step's guess of its own last token, and a failed step undone. A request
that leaves the running batch (finished, aborted, preempted) is released whole
(``retain``) at the next call of the drafter's hook, the end of a schedule (one that
preempts, or runs whole prompts only, ends before it: the blocks wait for the next); a
preempted one is caught up again from its first token when it resumes. Correctness never
waits on that release: a held KV is used only for the prefix that still matches.
"""

from __future__ import annotations

import torch

from minicb.core.runner.kv_pool import KVPool
from minicb.core.scheduler.block_manager import BlockManager, blocks_needed


class DraftKV:
    def __init__(
        self,
        num_layers: int,
        block: tuple[int, int, int],  # (block_size, num_kv_heads, head_dim) of the draft
        num_blocks: int,
        kv_cache_dtype: str,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.block_size = block[0]
        self.pool = KVPool.allocate(num_layers, block, num_blocks, kv_cache_dtype, dtype, device)
        self.caches = self.pool.layers()  # per layer (k_cache, v_cache), as a model takes them
        self.blocks = BlockManager(num_blocks, self.block_size)
        self.seen: dict[int, list[int]] = {}  # request id -> the tokens whose KV is written

    def valid(self, request_id: int, tokens: list[int]) -> int:
        """How many leading ``tokens`` have the right KV here (never the last one: the draft
        must feed at least that to see what follows); the rest is rolled back."""
        seen = self.seen.setdefault(request_id, [])
        n = min(len(seen), len(tokens) - 1)
        if seen[:n] != tokens[:n]:  # compared in C; the walk below only when they differ
            n = next(i for i in range(n) if seen[i] != tokens[i])
        del seen[n:]
        self.blocks.trim(request_id, blocks_needed(n, self.block_size))
        return n

    def room(self, request_id: int, num_tokens: int) -> int:
        """Tokens the request could hold here beyond ``num_tokens`` (negative: not even
        those fit)."""
        return self.blocks.spare_slots(request_id, num_tokens)

    def hold(self, request_id: int, num_tokens: int) -> list[int]:
        """The request's block table, grown to hold ``num_tokens`` (``room`` said it fits)."""
        self.blocks.allocate_slots(request_id, num_tokens)
        return self.blocks.block_table(request_id)

    def wrote(self, request_id: int, tokens: list[int]) -> None:
        self.seen[request_id] = tokens

    def retain(self, request_ids: set[int]) -> None:
        """Free every request's blocks but these."""
        for request_id in [r for r in self.blocks.block_tables if r not in request_ids]:
            self.blocks.free(request_id)
        self.seen = {r: t for r, t in self.seen.items() if r in request_ids}

    @property
    def num_used_blocks(self) -> int:
        return self.blocks.num_used_blocks
