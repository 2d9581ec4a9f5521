"""Prefix-cache keys: a hash collision costs a probe, never a hit on another prefix's KV.

Tokens whose hashes all collide (an int subclass with a constant hash) make every block of
the same length collide, the case a crafted prompt aims at: a request whose first block
collided with another's once chained its next blocks under the other's key, and a later
prompt that began like the other and went on like it got KV computed after a different
prefix.
"""

from __future__ import annotations

from minicb.core.scheduler.block_manager import BlockManager
from minicb.core.scheduler.prefix_cache import PrefixCache


class Colliding(int):
    def __hash__(self) -> int:
        return 0


def _slice(tokens: list[int]):
    return lambda start, end: [Colliding(t) for t in tokens[start:end]]


def _filled(bm: BlockManager, rid: int, tokens: list[int]) -> list[int]:
    assert bm.allocate_slots(rid, len(tokens)) is not None
    bm.commit(rid, len(tokens), _slice(tokens))
    return bm.block_table(rid)


def test_a_forced_collision_gives_a_miss_never_a_wrong_hit():
    bm = BlockManager(num_blocks=16, block_size=2, enable_caching=True)
    a, b, c = [1, 2], [3, 4], [5, 6]
    first = _filled(bm, 1, a + [9])  # keys A
    _filled(bm, 2, b + c + [9])  # B collides with A; C is computed after B
    prompt = a + c + [9]
    hits = bm.lookup(_slice(prompt), len(prompt))
    assert [block for block, _ in hits] == [first[0]]  # A is found; C-after-B is not
    bm.check()


def test_every_hit_holds_exactly_the_prefix_asked_for():
    # 16 prompts of two colliding blocks each: every first block collides with every other
    bm = BlockManager(num_blocks=64, block_size=2, enable_caching=True)
    owner: dict[int, list[int]] = {}  # block -> the prompt whose KV it holds
    prompts = [[x, y, z, w, 9] for x in (1, 2) for y in (3, 4) for z in (1, 2) for w in (3, 4)]
    found = 0
    for rid, prompt in enumerate(prompts):
        hits = bm.lookup(_slice(prompt), len(prompt))
        for i, (block, _) in enumerate(hits):
            assert owner[block][: 2 * (i + 1)] == prompt[: 2 * (i + 1)]
        found += len(hits)
        assert bm.allocate_slots(rid, len(prompt), hits) is not None
        bm.commit(rid, len(prompt), _slice(prompt))
        for block in bm.block_table(rid):
            owner.setdefault(block, prompt)
    assert found == 12  # 12 of the 16 prompts find their first block (4 distinct ones)
    bm.check()


def test_keys_are_never_handed_out_twice_and_differ_between_caches():
    cache = PrefixCache()
    first = cache.register(0, cache.root, (1, 2))
    cache.park(0)
    assert cache.evict()[0] == 0
    again = cache.register(1, cache.root, (1, 2))  # the same prefix, registered anew
    assert again != first and cache.match([(1, 2)]) == [(1, again)]
    assert PrefixCache().root != cache.root  # a per-cache random start: not computable outside
