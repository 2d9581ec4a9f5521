"""A replica's KV events: which full blocks of prompt it holds, told as they change.

The approximate router (router.py) remembers what it *sent*; a precise one must learn what
each replica *holds*. So, as vLLM's KV events do, every replica publishes a record after
each change to its prefix cache: the blocks it stored (a full block whose KV was written
and keyed) and the blocks it removed (evicted to make room), each named by a key the
router can compute from a prompt itself (``block_keys``): the hash of the chain of
token ids up to the end of the block. (The engine's own prefix-cache keys,
core/scheduler/prefix_cache.py, are random numbers private to its process, on purpose: the
key published here is the public name of the same prefix.)

Each record carries the replica's ``epoch`` (a random number drawn when the publisher is
made: a restarted replica has a new one) and a sequence number, 1, 2, 3... in the order
the records were made, so a reader that misses one sees the gap; ``snapshot()`` says all
the replica holds, with the sequence number of the last record it includes, for a reader
that must start again (kv_index.py).

Derived at the cost of what a step changed, not of the pool: the step event carries the
block manager's journal (``plan.kv_ops``, see block_manager.KVChange), and the publisher
reads only what the journal names plus, for each request holding blocks, whether its chain
of keyed blocks (``BlockManager.chains``) grew. A journal's ``uncache`` of a block the
publisher announced, which no longer holds that key, is a removal (an evicted block; a
cache hit that took an evictable block back keeps its key and is not one); a chain's new
link whose block the cache keys is a stored block. ``free`` and ``swap_out`` end a
request's chain (a swapped-in request builds a new one).

Two things are left out, both on purpose. A salted prompt's blocks (``cache_salt``) hang
from a root of their own that only requests with that salt can reach: a router keyed on
tokens alone must not count them. A lower cache tier's blocks (the host tier) are not the
device's: the index is of what a prefill can reuse without a copy back.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


def chain_key(parent: int, tokens: Sequence[int]) -> int:
    """The public key of a full block: the hash of (the previous block's key, this block's
    tokens), 0 before the first block, so a key names the whole prefix up to its block's
    end. A hash of ints is the same in every process (no per-process seed, unlike str's)."""
    return hash((parent, tuple(tokens)))


def block_keys(token_ids: Sequence[int], block_size: int) -> list[int]:
    """One public key per full block of a prompt, in order."""
    keys, parent = [], 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = chain_key(parent, token_ids[start : start + block_size])
        keys.append(parent)
    return keys


@dataclass(frozen=True)
class KVEventBatch:
    """One replica's changes since its previous record: keys of full blocks."""

    epoch: int
    seq: int
    stored: tuple[int, ...]
    removed: tuple[int, ...]


@dataclass(frozen=True)
class KVEventSnapshot:
    """Every key a replica holds, as of its record ``seq`` (0: before any)."""

    epoch: int
    seq: int
    keys: frozenset[int]


class KVEventPublisher:
    """Watches one engine's bus and hands each non-empty change to ``send`` as a
    ``KVEventBatch`` (see the module doc)."""

    def __init__(self, engine: Any, send: Callable[[KVEventBatch], None]) -> None:
        self.blocks = engine.scheduler.blocks
        self.requests = engine.scheduler.requests
        self.send = send
        self.epoch = secrets.randbits(62)
        self.seq = 0
        self.held: dict[int, tuple[int, int]] = {}  # block -> (engine's key, public key)
        # request id -> public keys of its chain's links seen so far, in order
        self.chains: dict[int, list[int]] = {}
        engine.bus.subscribe(self._on_events, kinds=["step", "kv_changes"])

    def snapshot(self) -> KVEventSnapshot:
        """All it holds now, as of its latest record."""
        return KVEventSnapshot(
            self.epoch, self.seq, frozenset(public for _, public in self.held.values())
        )

    def _on_events(self, batch: Sequence[Any]) -> None:
        for event in batch:
            ops = event.kv_ops if event.kind == "kv_changes" else event.plan.kv_ops
            removed = self._removed(ops)
            stored = self._stored()
            if stored or removed:
                self.seq += 1
                self.send(KVEventBatch(self.epoch, self.seq, tuple(stored), tuple(removed)))

    def _removed(self, ops: Sequence[list]) -> list[int]:
        removed = []
        info = self.blocks.cache.info
        for kind, request_id, blocks in ops:
            if kind in ("free", "swap_out"):
                self.chains.pop(request_id, None)
            elif kind == "uncache":
                for block in blocks:
                    known = self.held.get(block)
                    now = info.get(block)
                    if known is not None and (now is None or now.key != known[0]):
                        removed.append(known[1])
                        del self.held[block]
        return removed

    def _stored(self) -> list[int]:
        stored = []
        info, bs = self.blocks.cache.info, self.blocks.block_size
        for request_id, chain in self.blocks.chains.items():
            seen = self.chains.setdefault(request_id, [])
            if len(chain) <= len(seen):
                continue
            request = self.requests.get(request_id)
            if request is None or request.params.cache_salt is not None:
                continue
            table = self.blocks.block_tables[request_id]
            for i in range(len(seen), len(chain)):
                tokens = request.token_slice(i * bs, (i + 1) * bs)
                seen.append(chain_key(seen[-1] if seen else 0, tokens))
                block = table[i]
                keyed = info.get(block)
                # The block this link names, unless another block held the prefix first
                # (then that one was announced when it was stored).
                if keyed is not None and keyed.key == chain[i] and block not in self.held:
                    self.held[block] = (chain[i], seen[-1])
                    stored.append(seen[-1])
        return stored
