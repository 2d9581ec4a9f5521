"""The host KV tier: evicted prefix-cache blocks kept in host memory and copied back.

Importing this package registers the "host" tier in the core's registry
(``minicb.core.scheduler.cache_tier.CACHE_TIERS``), which ``kv_offload_blocks`` asks for,
and nothing more: the factory imports tier.py only when a block manager builds the tier.
"""

from __future__ import annotations

from minicb.core.feature_settings import register_settings
from minicb.core.scheduler.cache_tier import CACHE_TIERS, DeviceSide
from minicb.host_tier.settings import HostTierSettings


def _host_tier(num_blocks: int, device: DeviceSide):
    from minicb.host_tier.tier import HostTier

    return HostTier(num_blocks, device)


register_settings(HostTierSettings)
CACHE_TIERS["host"] = _host_tier
