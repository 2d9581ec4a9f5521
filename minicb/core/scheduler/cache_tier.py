"""Cache tiers (seam 2): a lower tier of the prefix cache, which keeps what the device evicts.

With prefix caching, a block nobody holds keeps its prefix until the device pool needs the
block for something else (prefix_cache.py, ``evict``); then the prefix is gone, and the
next prompt that begins with it computes it again. A lower tier catches the prefix at that
moment and keeps it somewhere larger and cheaper (host memory, for the host tier), under
the same key, so a prompt's walk goes on there where the device has no block. Such a hit
is ``(None, key)`` in ``BlockManager.lookup``: the tier holds it, and when the request is
admitted the tier gives it back into a free device block, a copy instead of a prefill.

The block manager never learns how a tier keeps its blocks. It calls the tier at four
moments: ``offload`` when the device evicts cached blocks, ``reload`` for a request's hits
in the tier, ``take_copies`` when a plan is made (the runner makes the copies it lists),
and ``forget_copies`` when a step whose copies never ran is undone. The tier works on the
device side only through the ``DeviceSide`` it is built with, and writes what it did to the
block manager's journal, so an event still carries every move.

The core has no tier of its own. A feature's package registers a factory in ``CACHE_TIERS``
when it is imported (the host tier: minicb/host_tier/__init__.py registers "host"), and
``import minicb.features`` imports them all (``import minicb`` does it). The config asks for
a tier through a feature's settings record, which answers ``"cache tier blocks"`` (its size
in blocks, ``config.answer``; the host tier's record: minicb/host_tier/settings.py); 0 means
none, and an evicted prefix is forgotten (a tier asked for but not registered:
``FeatureNotLoaded``, registry.py). Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from minicb.core.registry import lookup

if TYPE_CHECKING:
    from minicb.core.scheduler.block_pool import BlockPool
    from minicb.core.scheduler.prefix_cache import CachedBlock, PrefixCache

Copies = list[tuple[int, int]]  # (source block, destination block) pairs


@dataclass(frozen=True)
class DeviceSide:
    """What a tier may do on the device: the parts of the block manager it works on."""

    cache: PrefixCache  # the device's prefix cache: a block given back is keyed here again
    free: BlockPool  # the device's unkeyed free blocks
    take: Callable[[int], list[int]]  # n blocks nobody holds (may evict, and so offload)
    changes: list  # the block manager's journal of KVChange entries, appended in order


class CacheTier(Protocol):
    """A lower tier of the prefix cache: it keeps the prefixes the device evicts, each
    under the key it had there, and gives them back."""

    num_blocks: int  # its size
    # Its blocks holding a prefix, least recently used first (the engine's KV views).
    info: Mapping[int, CachedBlock]

    @property
    def num_used(self) -> int:
        """Its blocks holding a prefix."""
        ...

    def find(self, parent: int, tokens: tuple[int, ...]) -> CachedBlock | None:
        """What it holds for this prefix block (parent key, tokens), or None."""
        ...

    def offload(self, evicted: list[tuple[int, CachedBlock]]) -> None:
        """Keep the prefixes of just-evicted device blocks (block, what it held)."""
        ...

    def reload(self, keys: list[int]) -> list[int]:
        """Give back the prefixes named by ``keys`` (hits here, in chain order): the device
        blocks that hold them now, keyed as before. The caller has counted the room."""
        ...

    def take_copies(self) -> tuple[Copies, Copies]:
        """The (device, tier) offloads and (tier, device) reloads since the last call, for
        a plan: the runner makes the offloads before anything writes the device blocks,
        the reloads before the forward."""
        ...

    def forget_copies(self, offloads: Copies, reloads: Copies) -> None:
        """A step that was to make these copies failed: no block they were to fill keeps a
        prefix, so no later hit reads KV that was never copied."""
        ...

    def check(self) -> None:
        """Raise AssertionError if its books, or its keys beside the device's, disagree."""
        ...


# name -> factory(num_blocks, device side). Features add to it when imported.
CACHE_TIERS: dict[str, Callable[[int, DeviceSide], CacheTier]] = {}
OFFLOAD_TIER = "host"  # the tier a feature's "cache tier blocks" answer asks for


def build_tier(name: str, num_blocks: int, device: DeviceSide) -> CacheTier:
    """The tier registered as ``name``, ``num_blocks`` blocks large."""
    factory = lookup(CACHE_TIERS, "cache tier", name, f"a tier of {num_blocks} blocks")
    return factory(num_blocks, device)
