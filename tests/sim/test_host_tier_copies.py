"""The simulated runner charges the prefix cache's host-tier copies at the PCIe rate."""

import pytest

from minicb.core.config import EngineConfig
from minicb.core.runner import VirtualClock
from minicb.core.scheduler.plan import StepPlan
from minicb.cost_model.catalogue import read_catalogue
from minicb.sim.simulated_runner import SimulatedRunner


def test_each_offloaded_or_reloaded_block_costs_its_bytes_over_the_host_link():
    config = EngineConfig.from_kwargs(kv_offload_blocks=64, tensor_parallel_size=2)
    runner = SimulatedRunner("H100:llama-3.1-8b", config, clock=VirtualClock(0.0))
    plain = StepPlan(1, "continuous", 16)
    copying = StepPlan(1, "continuous", 16, offload_map=[(0, 0), (1, 1)], reload_map=[(2, 3)])
    extra = runner._step_time(copying) - runner._step_time(plain)
    gpu = read_catalogue()["gpus"]["H100-SXM"]
    link = gpu["host_link_gb_s"] * 1e9 * read_catalogue()["efficiency"]["interconnect"]
    per_gpu = runner.profile.block_bytes(16) / 2  # each of the 2 GPUs moves half a block
    assert extra == pytest.approx(3 * per_gpu / link, rel=1e-12)
    assert 1e-6 < extra < 1e-3  # microseconds per block: PCIe 5 at 64 GB/s
