"""BlockManager: the paged KV cache's bookkeeping, without the tensors.

The KV pool is ``num_blocks`` fixed-size blocks of ``block_size`` token slots. A request
owns a block table: the list of its blocks, in order, so token ``i`` lives in slot
``block_table[i // block_size] * block_size + i % block_size``. Pure Python: the runner
owns the tensors and copies blocks when the StepPlan says so.

Every call that needs blocks either does the whole job or nothing: ``allocate_slots``
returns the new blocks (often none: a decode usually has room in its last block) or None
when the pool cannot hold the request's next tokens; ``swap_out`` and ``swap_in`` return
the block pairs to copy, or None.

With prefix caching on, full blocks are shared (see prefix_cache.py): a block's reference
count is the number of tables holding it. ``lookup`` finds the cached blocks a prompt
begins with, ``allocate_slots`` takes them into the table (a hit needs no new block), and
``commit`` keys the blocks a step has filled. A block nobody holds is free: unkeyed in the
free list, or keyed in the cache's evictable list, reused only when no unkeyed one is left.

Preemption by swapping (``preemption_mode="swap"``, continuous.py) keeps a victim's KV in
a second pool, of CPU blocks (``num_swap_blocks``), instead of computing it again: two
copies over the host link instead of a prefill. ``swap_out`` copies every block, shared
ones included, and drops one reference from each (another holder keeps it); the copies
``swap_in`` brings back are keyed again by ``commit`` unless the original is still cached.

A lower tier of the prefix cache (``num_offload_blocks``) keeps what the device evicts and
gives it back; cache_tier.py says when the block manager calls it.

Every change to a table, to the swap tables or to the evictable cached blocks is also
written to ``changes``, in order (see ``KVChange``): the step event carries that list, not
the whole pool, so instrumentation costs what the step changed (docs/events.md). Replaying
the changes from a snapshot (minicb.telemetry.kv_state) gives back every table exactly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from minicb.core.scheduler.block_pool import BlockPool, blocks_needed
from minicb.core.scheduler.cache_tier import OFFLOAD_TIER, CacheTier, DeviceSide, build_tier
from minicb.core.scheduler.prefix_cache import PrefixCache

TokenSlice = Callable[[int, int], list[int]]  # (start, end) -> token ids, as Request's
# One change to the pool, JSON-ready: [kind, request id or None, blocks or a count].
#   ["append", rid, blocks]    blocks added at the end of its table (cache hits first)
#   ["trim", rid, keep]        its table cut to its first ``keep`` blocks
#   ["free", rid, None]        its device table and its swap table gone
#   ["swap_out", rid, cpu]     its device table gone, these CPU blocks hold its copy
#   ["swap_in", rid, device]   its swap table gone, these device blocks its new table
#   ["cache", None, blocks]    blocks nobody holds that keep a cached prefix (evictable)
#   ["uncache", None, blocks]  evictable blocks taken back by a hit, or evicted for reuse
# A lower cache tier writes its own kinds here too ("offload", "reload", "host_uncache":
# minicb/host_tier/tier.py); a reload comes before the "append" that lists its blocks.
KVChange = list


class BlockManager:
    """Allocates device blocks to requests, shares cached ones, moves them to and from CPU
    swap blocks, and hands evicted prefixes to a lower cache tier, if there is one."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_swap_blocks: int = 0,
        enable_caching: bool = False,
        num_offload_blocks: int = 0,
    ) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.device = BlockPool(num_blocks)  # unkeyed free blocks
        self.swap = BlockPool(num_swap_blocks)
        self.cache = PrefixCache()
        self.changes: list[KVChange] = []  # since the last take_changes(), in order
        # A lower tier of the prefix cache (None: an evicted prefix is forgotten).
        self.host: CacheTier | None = None
        if enable_caching and num_offload_blocks:
            device = DeviceSide(self.cache, self.device, self._take, self.changes)
            self.host = build_tier(OFFLOAD_TIER, num_offload_blocks, device)
        self.ref_counts = [0] * num_blocks
        self.num_shared_blocks = 0  # blocks in more than one table, kept as counts change
        self.block_tables: dict[int, list[int]] = {}  # request id -> device blocks
        self.swap_tables: dict[int, list[int]] = {}  # request id -> CPU blocks
        # request id -> keys of its leading full blocks that commit has seen, in order.
        self.chains: dict[int, list[int]] = {}

    def take_copies(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The lower tier's copies since the last call, for a plan: (device, tier) offloads,
        made before anything writes the device blocks, and (tier, device) reloads, made
        before the forward. The tier blocks they name are free to reuse from now on."""
        return self.host.take_copies() if self.host is not None else ([], [])

    def forget_copies(self, offloads: list[tuple[int, int]], reloads: list[tuple[int, int]]):
        """A step that was to make these copies failed (interruptions.py): the lower tier
        undoes the prefixes they were to carry."""
        if self.host is not None:
            self.host.forget_copies(offloads, reloads)

    def take_changes(self) -> list[KVChange]:
        """The changes since the last call, oldest first; the journal starts empty again
        (the same list: the lower tier writes to it too)."""
        changes = self.changes.copy()
        self.changes.clear()
        return changes

    # ---- queries -------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.device.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks nobody holds, evictable cached ones included."""
        return self.device.num_free + len(self.cache.evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_swapped_blocks(self) -> int:
        return self.swap.num_used

    @property
    def num_host_cached_blocks(self) -> int:
        """Lower-tier blocks holding a cached prefix (0 without a tier)."""
        return self.host.num_used if self.host is not None else 0

    @property
    def num_cached_blocks(self) -> int:
        """Free blocks that still hold a cached prefix (evictable)."""
        return len(self.cache.evictable)

    def block_table(self, request_id: int) -> list[int]:
        return self.block_tables.get(request_id, [])

    def num_new_blocks(self, request_id: int, num_tokens: int) -> int:
        """Blocks the request lacks to hold ``num_tokens`` tokens (0 if it has room)."""
        held = len(self.block_tables.get(request_id, ()))
        return max(0, blocks_needed(num_tokens, self.block_size) - held)

    def spare_slots(self, request_id: int, num_tokens: int) -> int:
        """Tokens the request could add beyond ``num_tokens`` without evicting a cached
        prefix: the room left in its blocks plus the unkeyed free blocks. Speculative drafts
        take only these: a guess is not worth another prompt's cached blocks."""
        held = len(self.block_tables.get(request_id, ()))
        return max(0, (held + self.device.num_free) * self.block_size - num_tokens)

    def lookup(
        self, token_slice: TokenSlice, num_tokens: int, salt: str | None = None
    ) -> list[tuple[int | None, int]]:
        """(block, key) of the cached full blocks that the first ``num_tokens`` tokens
        begin with among those of requests salted ``salt`` (the request's cache_salt),
        block None for one only the lower tier holds; [] with caching off. At most
        ``(num_tokens - 1) // block_size`` blocks: the last token is always computed (its
        logits give the next token), and so no step ever writes into a shared block."""
        if not self.enable_caching:
            return []
        bs = self.block_size
        full = (num_tokens - 1) // bs
        blocks_of_tokens = (tuple(token_slice(i * bs, (i + 1) * bs)) for i in range(full))
        below = self.host.find if self.host is not None else None
        return self.cache.match(blocks_of_tokens, below, salt)

    # ---- allocate / free -----------------------------------------------------------
    def allocate_slots(
        self, request_id: int, num_tokens: int, cached: list[tuple[int | None, int]] = ()
    ) -> list[int] | None:
        """Grow the request's table to hold ``num_tokens`` tokens, starting with the
        ``cached`` blocks from ``lookup`` (for a request that holds none yet).

        Returns the blocks added that were not cached ([] when the last block still has
        room), or None, with nothing changed, when the pool has too few free blocks. A hit
        on an evictable block costs a free block but no new one; a hit in the lower tier
        costs a free block and a copy back (its ``reload``).
        """
        table = self.block_tables.get(request_id)
        if not cached and table is not None and len(table) * self.block_size >= num_tokens:
            return []  # the common decode: its last block has room (checked every step)
        new = max(0, self.num_new_blocks(request_id, num_tokens) - len(cached))
        revived = [b for b, _ in cached if b is not None and self.ref_counts[b] == 0]
        on_host = [k for b, k in cached if b is None]  # keys only the lower tier holds
        if new + len(revived) + len(on_host) > self.num_free_blocks:
            return None
        for block, _ in cached:  # before taking new ones, so none of them is evicted
            if block is None:
                continue
            if self.ref_counts[block] == 0:
                self.cache.take_back(block)
            self.ref_counts[block] += 1
            self.num_shared_blocks += self.ref_counts[block] == 2
        if revived:
            self.changes.append(["uncache", None, revived])
        if on_host:
            reloaded = iter(self.host.reload(on_host))
            cached = [(next(reloaded) if b is None else b, k) for b, k in cached]
        if cached:
            self.block_tables[request_id] = [b for b, _ in cached]
            self.chains[request_id] = [k for _, k in cached]
        blocks = self._take(new)
        if blocks:
            self.block_tables.setdefault(request_id, []).extend(blocks)
        if cached or blocks:
            self.changes.append(["append", request_id, [b for b, _ in cached] + blocks])
        return blocks

    def commit(
        self, request_id: int, num_computed: int, token_slice: TokenSlice, salt: str | None = None
    ) -> None:
        """Key the request's full blocks whose KV is now written (its first
        ``num_computed`` tokens), so later prompts with the same ``salt`` can find them."""
        if not self.enable_caching:
            return
        bs = self.block_size
        chain = self.chains.setdefault(request_id, [])
        table = self.block_tables[request_id]
        for i in range(len(chain), num_computed // bs):
            tokens = tuple(token_slice(i * bs, (i + 1) * bs))
            parent = chain[-1] if chain else self.cache.root_of(salt)
            on_host = self.host.find(parent, tokens) if self.host is not None else None
            key = on_host.key if on_host is not None else None  # one key in both tiers
            chain.append(self.cache.register(table[i], parent, tokens, key))

    def trim(self, request_id: int, keep: int) -> int:
        """Give back the request's blocks after its first ``keep`` (the blocks a step took
        for speculative drafts the model rejected); returns how many. They were never
        committed: ``commit`` keys computed tokens only."""
        table = self.block_tables.get(request_id, [])
        tail = table[keep:]
        if tail:
            del table[keep:]
            self.changes.append(["trim", request_id, keep])
            self._drop(tail)
        return len(tail)

    def free(self, request_id: int) -> int:
        """Release every device and swap block of the request; returns how many."""
        device_blocks = self.block_tables.pop(request_id, [])
        swap_blocks = self.swap_tables.pop(request_id, [])
        self.chains.pop(request_id, None)
        if device_blocks or swap_blocks:
            self.changes.append(["free", request_id, None])
        self._drop(device_blocks)
        self.swap.release(swap_blocks)
        return len(device_blocks) + len(swap_blocks)

    # ---- swap -----------------------------------------------------------------------
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

    def _take(self, n: int) -> list[int] | None:
        """``n`` blocks nobody holds, unkeyed ones first, then the least recently freed
        cached ones (which lose their keys); or None, with nothing taken."""
        if n > self.num_free_blocks:
            return None
        blocks = self.device.take(min(n, self.device.num_free)) or []
        evicted = [self.cache.evict() for _ in range(n - len(blocks))]
        if evicted:
            self.changes.append(["uncache", None, [b for b, _ in evicted]])
            if self.host is not None:  # the lower tier keeps what the device forgets
                self.host.offload(evicted)
        blocks += [b for b, _ in evicted]
        for block in blocks:
            self.ref_counts[block] = 1
        return blocks

    def _drop(self, blocks: list[int]) -> None:
        """One reference less on each block; a block nobody holds becomes free."""
        # Tail first: a chain's last blocks are evicted before its first ones, which
        # every other prompt with this prefix needs.
        parked = []
        for block in reversed(blocks):
            self.ref_counts[block] -= 1
            self.num_shared_blocks -= self.ref_counts[block] == 1
            if self.ref_counts[block] == 0:
                if self.cache.park(block):
                    parked.append(block)
                else:
                    self.device.release([block])
        if parked:
            self.changes.append(["cache", None, parked])

    # ---- invariants ----------------------------------------------------------------
    def check(self) -> None:
        """Raise AssertionError if the accounting is inconsistent."""
        held = Counter(b for blocks in self.block_tables.values() for b in blocks)
        for blocks in self.block_tables.values():
            assert len(blocks) == len(set(blocks)), "a table holds a block twice"
        for block, refs in enumerate(self.ref_counts):
            assert refs == held[block], f"block {block}: {refs} references, {held[block]} tables"
        shared = sum(1 for n in held.values() if n > 1)
        assert self.num_shared_blocks == shared, "the shared-block count is off"
        free, evictable = set(self.device.free), set(self.cache.evictable)
        assert len(free) == self.device.num_free, "a block is free twice"
        assert free.isdisjoint(held) and evictable.isdisjoint(held), "a held block is free"
        assert free.isdisjoint(self.cache.info), "a free-list block still has a key"
        assert evictable <= set(self.cache.info), "an evictable block has no key"
        assert len(held) + len(free) + len(evictable) == self.num_blocks, "a block leaked"
        for block, info in self.cache.info.items():
            assert self.cache.by_prefix[(info.parent, info.tokens)] == block, "index disagrees"
        if self.host is not None:
            self.host.check()  # its books, and its keys beside the device's
        owned = [b for blocks in self.swap_tables.values() for b in blocks]
        assert len(owned) == len(set(owned)), "a swap block is owned twice"
        assert len(owned) + self.swap.num_free == self.swap.num_blocks, "swap used + free != total"
        assert set(owned).isdisjoint(self.swap.free), "a swap block is both owned and free"
