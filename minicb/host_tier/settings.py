"""The host tier's setting (its record in ``EngineConfig.features``).

``kv_offload_blocks``: a second tier for the prefix cache (tier.py): cached blocks the
device pool evicts are copied to this many host blocks, found by the same keys and copied
back on a later hit. 0: off (an evicted prefix is forgotten). The core learns the number
through the cache-tier seam (``config.answer("cache tier blocks", 0)``), to build the tier
and allocate its pool. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from minicb.core.feature_settings import FeatureSettings

if TYPE_CHECKING:
    from minicb.core.config import EngineConfig


@dataclass(frozen=True)
class HostTierSettings(FeatureSettings):
    name: ClassVar[str] = "host_tier"
    answers: ClassVar[dict[str, str]] = {"cache tier blocks": "kv_offload_blocks"}

    kv_offload_blocks: int = 0

    def __post_init__(self) -> None:
        blocks = self.kv_offload_blocks
        if not isinstance(blocks, int) or isinstance(blocks, bool) or blocks < 0:
            raise ValueError(f"kv_offload_blocks must be >= 0, got {blocks!r}")

    def check(self, config: EngineConfig) -> None:
        if self.kv_offload_blocks and not config.enable_prefix_caching:
            raise ValueError(
                "kv_offload_blocks is a second tier of the prefix cache: it needs "
                "enable_prefix_caching on"
            )
