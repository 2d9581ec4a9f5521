"""BlockPool: a free list over block ids, the one way a pool of KV blocks is handed out.

The block manager keeps two, the device pool's unkeyed free blocks and the CPU swap space,
and a lower tier of the prefix cache may keep one (minicb/host_tier/tier.py). A pool knows
only which ids are free; who holds a block, and what it holds, is its owner's business.
``blocks_needed`` counts the blocks a number of tokens fills. Pure Python: no tensor is
touched here.
"""

from __future__ import annotations

from collections import deque


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks of ``block_size`` slots that hold ``num_tokens`` tokens (the last in part)."""
    return -(-num_tokens // block_size)


class BlockPool:
    """A free list over ``num_blocks`` block ids."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def take(self, n: int) -> list[int] | None:
        """``n`` free blocks, or None (and nothing taken) if fewer are free."""
        if n > len(self.free):
            return None
        return [self.free.popleft() for _ in range(n)]

    def release(self, blocks: list[int]) -> None:
        self.free.extend(blocks)
