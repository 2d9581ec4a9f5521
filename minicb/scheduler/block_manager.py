"""BlockManager: the paged KV cache's bookkeeping, without the tensors.

The KV pool is ``num_blocks`` fixed-size blocks of ``block_size`` token slots. A request
owns a block table: the list of its blocks, in order, so token ``i`` lives in slot
``block_table[i // block_size] * block_size + i % block_size``. A second pool of CPU
blocks holds swapped-out requests. Pure Python: the runner owns the tensors and copies
blocks when the StepPlan says so.

Every call that needs blocks either does the whole job or nothing: ``allocate_slots``
returns the new blocks (often none: a decode usually has room in its last block) or None
when the pool cannot hold the request's next tokens; ``swap_out`` and ``swap_in`` return
the block pairs to copy, or None. Today each block has exactly one owner, so a block is
either free or in one table; sharing blocks (prefix caching) would add reference counts.
"""

from __future__ import annotations

from collections import deque


def blocks_needed(num_tokens: int, block_size: int) -> int:
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


class BlockManager:
    """Allocates device blocks to requests, and moves them to and from CPU swap blocks."""

    def __init__(self, num_blocks: int, block_size: int, num_swap_blocks: int = 0) -> None:
        self.block_size = block_size
        self.device = BlockPool(num_blocks)
        self.swap = BlockPool(num_swap_blocks)
        self.block_tables: dict[int, list[int]] = {}  # request id -> device blocks
        self.swap_tables: dict[int, list[int]] = {}  # request id -> CPU blocks

    # ---- queries -------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.device.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.device.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.device.num_used

    @property
    def num_swapped_blocks(self) -> int:
        return self.swap.num_used

    def block_table(self, request_id: int) -> list[int]:
        return self.block_tables.get(request_id, [])

    def num_new_blocks(self, request_id: int, num_tokens: int) -> int:
        """Blocks the request lacks to hold ``num_tokens`` tokens (0 if it has room)."""
        held = len(self.block_tables.get(request_id, ()))
        return max(0, blocks_needed(num_tokens, self.block_size) - held)

    # ---- allocate / free -----------------------------------------------------------
    def allocate_slots(self, request_id: int, num_tokens: int) -> list[int] | None:
        """Grow the request's table to hold ``num_tokens`` tokens.

        Returns the blocks added ([] when the last block still has room), or None, with
        nothing changed, when the pool has too few free blocks.
        """
        new = self.device.take(self.num_new_blocks(request_id, num_tokens))
        if new:
            self.block_tables.setdefault(request_id, []).extend(new)
        return new

    def free(self, request_id: int) -> int:
        """Release every device and swap block of the request; returns how many."""
        device_blocks = self.block_tables.pop(request_id, [])
        swap_blocks = self.swap_tables.pop(request_id, [])
        self.device.release(device_blocks)
        self.swap.release(swap_blocks)
        return len(device_blocks) + len(swap_blocks)

    # ---- swap ----------------------------------------------------------------------
    def swap_out(self, request_id: int) -> list[tuple[int, int]] | None:
        """Move the request's blocks to CPU: (device block, cpu block) pairs to copy, or
        None, with nothing changed, when the swap space is too full."""
        cpu_blocks = self.swap.take(len(self.block_table(request_id)))
        if cpu_blocks is None:
            return None
        device_blocks = self.block_tables.pop(request_id, [])
        self.device.release(device_blocks)
        self.swap_tables[request_id] = cpu_blocks
        return list(zip(device_blocks, cpu_blocks, strict=True))

    def swap_in(self, request_id: int, num_tokens: int) -> list[tuple[int, int]] | None:
        """Bring the request's blocks back, with room for ``num_tokens`` tokens in all:
        (cpu block, device block) pairs to copy, or None, with nothing changed, when the
        device pool is too full."""
        if request_id not in self.swap_tables:
            raise ValueError(f"request {request_id} is not swapped out")
        cpu_blocks = self.swap_tables[request_id]
        need = max(len(cpu_blocks), blocks_needed(num_tokens, self.block_size))
        device_blocks = self.device.take(need)
        if device_blocks is None:
            return None
        del self.swap_tables[request_id]
        self.swap.release(cpu_blocks)
        self.block_tables[request_id] = device_blocks
        return list(zip(cpu_blocks, device_blocks[: len(cpu_blocks)], strict=True))

    # ---- invariants ----------------------------------------------------------------
    def check(self) -> None:
        """Raise AssertionError if the accounting is inconsistent."""
        for pool, tables in ((self.device, self.block_tables), (self.swap, self.swap_tables)):
            owned = [b for blocks in tables.values() for b in blocks]
            assert len(owned) == len(set(owned)), "a block is owned twice"
            assert len(set(pool.free)) == len(pool.free), "a block is free twice"
            assert len(owned) + pool.num_free == pool.num_blocks, "used + free != total"
            assert set(owned).isdisjoint(pool.free), "a block is both owned and free"
