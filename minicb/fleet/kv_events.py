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
looks only at the blocks the journal names, through one engine view
(``cached_prefixes``: what the prefix cache holds in given blocks). A block appended to a
table is *pending* until the cache keys it (its KV written), which may be steps later (a
chunked prefill, a decode filling its last block); the publisher then announces it as
stored, its public key computed from its parent's and its tokens. A journal's ``uncache``
of an announced block that no longer holds that key is a removal (an evicted block; a hit
that took an evictable block back keeps its key and is not one). A block its request gave
back unkeyed (``free``, ``trim``, ``swap_out``) is no longer pending: the publisher keeps
each request's table from the journal for that. So the work of a step is the blocks it
appended, evicted or freed, plus the pending ones: at most the unkeyed blocks in tables.

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
        self.engine, self.send = engine, send
        self.epoch = secrets.randbits(62)
        self.seq = 0
        self.held: dict[int, tuple[int, int]] = {}  # block -> (engine's key, public key)
        self.public: dict[int, int] = {}  # engine's key -> public key, of the held blocks
        self.pending: set[int] = set()  # blocks in tables the cache has not keyed yet
        self.tables: dict[int, list[int]] = {}  # request id -> its device blocks (journal)
        # kept: a bound method is a new object at each access, and unsubscribe matches by identity
        self._listener = engine.bus.subscribe(self._on_events, kinds=["step", "kv_changes"])

    def close(self) -> None:
        """Stop watching the engine (its bus outlives this publisher: a lesson rebuilt)."""
        self.engine.bus.unsubscribe(self._listener)

    def snapshot(self) -> KVEventSnapshot:
        """All it holds now, as of its latest record."""
        return KVEventSnapshot(
            self.epoch, self.seq, frozenset(public for _, public in self.held.values())
        )

    def _on_events(self, batch: Sequence[Any]) -> None:
        for event in batch:
            ops = event.kv_ops if event.kind == "kv_changes" else event.plan.kv_ops
            recheck = self._read_journal(ops)
            root, keyed = self.engine.cached_prefixes(recheck | self.pending)
            removed = self._removed(recheck, keyed)
            stored = self._stored(root, keyed)
            if stored or removed:
                self.seq += 1
                self.send(KVEventBatch(self.epoch, self.seq, tuple(stored), tuple(removed)))

    def _read_journal(self, ops: Sequence[list]) -> set[int]:
        """Follow the tables; returns the announced blocks an ``uncache`` named."""
        recheck = set()
        for kind, request_id, arg in ops:
            if kind == "append":
                self.tables.setdefault(request_id, []).extend(arg)
                self.pending.update(arg)
            elif kind == "swap_in":
                self.tables[request_id] = list(arg)
                self.pending.update(arg)
            elif kind == "trim":
                table = self.tables.get(request_id, [])
                self.pending.difference_update(table[arg:])
                del table[arg:]
            elif kind in ("free", "swap_out"):
                self.pending.difference_update(self.tables.pop(request_id, ()))
            elif kind == "uncache":
                recheck.update(b for b in arg if b in self.held)
        return recheck

    def _removed(self, recheck: set[int], keyed: dict[int, Any]) -> list[int]:
        removed = []
        for block in recheck:
            key, public = self.held[block]
            now = keyed.get(block)
            if now is None or now.key != key:
                removed.append(public)
                del self.held[block], self.public[key]
        return removed

    def _stored(self, root: int, keyed: dict[int, Any]) -> list[int]:
        stored = []
        # Parents first: a parent is keyed before its child, and keys only grow.
        for block in sorted(self.pending & keyed.keys(), key=lambda b: keyed[b].key):
            self.pending.discard(block)
            info = keyed[block]
            parent = 0 if info.parent == root else self.public.get(info.parent)
            if parent is None or block in self.held:
                continue  # a salted chain (its own root), or announced already
            public = chain_key(parent, info.tokens)
            self.held[block] = (info.key, public)
            self.public[info.key] = public
            stored.append(public)
        return stored
