"""The simulator's 8-bit KV cache: bytes per token from the dtype (the real pool's rule),
so the pool a GPU holds, the batch and the step time follow."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from minicb.core.config import EngineConfig
from minicb.core.runner import VirtualClock
from minicb.core.runner.kv_pool import bytes_per_block
from minicb.cost_model.catalogue import load_profile
from minicb.sim.run import run_simulated
from minicb.sim.simulated_runner import SimulatedRunner
from minicb.workload import from_lengths


@pytest.mark.parametrize("kv", ["auto", "int8", "fp8"])
def test_block_bytes_are_the_real_pools(kv):
    """One rule for both: the simulated block is the bytes the model runner allocates."""
    profile = load_profile("H100:smollm2-135m")
    m = profile.model
    real = bytes_per_block(m.num_layers, (16, m.num_kv_heads, m.head_dim), kv, torch.bfloat16)
    config = EngineConfig.from_kwargs(kv_cache_dtype=kv)
    runner = SimulatedRunner(profile, config, clock=VirtualClock())
    assert runner.describe()["bytes_per_block"] == real
    assert runner.describe()["kv_cache_dtype"] == kv


def test_the_same_memory_holds_the_blocks_of_smaller_tokens():
    """H100 + Llama-3.1-8B: 128 bf16 values (256 bytes) per KV head and token against 128
    bytes and a 4-byte scale: 256 / 132 as many blocks in what the weights leave."""
    runners = {
        kv: SimulatedRunner(
            "H100:llama-3.1-8b", EngineConfig.from_kwargs(kv_cache_dtype=kv), clock=VirtualClock()
        )
        for kv in ("auto", "int8")
    }
    auto, int8 = runners["auto"], runners["int8"]
    assert int8.profile.block_bytes(16) * 256 == auto.profile.block_bytes(16) * 132
    assert int8.num_kv_blocks == pytest.approx(auto.num_kv_blocks * 256 / 132, abs=1)


def test_a_kv_bound_batch_grows_and_reads_fewer_bytes_per_token():
    """An L4 with Llama-3.1-8B has room for ~25 requests of 2,000 tokens in bf16: under
    int8 the batch is larger, the throughput higher, and a decode step of the same rows
    reads fewer bytes (shorter at the same batch)."""
    requests = from_lengths([2000] * 48, [40] * 48)
    config = EngineConfig(max_num_seqs=256, max_num_batched_tokens=4096)
    runs = {
        kv: run_simulated(
            load_profile("L4:llama-3.1-8b"), config.with_(kv_cache_dtype=kv), requests
        )["summary"]
        for kv in ("auto", "int8")
    }
    rows = {kv: s["batch"]["mean_rows_per_step"] for kv, s in runs.items()}
    tok_s = {kv: s["throughput"]["output_tokens_per_s"] for kv, s in runs.items()}
    assert rows["int8"] > 1.3 * rows["auto"]
    assert tok_s["int8"] > tok_s["auto"]
    bf16 = load_profile("L4:llama-3.1-8b")
    int8 = replace(bf16, kv_cache_dtype="int8")
    decode = [(1, 2000, True)] * 16  # 16 decode rows of 2,000 tokens of context
    saved = bf16.model.kv_bytes_per_token(2) - int8.model.kv_bytes_per_token(2, "int8")
    assert bf16.terms(decode)["memory_s"] - int8.terms(decode)["memory_s"] == pytest.approx(
        16 * 2000 * saved / (bf16.gpu.bandwidth * bf16.efficiency.bandwidth)
    )
