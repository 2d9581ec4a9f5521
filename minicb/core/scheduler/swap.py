"""SwapMoves: preemption by swapping, a request's KV blocks moved to CPU and back.

When the device pool cannot hold every running request's next tokens, the scheduler
preempts one (continuous.py, ``_preempt``). It has two ways to give the victim's blocks
back. Recompute (the default, ``preemption_mode="recompute"``) frees them: the request
goes back to the waiting queue and computes its KV again from its tokens when it returns,
which costs a prefill's compute. Swap (``preemption_mode="swap"``) keeps that work: the
runner copies the blocks into a second pool of CPU blocks (the swap space,
``num_swap_blocks``) and, when the device pool has room again, copies them back into new
device blocks, which costs two copies over the host link and CPU memory while it waits.
A swap space that is full falls back to recompute.

Swapping out copies every block to CPU, shared ones included, and drops one reference
from each: a running request that shares a block keeps it. Swapped-in copies are keyed
again by ``commit`` unless the original is still cached. As everywhere in the block
manager, each call does the whole job or nothing: the block pairs to copy, or None.

A mixin: ``BlockManager`` (block_manager.py) inherits it, and these methods work on its
state: ``block_size``, ``swap`` (the CPU pool), ``swap_tables``, ``block_tables``,
``chains`` and ``changes``, and its ``block_table``, ``_take`` and ``_drop``. Pure Python:
the runner owns the tensors and makes the copies the plan lists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minicb.core.scheduler.block_pool import BlockPool, blocks_needed

if TYPE_CHECKING:
    from minicb.core.scheduler.block_manager import KVChange


class SwapMoves:
    """BlockManager's moves of a request's blocks to CPU swap blocks and back."""

    block_size: int
    swap: BlockPool  # the CPU swap space
    swap_tables: dict[int, list[int]]  # request id -> CPU blocks
    block_tables: dict[int, list[int]]  # request id -> device blocks
    chains: dict[int, list[int]]
    changes: list[KVChange]

    def swap_out(self, request_id: int) -> list[tuple[int, int]] | None:
        """Move the request's blocks to CPU: (device block, cpu block) pairs to copy, or
        None, with nothing changed, when the swap space is too full. Shared blocks are
        copied too, and stay on the device for their other holders."""
        cpu_blocks = self.swap.take(len(self.block_table(request_id)))
        if cpu_blocks is None:
            return None
        device_blocks = self.block_tables.pop(request_id, [])
        self.chains.pop(request_id, None)
        self.changes.append(["swap_out", request_id, list(cpu_blocks)])
        self._drop(device_blocks)
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
        device_blocks = self._take(need)
        if device_blocks is None:
            return None
        del self.swap_tables[request_id]
        self.swap.release(cpu_blocks)
        self.block_tables[request_id] = device_blocks
        self.changes.append(["swap_in", request_id, list(device_blocks)])  # a copy: it grows
        return list(zip(cpu_blocks, device_blocks[: len(cpu_blocks)], strict=True))

    def _check_swap(self) -> None:
        """Raise AssertionError if the swap space's accounting is inconsistent."""
        owned = [b for blocks in self.swap_tables.values() for b in blocks]
        assert len(owned) == len(set(owned)), "a swap block is owned twice"
        assert len(owned) + self.swap.num_free == self.swap.num_blocks, "swap used + free != total"
        assert set(owned).isdisjoint(self.swap.free), "a swap block is both owned and free"
