"""HostTier: the prefix cache's host tier, cached blocks kept in host memory and given back.

When the device pool needs a block that still holds a cached prefix, the prefix cache
forgets it (prefix_cache.py, ``evict``). The host tier, a lower tier of the prefix cache
(the seam: minicb/core/scheduler/cache_tier.py), first copies it here: the plan says
"offload device block d -> host block h" (the runner copies it at the start of the step,
before anyone writes d), and this tier keeps h under the same (parent key, tokens) pair
and the same key, so a later prompt's walk finds it where the device pool no longer has it.
A hit here is copied back ("reload host h -> device d", before the step's forward) into a
device block that takes the prefix's key again, so the blocks after it are found by the
same walk, on the device or here. Host memory is usually larger than the device's, and a
copy back is cheaper than a prefill.

As SGLang's HiCache keeps a host copy beside a device node, the tier is inclusive: a
reloaded block stays here, so when the device evicts it again nothing is copied (the host
already holds it). vLLM's CPU offloading connector and LMCache keep evicted blocks in a
host store the same way; here the store is one bounded pool of ``num_blocks`` block ids,
least recently used first out. Keys are never made here, only kept: every key is the
device cache's (handed out once, compared with its tokens in full), so one key still names
exactly one prefix in either tier.

A block that a step copies into or out of is ``pinned`` until the plan takes the step's
copies: the runner makes all of a step's offloads before its reloads, so a host block must
not be written twice, nor written after it was chosen to be read, within one step. A step
whose copies never ran is undone by ``forget_copies``: the blocks they were to fill hold
nothing. Every move is written to the block manager's journal (``device.changes``):
"offload" and "reload" pairs, "host_uncache" for host blocks that lose their prefix. Pure
Python: the runner owns the host tensor.
"""

from __future__ import annotations

from collections import OrderedDict

from minicb.core.scheduler.block_pool import BlockPool
from minicb.core.scheduler.cache_tier import Copies, DeviceSide
from minicb.core.scheduler.prefix_cache import CachedBlock

Prefix = tuple[int, tuple[int, ...]]  # (parent key, tokens): what names a cached block


class HostTier:
    """``num_blocks`` host blocks holding cached prefixes, least recently used first out;
    a ``CacheTier`` of the block manager whose ``device`` side it is given."""

    def __init__(self, num_blocks: int, device: DeviceSide) -> None:
        self.num_blocks = num_blocks
        self.device = device
        self.pool = BlockPool(num_blocks)  # the host blocks holding nothing
        self.by_prefix: dict[Prefix, int] = {}  # (parent, tokens) -> host block
        self.by_key: dict[int, int] = {}  # key -> host block
        # Host block -> what it holds, least recently stored or reloaded first (the order
        # the events' kv_ops give too: minicb/telemetry/kv_state.py).
        self.info: OrderedDict[int, CachedBlock] = OrderedDict()
        self.pinned: set[int] = set()  # copied into or out of by the step being planned
        self.offloads: Copies = []  # (device, host) copies since take_copies
        self.reloads: Copies = []  # (host, device) copies since take_copies

    @property
    def num_used(self) -> int:
        return len(self.info)

    def find(self, parent: int, tokens: tuple[int, ...]) -> CachedBlock | None:
        """What the host holds for this prefix block (its key), or None."""
        block = self.by_prefix.get((parent, tokens))
        return None if block is None else self.info[block]

    # ---- the moves the block manager asks for ---------------------------------------
    def offload(self, evicted: list[tuple[int, CachedBlock]]) -> None:
        """Keep the prefixes of just-evicted device blocks (block, what it held): a copy
        each, unless this tier holds that prefix already."""
        pairs, dropped = [], []
        for block, held in evicted:
            host_block, room = self.store(held)
            dropped += room
            if host_block is not None:
                pairs.append([block, host_block])
        self.offloads += [(d, h) for d, h in pairs]
        if dropped:
            self.device.changes.append(["host_uncache", None, dropped])
        if pairs:
            self.device.changes.append(["offload", None, pairs])

    def reload(self, keys: list[int]) -> list[int]:
        """Device blocks for host hits (``keys``, in chain order), each keyed again as the
        host keeps it, each host block the most recently used now. The caller has counted
        the room."""
        sources = [self.by_key[key] for key in keys]
        self.pinned.update(sources)  # before the evictions for room, which store here
        blocks = self.device.take(len(keys))
        for source, block in zip(sources, blocks, strict=True):
            self.info.move_to_end(source)
            held = self.info[source]
            self.device.cache.register(block, held.parent, held.tokens, held.key)
        self.reloads += list(zip(sources, blocks, strict=True))
        # After the offloads of those evictions, as the events replay it.
        pairs = [[h, d] for h, d in zip(sources, blocks, strict=True)]
        self.device.changes.append(["reload", None, pairs])
        return blocks

    def take_copies(self) -> tuple[Copies, Copies]:
        """The (device, host) offloads and (host, device) reloads since the last call; the
        blocks they name are no longer pinned."""
        copies = self.offloads, self.reloads
        self.offloads, self.reloads = [], []
        self.pinned.clear()
        return copies

    def forget_copies(self, offloads: Copies, reloads: Copies) -> None:
        """A step that was to make these copies failed (its requests already freed): host
        blocks it was to fill, and device blocks it was to reload, no longer hold their
        prefixes, so no later hit reads KV that was never copied."""
        stale = [h for _, h in offloads if h in self.info]
        for block in stale:
            self.drop(block)
        if stale:
            self.device.changes.append(["host_uncache", None, stale])
        cache = self.device.cache
        unkeyed = [d for _, d in reloads if d in cache.evictable]
        for block in unkeyed:
            cache.forget(block)
            self.device.free.release([block])
        if unkeyed:
            self.device.changes.append(["uncache", None, unkeyed])

    # ---- the store --------------------------------------------------------------------
    def store(self, held: CachedBlock) -> tuple[int | None, list[int]]:
        """Make room for ``held`` and keep it: (the host block to copy it into, the blocks
        whose prefixes were dropped for room). (None, []) when it is here already (no copy
        is needed: the tier is inclusive) or every block is pinned by this step."""
        if (held.parent, held.tokens) in self.by_prefix:
            return None, []
        dropped = []
        if not self.pool.num_free:
            victim = next((b for b in self.info if b not in self.pinned), None)
            if victim is None:
                return None, []
            self.drop(victim)
            dropped.append(victim)
        (block,) = self.pool.take(1)
        self.by_prefix[(held.parent, held.tokens)] = block
        self.by_key[held.key] = block
        self.info[block] = held
        self.pinned.add(block)
        return block, dropped

    def drop(self, block: int) -> None:
        """Forget what ``block`` holds (for room, or because its copy never ran)."""
        held = self.info.pop(block)
        del self.by_prefix[(held.parent, held.tokens)]
        del self.by_key[held.key]
        self.pool.release([block])

    def check(self) -> None:
        """Raise AssertionError if the tier's books disagree, or a prefix has another key
        here than on the device."""
        assert len(self.info) + self.pool.num_free == self.num_blocks, "a host block leaked"
        assert set(self.pool.free).isdisjoint(self.info), "a host block is free and held"
        assert len(self.by_prefix) == len(self.by_key) == len(self.info), "an index is off"
        for block, held in self.info.items():
            assert self.by_prefix[(held.parent, held.tokens)] == block, "prefix index is off"
            assert self.by_key[held.key] == block, "key index is off"
        for info in self.device.cache.info.values():
            on_host = self.find(info.parent, info.tokens)
            assert on_host is None or on_host.key == info.key, "a prefix has two keys"
