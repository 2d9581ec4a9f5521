"""The prefix-aware router's own record of the prompt prefixes it sent to one replica.

The record is approximate, and that is fine. It is a set of block-sized chunks per
replica, each keyed by the hash of the chain of token ids up to it (the engine's own
prefix cache keys full blocks the same way, minicb/core/scheduler/prefix_cache.py), bounded in
size with the least recently used chunks forgotten first. It says what the router *sent*,
not what the replica *holds*: the replica may have evicted those blocks under memory
pressure (the router then over-estimates and loses only a hit), may not have computed them
yet (a request still waiting), and the record never learns the tokens a replica generated
(a chat's next turn repeats the answer, which is cached there but not in the record: the
router under-estimates). A hash collision could claim a prefix that is not there; it costs
a recomputation, never a wrong answer, because the engine checks its own cache. Being
wrong costs speed, never correctness, so the router needs no message from the replicas,
and it works the same for any engine behind it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixRecord:
    """What prefixes the router sent to one replica: chained block keys, LRU-bounded."""

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self.blocks)

    def matched(self, keys: Sequence[int]) -> int:
        """How many of the prompt's leading block keys this replica was sent."""
        n = 0
        for key in keys:
            if key not in self.blocks:
                break
            n += 1
        return n

    def insert(self, keys: Sequence[int]) -> None:
        """Remember the keys (most recently used now); forget the oldest past the bound."""
        for key in keys:
            self.blocks[key] = None
            self.blocks.move_to_end(key)
        while len(self.blocks) > self.max_blocks:
            self.blocks.popitem(last=False)
