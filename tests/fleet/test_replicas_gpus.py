"""Replicas on GPUs, without one: where several replicas share a GPU and their KV pools are
sized from free memory, each claims its share of the fraction (they start together and
would each see the same free memory); a GPU each, a pool size given, or the CPU: as asked."""

import pytest
import torch

from minicb.core.config import EngineConfig
from minicb.fleet.fleet import _sharing_gpus


@pytest.fixture
def gpus(monkeypatch):
    def have(count: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)

    return have


def test_replicas_sharing_a_gpu_split_the_share_of_free_memory(gpus):
    gpus(1)
    assert _sharing_gpus(EngineConfig(), 2).kv_memory_fraction == pytest.approx(0.25)
    gpus(2)
    assert _sharing_gpus(EngineConfig(), 4).kv_memory_fraction == pytest.approx(0.25)


def test_a_gpu_each_a_given_pool_or_the_cpu_change_nothing(gpus):
    gpus(2)
    assert _sharing_gpus(EngineConfig(), 2) == EngineConfig()
    gpus(1)
    assert _sharing_gpus(EngineConfig(num_kv_blocks=64), 2) == EngineConfig(num_kv_blocks=64)
    assert _sharing_gpus(EngineConfig(device="cpu"), 2) == EngineConfig(device="cpu")
    gpus(0)
    assert _sharing_gpus(EngineConfig(), 2) == EngineConfig()
