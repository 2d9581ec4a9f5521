"""The Triton KV-store kernel writes exactly what the torch reference writes, and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from minicb.core.attention import reference
from minicb.kernels.store_kv import store_kv
from minicb.kernels.triton_backend import TritonBackend

from . import DEVICE


def _case(num_tokens, num_kv_heads, head_dim, block_size, dtype, seed=0):
    """Fused-projection views for key/value, distinct random slots with some -1, random caches."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 6
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::4] = -1  # every fourth token is not stored
    # key and value as views into one (T, 2*Hkv, D) tensor: the token stride is not Hkv*D.
    fused = torch.randn((num_tokens, 2 * num_kv_heads, head_dim), generator=gen)
    fused = fused.to(DEVICE, dtype)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(DEVICE, dtype)
    v_cache = torch.randn(shape, generator=gen).to(DEVICE, dtype)
    key, value = fused[:, :num_kv_heads], fused[:, num_kv_heads:]
    return key, value, k_cache, v_cache, slots.to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("num_kv_heads", [3, 1, 8])
def test_store_kv_matches_reference(num_kv_heads, head_dim, block_size, dtype):
    key, value, k_cache, v_cache, slots = _case(12, num_kv_heads, head_dim, block_size, dtype)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    reference.store_kv(key, value, k_ref, v_ref, slots)
    store_kv(key, value, k_cache, v_cache, slots)
    # A copy is exact; comparing whole caches also checks untouched slots stay untouched.
    assert torch.equal(k_cache, k_ref)
    assert torch.equal(v_cache, v_ref)


def test_store_kv_casts_to_the_cache_dtype():
    key, value, k_cache, v_cache, slots = _case(10, 2, 64, 16, torch.float32)
    k_cache, v_cache = k_cache.to(torch.bfloat16), v_cache.to(torch.bfloat16)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    reference.store_kv(key, value, k_ref, v_ref, slots)
    TritonBackend().store_kv(key, value, k_cache, v_cache, slots)
    if DEVICE.type == "cuda":
        assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    else:
        # The interpreter truncates fp32 -> bf16 where the GPU rounds to nearest even:
        # allow one bf16 ulp (2^-7 relative).
        torch.testing.assert_close(k_cache, k_ref, atol=0.0, rtol=2**-7)
        torch.testing.assert_close(v_cache, v_ref, atol=0.0, rtol=2**-7)


def test_store_kv_with_every_slot_skipped_leaves_the_cache_alone():
    key, value, k_cache, v_cache, slots = _case(5, 3, 64, 16, torch.float16)
    before = k_cache.clone()
    store_kv(key, value, k_cache, v_cache, torch.full_like(slots, -1))
    assert torch.equal(k_cache, before)


def test_backend_refuses_cpu_tensors_without_the_interpreter():
    # A fresh interpreter, because Triton reads TRITON_INTERPRET once, when kernels are defined.
    code = (
        "import torch\n"
        "from minicb.kernels.triton_backend import TritonBackend\n"
        "kv = torch.zeros(2, 1, 16)\n"
        "cache = torch.zeros(1, 16, 1, 16)\n"
        "TritonBackend().store_kv(kv, kv, cache, cache, torch.tensor([0, 1]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "RuntimeError" in done.stderr and "TRITON_INTERPRET=1" in done.stderr
