"""The model runner's KV memory, sized and allocated once: the paged pool on the device, its
swap twin in host memory, and the prefix cache's host tier (minicb/host_tier/tier.py).

How many device blocks: ``num_kv_blocks`` when the config says; otherwise enough for every
slot to hold a whole context, capped by a share (``kv_memory_fraction``) of the free memory
and, on CPU, where memory is shared with everything else, by ``CPU_KV_POOL_BYTES``. The
swap space is as large as the device pool unless told, but never more than
``SWAP_SPACE_BYTES`` of host memory. The host tier is exactly ``kv_offload_blocks``, and
refused (naming the limit in bytes and blocks) if it does not fit the host's available
memory beside the other host pools: it is allocated at once but fills only as prefixes are
evicted, so a tier too large would fail long after the start, in the middle of a run.
Host pools are page-locked on a GPU, for fast copies.
A block's bytes depend on the KV cache's format (minicb/core/attention/kv_layer.py): an
8-bit block is about half a bf16 one, so a byte budget holds about twice as many. What a
pool is, and the one way a block moves between pools: kv_pool.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from minicb.core.config import EngineConfig
from minicb.core.runner.kv_pool import KVPool, bytes_per_block
from minicb.core.runner.llama import ModelConfig

CPU_KV_POOL_BYTES = 1 << 30  # ceiling of an automatically sized KV pool on CPU
SWAP_SPACE_BYTES = 4 << 30  # ceiling of the default host swap space


@dataclass(frozen=True)
class KVPools:
    device: KVPool  # the paged KV cache the model reads and writes
    swap: KVPool  # host memory for swapped-out requests' blocks
    host: KVPool  # the prefix cache's host tier (``kv_offload_blocks``; 0 blocks: none)


def block_bytes(config: EngineConfig, cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of one block in every layer (keys, values and any scales)."""
    block = (config.block_size, cfg.num_kv_heads, cfg.head_dim)
    return bytes_per_block(cfg.num_layers, block, config.answer("KV format", "auto"), dtype)


def allocate_pools(
    config: EngineConfig,
    cfg: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    max_model_len: int,
) -> KVPools:
    """The three pools of a runner of model shape ``cfg`` computing in ``dtype``, zeroed."""
    per_block = block_bytes(config, cfg, dtype)
    num_kv_blocks = config.num_kv_blocks or _auto_num_blocks(
        config, per_block, device, max_model_len
    )
    num_swap_blocks = config.num_swap_blocks
    if num_swap_blocks is None:
        num_swap_blocks = min(num_kv_blocks, SWAP_SPACE_BYTES // per_block)
    # Host memory the other pools take: the swap space, and on CPU the device pool too.
    beside = (num_swap_blocks + (num_kv_blocks if device.type == "cpu" else 0)) * per_block
    tier_blocks = config.answer("cache tier blocks", 0)  # a feature's (seam 2)
    check_host_tier(tier_blocks, per_block, beside)
    pool = (cfg.num_layers, (config.block_size, cfg.num_kv_heads, cfg.head_dim))
    kv_dtype = (config.answer("KV format", "auto"), dtype)
    pinned = device.type == "cuda"
    return KVPools(
        device=KVPool.allocate(*pool, num_kv_blocks, *kv_dtype, device),
        swap=KVPool.allocate(*pool, num_swap_blocks, *kv_dtype, "cpu", pinned),
        host=KVPool.allocate(*pool, tier_blocks, *kv_dtype, "cpu", pinned),
    )


def _auto_num_blocks(
    config: EngineConfig, per_block: int, device: torch.device, max_model_len: int
) -> int:
    # Enough for every slot to hold a full context, capped by a share of free memory.
    wanted = config.max_num_seqs * -(-max_model_len // config.block_size)
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    affordable = int(free * config.kv_memory_fraction) // per_block
    if device.type == "cpu":
        # On CPU, memory is shared with everything else: a modest pool is plenty here.
        affordable = min(affordable, CPU_KV_POOL_BYTES // per_block)
    return max(1, min(wanted, affordable))


def check_host_tier(num_blocks: int, per_block: int, beside: int) -> None:
    """Refuse a host tier of ``num_blocks`` blocks (``per_block`` bytes each) that does not
    fit the host's available memory once the other host pools (``beside`` bytes) are in."""
    if num_blocks == 0:
        return
    available = host_available_bytes()
    room = max(0, available - beside)
    if num_blocks * per_block > room:
        raise ValueError(
            f"kv_offload_blocks={num_blocks} needs {num_blocks * per_block:,} bytes of host "
            f"memory ({per_block:,} a block), over the limit of {room:,} bytes: the "
            f"{available:,} bytes available on this host less {beside:,} for the other KV "
            f"pools; at most {room // per_block:,} blocks fit (--kv-offload-blocks)"
        )


def host_available_bytes() -> int:
    """Host memory a new allocation can have without swapping: MemAvailable (free memory and
    the caches the kernel can drop) from /proc/meminfo on Linux, psutil's reading of it
    elsewhere if installed, else the free pages alone (a lower bound)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the file counts kB
    except OSError:
        pass
    try:
        import psutil
    except ImportError:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return psutil.virtual_memory().available
