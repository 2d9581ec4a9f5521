"""KVState: the KV pool's map (who holds which block) rebuilt from the engine's events.

A step event carries the changes the step made to the pool (``kv_ops``, written by the
block manager as they happen; see minicb/core/scheduler/block_manager.py for the kinds), never
the whole map: at a GPU's 30,000 blocks the whole map is hundreds of kilobytes a step. The
whole map travels only now and then, as a ``kv_snapshot`` event (on connect, on request,
and every so many steps in a trace, so a replay can seek). This class is the one place
that turns a snapshot and the changes after it back into the map, for the trace reader,
the server's live view and the tests alike:

    state = KVState.from_snapshot(snapshot_event)
    for event in later_step_events:
        state.apply(event.plan.kv_ops)
    state.block_tables  # == engine.kv_snapshot().block_tables after that step

Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class KVState:
    """Every request's device and swap blocks, the evictable cached blocks, and the host
    tier's blocks that hold a cached prefix (minicb/host_tier/tier.py)."""

    def __init__(
        self,
        block_tables: dict[int, list[int]] | None = None,
        swap_tables: dict[int, list[int]] | None = None,
        cached_blocks: Iterable[int] = (),
        host_cached_blocks: Iterable[int] = (),
    ) -> None:
        self.block_tables = {int(r): list(t) for r, t in (block_tables or {}).items()}
        self.swap_tables = {int(r): list(t) for r, t in (swap_tables or {}).items()}
        # dict, not set: it keeps the order blocks were parked in (least recently freed first)
        self.cached: dict[int, None] = dict.fromkeys(cached_blocks)
        # Host blocks holding a prefix, least recently stored or reloaded first.
        self.host_cached: dict[int, None] = dict.fromkeys(host_cached_blocks)

    @classmethod
    def from_snapshot(cls, snapshot: Any) -> KVState:
        """From a ``KVSnapshotEvent`` (or anything with the same fields; one without
        ``host_cached_blocks`` had no host tier)."""
        host = getattr(snapshot, "host_cached_blocks", ())
        return cls(snapshot.block_tables, snapshot.swap_tables, snapshot.cached_blocks, host)

    def apply(self, ops: Iterable[list]) -> None:
        """Apply one step's ``kv_ops``, in order. Raises ValueError on an unknown kind."""
        for kind, rid, arg in ops:
            if kind == "append":
                self.block_tables.setdefault(rid, []).extend(arg)
            elif kind == "trim":
                del self.block_tables[rid][arg:]
            elif kind == "free":
                self.block_tables.pop(rid, None)
                self.swap_tables.pop(rid, None)
            elif kind == "swap_out":
                self.block_tables.pop(rid, None)
                self.swap_tables[rid] = list(arg)
            elif kind == "swap_in":
                self.swap_tables.pop(rid, None)
                self.block_tables[rid] = list(arg)
            elif kind == "cache":
                self.cached.update(dict.fromkeys(arg))
            elif kind == "uncache":
                for block in arg:
                    self.cached.pop(block, None)
            elif kind == "offload":
                self.host_cached.update((host, None) for _, host in arg)
            elif kind == "reload":  # the device blocks come in the append after it
                for host, _ in arg:
                    self.host_cached.pop(host, None)  # most recently used: to the end
                    self.host_cached[host] = None
            elif kind == "host_uncache":
                for host in arg:
                    self.host_cached.pop(host, None)
            else:
                raise ValueError(f"unknown KV change {kind!r}")

    @property
    def cached_blocks(self) -> list[int]:
        return list(self.cached)

    @property
    def host_cached_blocks(self) -> list[int]:
        return list(self.host_cached)

    def copy(self) -> KVState:
        return KVState(self.block_tables, self.swap_tables, self.cached, self.host_cached)

    def as_tuple(self) -> tuple[dict, dict, list]:
        """(block tables, swap tables, cached blocks): what tests compare."""
        return self.block_tables, self.swap_tables, self.cached_blocks

    def owners(self, num_blocks: int) -> list[int]:
        """One entry per device block: the id of the first request holding it, -2 for an
        evictable cached block, -1 for a free one (what the KV map colours)."""
        owner = [-1] * num_blocks
        for block in self.cached:
            if block < num_blocks:
                owner[block] = -2
        for rid, table in self.block_tables.items():
            for block in table:
                if block < num_blocks and owner[block] < 0:
                    owner[block] = rid
        return owner
