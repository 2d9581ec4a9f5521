"""BlockManager: the paged KV cache's bookkeeping, without the tensors.

The KV pool is ``num_blocks`` fixed-size blocks of ``block_size`` token slots. A request
owns a block table: the list of its blocks, in order, so token ``i`` lives in slot
``block_table[i // block_size] * block_size + i % block_size``. A second pool of CPU
blocks holds swapped-out requests. Pure Python: the runner owns the tensors and copies
blocks when the StepPlan says so.

Reference counts are kept per block so that blocks could be shared (prefix caching);
today every block has one owner, and ``check()`` verifies the accounting at any moment.
"""

from __future__ import annotations

from collections import deque


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockPool:
    """A free list and reference counts over ``num_blocks`` block ids."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.free: deque[int] = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def take(self, n: int) -> list[int]:
        if n > len(self.free):
            raise RuntimeError(f"asked for {n} blocks but only {len(self.free)} are free")
        taken = [self.free.popleft() for _ in range(n)]
        for b in taken:
            self.ref_counts[b] = 1
        return taken

    def release(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref_counts[b] <= 0:
                raise RuntimeError(f"block {b} released but not in use")
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free.append(b)


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

    def num_blocks_held(self, request_id: int) -> int:
        return len(self.block_tables.get(request_id, ()))

    def extra_blocks_needed(self, request_id: int, num_tokens: int) -> int:
        """Blocks to add so that the request can hold ``num_tokens`` tokens."""
        return max(0, blocks_needed(num_tokens, self.block_size) - self.num_blocks_held(request_id))

    # ---- allocate / grow / free ------------------------------------------------------
    def can_allocate(self, request_id: int, num_tokens: int) -> bool:
        return self.extra_blocks_needed(request_id, num_tokens) <= self.device.num_free

    def allocate(self, request_id: int, num_tokens: int) -> list[int]:
        """Grow the request's table to hold ``num_tokens``; returns the new blocks."""
        extra = self.extra_blocks_needed(request_id, num_tokens)
        if extra == 0:  # the common decode case: the last block still has room
            return []
        new = self.device.take(extra)
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
    def can_swap_out(self, request_id: int) -> bool:
        return self.num_blocks_held(request_id) <= self.swap.num_free

    def swap_out(self, request_id: int) -> list[tuple[int, int]]:
        """Move the request's blocks to CPU; returns (device block, cpu block) pairs to copy."""
        device_blocks = self.block_tables.pop(request_id)
        cpu_blocks = self.swap.take(len(device_blocks))
        self.device.release(device_blocks)
        self.swap_tables[request_id] = cpu_blocks
        return list(zip(device_blocks, cpu_blocks, strict=True))

    def can_swap_in(self, request_id: int) -> bool:
        return len(self.swap_tables.get(request_id, ())) <= self.device.num_free

    def swap_in(self, request_id: int) -> list[tuple[int, int]]:
        """Bring the request's blocks back; returns (cpu block, device block) pairs to copy."""
        cpu_blocks = self.swap_tables.pop(request_id)
        device_blocks = self.device.take(len(cpu_blocks))
        self.swap.release(cpu_blocks)
        self.block_tables[request_id] = device_blocks
        return list(zip(cpu_blocks, device_blocks, strict=True))

    # ---- invariants ----------------------------------------------------------------
    def check(self) -> None:
        """Raise AssertionError if the accounting is inconsistent."""
        for pool, tables in ((self.device, self.block_tables), (self.swap, self.swap_tables)):
            owned = [b for blocks in tables.values() for b in blocks]
            assert len(owned) == len(set(owned)), "a block is owned twice"
            assert len(owned) + pool.num_free == pool.num_blocks, "used + free != total"
            assert set(owned).isdisjoint(pool.free), "a block is both owned and free"
            assert all(pool.ref_counts[b] == 1 for b in owned), "bad reference count"
