"""PrefixCache: which full KV blocks hold which tokens, so that requests can share them.

Hashed full blocks, as vLLM does it: a block's key is ``hash((parent key, its token
ids))``, so a key stands for the whole prefix up to the end of that block, and a lookup
walks a new prompt block by block until a key is missing. A hit is confirmed by comparing
the block's stored tokens and parent key, not by the hash alone. Only full blocks are
keyed, and only once their KV has been written (the block manager registers them after
the step that computed them). Nothing else needs to enter the key: one cache serves one
model in one dtype, and a new engine (``rebuilt``) starts with an empty pool.

Why not a radix tree (SGLang's RadixAttention)? A tree shares prefixes at token
granularity and evicts whole subtrees, but needs a tree walk, node splits and its own
eviction order. Hashed blocks share at block granularity, which is what the paged KV
cache can share anyway, and fit in a dict and an ordered dict: small enough to read.

A block whose last holder leaves keeps its key and contents in ``evictable`` (least
recently freed first); a hit takes it back untouched; it loses its key only when the pool
needs it for something else (``evict``). Pure Python.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CachedBlock:
    """What a keyed block holds: its key, its parent's key (None first), its tokens."""

    key: int
    parent: int | None
    tokens: tuple[int, ...]


def block_key(parent: int | None, tokens: tuple[int, ...]) -> int:
    # Keys never leave the engine, so only this process's hash matters; a collision costs
    # a miss (match compares the tokens), never a wrong hit.
    return hash((parent, tokens))


class PrefixCache:
    def __init__(self) -> None:
        self.by_key: dict[int, int] = {}  # key -> block id
        self.info: dict[int, CachedBlock] = {}  # block id -> what it holds
        # Keyed blocks nobody holds, least recently freed first: free, but still cached.
        self.evictable: OrderedDict[int, None] = OrderedDict()

    def match(self, blocks_of_tokens: Iterable[tuple[int, ...]]) -> list[tuple[int, int]]:
        """(block, key) of the cached blocks that begin this run of full blocks' tokens
        (read lazily: the walk stops at the first miss)."""
        hits = []
        parent = None
        for tokens in blocks_of_tokens:
            key = block_key(parent, tokens)
            block = self.by_key.get(key)
            if block is None or self.info[block] != CachedBlock(key, parent, tokens):
                break  # a miss, or a hash collision caught by comparing the tokens
            hits.append((block, key))
            parent = key
        return hits

    def register(self, block: int, parent: int | None, tokens: tuple[int, ...]) -> int:
        """Key ``block`` by its tokens, unless another block already holds that key (the
        first one stays: the table entry is never swapped for it, so no request ever loses
        the page it points to). Returns the key, for the next block's parent."""
        key = block_key(parent, tokens)
        if key not in self.by_key and block not in self.info:
            self.by_key[key] = block
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

    def evict(self) -> int:
        """The least recently freed evictable block, its key dropped, for a new use."""
        block, _ = self.evictable.popitem(last=False)
        del self.by_key[self.info.pop(block).key]
        return block
