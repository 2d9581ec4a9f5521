"""HostTierMoves: the block manager's side of the host tier, device blocks reloaded from
host memory and copies that never ran forgotten.

With prefix caching, a block nobody holds keeps its prefix until the pool needs the block
for something else; then the prefix is gone and the next prompt that begins with it
computes it again. The host tier (host_tier.py, ``num_offload_blocks``) keeps such evicted
blocks in host memory instead, usually larger than the device's, and a copy back is
cheaper than a prefill: ``_take`` offloads what it evicts, and a prompt's walk
(``lookup``) goes on there where the device has no block, so a host hit costs a free
device block and a copy back, not a recomputation. The tier collects the copies a step
needs; ``take_copies`` (block_manager.py, as every step asks) hands them to the plan.

These are the two moves that happen only with a host tier: ``_reload`` gives host hits
device blocks again (from ``allocate_slots``), and ``forget_copies`` undoes the prefixes
of a step whose copies never ran.

A mixin: ``BlockManager`` (block_manager.py) inherits it, and these methods work on its
state: ``host`` (the HostTier), ``cache`` (the device's PrefixCache), ``device`` (the
unkeyed free blocks) and ``changes``, and its ``_take``. Pure Python: the runner owns the
host tensor and makes the copies the plan lists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minicb.core.scheduler.block_pool import BlockPool
from minicb.core.scheduler.prefix_cache import PrefixCache
from minicb.host_tier.tier import HostTier

if TYPE_CHECKING:
    from minicb.core.scheduler.block_manager import KVChange


class HostTierMoves:
    """BlockManager's moves between its device blocks and the host tier."""

    host: HostTier | None  # None: an evicted prefix is forgotten
    cache: PrefixCache
    device: BlockPool  # unkeyed free device blocks
    changes: list[KVChange]

    def _reload(self, keys: list[int]) -> list[int]:
        """Device blocks for host-tier hits (``keys``, in chain order), each keyed again as
        the host keeps it. The caller has counted the room."""
        sources = [self.host.pin(key) for key in keys]  # before the evictions for room
        blocks = self._take(len(keys))
        # After the offloads of those evictions, as the events replay it.
        for block, held in zip(blocks, self.host.reload(sources, blocks), strict=True):
            self.cache.register(block, held.parent, held.tokens, held.key)
        self.changes.append(
            ["reload", None, [[h, d] for h, d in zip(sources, blocks, strict=True)]]
        )
        return blocks

    def forget_copies(self, offloads: list[tuple[int, int]], reloads: list[tuple[int, int]]):
        """A step that was to make these copies failed (its requests already freed): host
        blocks it was to fill, and device blocks it was to reload, no longer hold their
        prefixes, so no later hit reads KV that was never copied."""
        stale = self.host.forget(offloads) if self.host is not None else []
        if stale:
            self.changes.append(["host_uncache", None, stale])
        unkeyed = [d for _, d in reloads if d in self.cache.evictable]
        for block in unkeyed:
            self.cache.forget(block)
            self.device.release([block])
        if unkeyed:
            self.changes.append(["uncache", None, unkeyed])
