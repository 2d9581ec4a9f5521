"""The engine's views: what whoever is outside the scheduler may read of an engine.

The page, the server, the fleet's router, the scenarios and the tests ask an engine how it
stands (its KV pool, one request's blocks, its queues, the requests it holds, its settings)
through these methods, never through the scheduler's or the block manager's own state, so
that those stay free to change. ``LLMEngine`` (minicb/core/engine.py) holds one
``EngineViews`` and answers each of these names with it (``engine.kv_snapshot()``, ...);
a request's way through the engine never crosses this file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from minicb.core import events

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from minicb.core.config import EngineConfig
    from minicb.core.runner import Runner
    from minicb.core.scheduler import SchedulerBase
    from minicb.core.scheduler.prefix_cache import CachedBlock
    from minicb.core.step_clock import StepClock


@dataclass(frozen=True)
class KVSnapshot:
    """The KV pool as it stands: sizes, and which request holds which block ids."""

    block_size: int
    num_blocks: int
    num_free: int
    num_swap_blocks: int
    num_swapped: int  # swap blocks in use
    block_tables: dict[int, list[int]]  # request id -> device blocks, in order
    swap_tables: dict[int, list[int]]  # request id -> CPU swap blocks
    # Prefix caching: free blocks still holding a cached prefix (in num_free), and the
    # blocks several requests hold (each one's reference count is its number of tables).
    cached_blocks: list[int] = field(default_factory=list)
    num_shared: int = 0
    # The host tier (kv_offload_blocks): host blocks holding a prefix, least recently used first.
    host_cached_blocks: list[int] = field(default_factory=list)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free


class EngineViews:
    """The read-only views of one engine: copies and counts, JSON-safe where a page reads
    them, of its scheduler, its runner and its own clock."""

    def __init__(
        self,
        config: EngineConfig,
        runner: Runner,
        scheduler: SchedulerBase,
        clock: Callable[[], float],
        step_clock: StepClock,
    ) -> None:
        self.config = config
        self.runner = runner
        self.scheduler = scheduler
        self.clock = clock
        self.step_clock = step_clock

    @property
    def step_count(self) -> int:
        """Iterations run so far."""
        return self.scheduler.step_count

    def kv_snapshot(self) -> KVSnapshot:
        blocks = self.scheduler.blocks
        return KVSnapshot(
            block_size=self.config.block_size,
            num_blocks=blocks.num_blocks,
            num_free=blocks.num_free_blocks,
            num_swap_blocks=blocks.swap.num_blocks,
            num_swapped=blocks.num_swapped_blocks,
            block_tables={rid: list(t) for rid, t in blocks.block_tables.items()},
            swap_tables={rid: list(t) for rid, t in blocks.swap_tables.items()},
            cached_blocks=list(blocks.cache.evictable),
            num_shared=blocks.num_shared_blocks,
            host_cached_blocks=list(blocks.host.info) if blocks.host is not None else [],
        )

    def kv_snapshot_event(self) -> events.KVSnapshotEvent:
        """The whole KV map now, as the event a late reader starts from (docs/events.md)."""
        kv = self.kv_snapshot()
        return events.KVSnapshotEvent(
            time=self.clock(),
            step=self.step_count,
            block_tables=kv.block_tables,
            swap_tables=kv.swap_tables,
            cached_blocks=kv.cached_blocks,
            host_cached_blocks=kv.host_cached_blocks,
        )

    def block_table(self, request_id: int) -> list[int]:
        """The device blocks of one request, in order ([] if it holds none)."""
        return list(self.scheduler.blocks.block_table(request_id))

    def cached_prefixes(self, blocks: Iterable[int]) -> tuple[int, dict[int, CachedBlock]]:
        """What the prefix cache holds in each of ``blocks`` that is keyed now (its key, its
        parent's key, its tokens), and the parent key of an unsalted first block (the
        cache's root): a replica's KV events are read from these (minicb/fleet/kv_events.py)."""
        cache = self.scheduler.blocks.cache
        return cache.root, {b: cache.info[b] for b in blocks if b in cache.info}

    def queue_sizes(self) -> dict[str, int]:
        """Requests waiting, running (holding a batch slot) and swapped out."""
        return self.scheduler.queue_sizes()

    def live_requests(self) -> list[dict[str, Any]]:
        """The requests held now, JSON-safe (for a browser that joins mid-run)."""
        return [
            {
                "request_id": r.request_id,
                "arrival": r.arrival_time,
                "start_step": r.arrival_step + 1,
                "prompt": r.prompt,
                "num_prompt_tokens": r.num_prompt_tokens,
                "max_tokens": r.params.max_tokens,
                "first_token_time": r.metrics.first_token_time,
                "arrival_busy_s": r.metrics.arrival_busy_s,
                "first_token_busy_s": r.metrics.first_token_busy_s,
            }
            for r in self.scheduler.requests.values()
        ]

    def describe(self) -> dict[str, Any]:
        """Settings, pool sizes and model, JSON-safe: what a visualizer panel shows."""
        kv = self.kv_snapshot()
        runner = self.runner.describe()
        return {
            "batching": self.config.batching,
            "config": self.config.to_dict(),
            "model": self.runner.model_name,
            "runner": runner,
            # True on a simulated GPU: every page, trace and report built from this says so.
            "simulated": bool(runner.get("simulated")),
            "kv_total": kv.num_blocks,
            "swap_total": kv.num_swap_blocks,
            "block_size": kv.block_size,
            "has_tokenizer": self.runner.tokenizer is not None,
            "max_model_len": self.runner.max_model_len,
            "step": self.step_count,  # iterations run before this description
            "ended": self.scheduler.num_ended,  # requests that ended before it
            "busy_s": self.step_clock.busy_s,  # its own clock: seconds of its steps so far
        }
