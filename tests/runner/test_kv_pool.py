"""The KV pool's memory: in host memory it is an anonymous mapping the operating system
zeroes page by page as it is first touched, so it must read as zeros, take writes, and
belong to one pool alone, in every storage format."""

from __future__ import annotations

import pytest
import torch

from minicb.core.runner.kv_pool import KVPool

BLOCK = (4, 2, 8)  # (block_size, num_kv_heads, head_dim)


@pytest.mark.parametrize(
    "kv, compute",
    [
        ("auto", torch.float32),
        ("auto", torch.bfloat16),
        ("int8", torch.float32),
        ("fp8", torch.float32),
    ],
)
def test_a_new_pool_is_zeros_writable_and_its_own(kv, compute):
    first = KVPool.allocate(3, BLOCK, 5, kv, compute, "cpu")
    second = KVPool.allocate(3, BLOCK, 5, kv, compute, "cpu")
    assert first.values.shape == (3, 2, 5, *BLOCK)
    assert first.values.float().abs().max() == 0
    assert len(first.parts) == (1 if kv == "auto" else 2)  # 8-bit: values, then scales
    if kv != "auto":
        scales = first.parts[1]
        assert scales.shape == (3, 2, 5, *BLOCK[:-1])
        assert scales.abs().max() == 0
        scales.fill_(0.5)
        assert second.parts[1].abs().max() == 0
    first.values[1, 0, 3].fill_(1)
    assert first.values[1, 0, 3].float().min() == 1
    assert first.values.float().sum() == BLOCK[0] * BLOCK[1] * BLOCK[2]
    assert second.values.float().abs().max() == 0


def test_an_empty_pool_is_allowed():
    """A runner with no swap space asks for a host pool of zero blocks."""
    pool = KVPool.allocate(2, BLOCK, 0, "auto", torch.float32, "cpu")
    assert pool.values.shape == (2, 2, 0, *BLOCK)
