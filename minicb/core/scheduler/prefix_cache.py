"""PrefixCache: which full KV blocks hold which tokens, so that requests can share them.

Chained full blocks, as vLLM does it: a block is found by (its parent's key, its token
ids), so it stands for the whole prefix up to the end of that block, and a lookup walks a
new prompt block by block until one is missing. A key is a number handed out when a block
is registered and never handed out again, so it names exactly one prefix, and the dict
compares the whole (parent key, tokens) pair, not its hash: two prefixes whose hashes
collide cost a probe, never a hit on the other's KV (an unsalted hash of the tokens as the
key once let a forced collision hand one request another's KV; vLLM had it as a security
issue). The keys start at a random number per process, so nobody outside it can compute a
block's dict hash and crowd one slot with colliding prompts. Only full blocks are keyed,
and only once their KV has been written (the block manager registers them after the step
that computed them). Nothing else needs to enter the key: one cache serves one model in
one dtype, and a new engine (``rebuilt``) starts with an empty pool.

A shared cache tells whoever sends a prompt whether someone sent its first blocks before
(the cached-token count in the reply, a shorter time to first token), so one caller can
probe another's prompt block by block. A request's ``cache_salt`` (SamplingParams, the
name vLLM uses) scopes it: the first block of a salted prompt hangs from a root of its
own, ``root_of(salt)``, so chains of different salts never meet, and every later block
follows its parent. That root is a keyed hash (BLAKE2b with this cache's random key) of
the salt, above 2**64 where no handed-out key ever is: two salts share a root only by a
128-bit collision nobody outside can aim for, and no table of salts grows. No salt: the
shared root, exactly as before.

Why not a radix tree (SGLang's RadixAttention)? A tree shares prefixes at token
granularity and evicts whole subtrees, but needs a tree walk, node splits and its own
eviction order. Hashed blocks share at block granularity, which is what the paged KV
cache can share anyway, and fit in a dict and an ordered dict: small enough to read.

A block whose last holder leaves keeps its key and contents in ``evictable`` (least
recently freed first); a hit takes it back untouched; it loses its key only when the pool
needs it for something else (``evict``), and with a lower tier (cache_tier.py: the host
tier, for one) its prefix is first kept there under the same key. Pure Python.
"""

from __future__ import annotations

import hashlib
import itertools
import secrets
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CachedBlock:
    """What a keyed block holds: its key, its parent's key (``root`` first), its tokens."""

    key: int
    parent: int
    tokens: tuple[int, ...]


class PrefixCache:
    def __init__(self) -> None:
        self._keys = itertools.count(secrets.randbits(62))  # never the same key twice
        self.root = next(self._keys)  # the parent of every unsalted first block
        self._salt_key = secrets.token_bytes(32)  # keys the salted roots' hash
        self.by_prefix: dict[tuple[int, tuple[int, ...]], int] = {}  # (parent, tokens) -> block
        self.info: dict[int, CachedBlock] = {}  # block id -> what it holds
        # Keyed blocks nobody holds, least recently freed first: free, but still cached.
        self.evictable: OrderedDict[int, None] = OrderedDict()

    def root_of(self, salt: str | None) -> int:
        """The parent of a first block: ``root`` without a salt, else the salt's own root
        (2**64 plus a 128-bit keyed hash: never a key ``register`` hands out)."""
        if salt is None:
            return self.root
        digest = hashlib.blake2b(salt.encode(), key=self._salt_key, digest_size=16).digest()
        return (1 << 64) + int.from_bytes(digest)

    def match(
        self,
        blocks_of_tokens: Iterable[tuple[int, ...]],
        find_below: Callable[[int, tuple[int, ...]], CachedBlock | None] | None = None,
        salt: str | None = None,
    ) -> list[tuple[int | None, int]]:
        """(block, key) of the cached blocks that begin this run of full blocks' tokens
        (read lazily: the walk stops at the first miss), for a request salted ``salt``.
        A block missing here is looked for in a lower tier, if any (``find_below``, its
        ``find``): a hit there is (None, key), to be reloaded."""
        hits, parent = [], self.root_of(salt)
        for tokens in blocks_of_tokens:
            block = self.by_prefix.get((parent, tokens))
            if block is not None:
                parent = self.info[block].key
            else:
                held = find_below(parent, tokens) if find_below is not None else None
                if held is None:
                    break
                parent = held.key
            hits.append((block, parent))
        return hits

    def register(
        self, block: int, parent: int, tokens: tuple[int, ...], key: int | None = None
    ) -> int:
        """Key ``block`` as ``tokens`` after the prefix ``parent`` names, unless another
        block holds that prefix already (the first one stays: the table entry is never
        swapped for it, so no request ever loses the page it points to). Returns the key
        that names this prefix, for the next block's parent. ``key``: the one a lower tier
        keeps for this prefix (cache_tier.py), so a prefix has one key in both tiers;
        None: a new one."""
        held = self.by_prefix.get((parent, tokens))
        if held is not None:
            return self.info[held].key
        key = next(self._keys) if key is None else key
        self.by_prefix[(parent, tokens)] = block
        self.info[block] = CachedBlock(key, parent, tokens)
        return key

    def park(self, block: int) -> bool:
        """Its last holder left: keep it evictable if it is keyed; False if it is not."""
        if block not in self.info:
            return False
        self.evictable[block] = None
        return True

    def take_back(self, block: int) -> None:
        """A hit on an evictable block: it is held again, key and contents untouched."""
        del self.evictable[block]

    def evict(self) -> tuple[int, CachedBlock]:
        """The least recently freed evictable block, its key dropped, for a new use; and
        what it held (for a lower tier)."""
        block = next(iter(self.evictable))
        return block, self.forget(block)

    def forget(self, block: int) -> CachedBlock:
        """Drop ``block``'s key (it is no longer evictable, if it was); what it held."""
        self.evictable.pop(block, None)
        info = self.info.pop(block)
        del self.by_prefix[(info.parent, info.tokens)]
        return info
