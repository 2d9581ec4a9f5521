"""SimulatedRunner: the GPU's pool unless the config fixes one, its description, and a
rebuilt runner on the same GPU and clock."""

import pytest

from minicb import LLMEngine, SamplingParams, VirtualClock
from minicb.core.config import EngineConfig
from minicb.cost_model.catalogue import load_profile
from minicb.sim.simulated_runner import SimulatedRunner


def test_the_pool_is_the_gpus_unless_the_config_fixes_it():
    clock = VirtualClock()
    profile = load_profile("H100:llama-3.1-8b")
    runner = SimulatedRunner(profile, EngineConfig(block_size=16), clock=clock)
    assert runner.num_kv_blocks == profile.num_kv_blocks(16) == runner.num_swap_blocks
    assert runner.vocab_size == 128256 and runner.max_model_len == 131072
    fixed = SimulatedRunner(profile, EngineConfig(num_kv_blocks=100), clock=clock)
    assert fixed.num_kv_blocks == 100
    # float32 doubles the bytes of a block, so about half as many fit beside the weights
    f32 = SimulatedRunner(profile, EngineConfig(dtype="float32"), clock=clock)
    assert f32.describe()["bytes_per_block"] == 2 * runner.describe()["bytes_per_block"]
    assert f32.num_kv_blocks < runner.num_kv_blocks / 2


def test_it_says_simulated_and_names_the_profile():
    runner = SimulatedRunner("a100-40:opt-13b", clock=VirtualClock())
    info = runner.describe()
    assert info["runner"] == "simulated" and info["simulated"] is True
    assert info["profile"] == "A100-40GB:opt-13b" and info["device"] == "simulated A100-40GB"
    engine = LLMEngine(config=EngineConfig(), runner=runner, clock=runner.clock)
    assert engine.describe()["runner"]["profile"] == "A100-40GB:opt-13b"


def test_with_config_keeps_the_gpu_and_the_clock():
    clock = VirtualClock()
    runner = SimulatedRunner("L4:smollm2-135m", EngineConfig(), clock=clock)
    again = runner.with_config(EngineConfig(block_size=32))
    assert again.profile == runner.profile and again.clock is clock
    assert again.num_kv_blocks == runner.profile.num_kv_blocks(32)


def test_a_step_advances_the_clock_by_the_predicted_time():
    clock = VirtualClock()
    config = EngineConfig(enable_prefix_caching=False)
    runner = SimulatedRunner("H100:llama-3.1-8b", config, clock=clock)
    engine = LLMEngine(config=config, runner=runner, clock=clock)
    engine.add_request([5] * 64, SamplingParams(max_tokens=1, ignore_eos=True))
    plan = engine.step().plan
    assert clock() == pytest.approx(runner.profile(plan)) and clock() > 0.002


def test_bad_utilisation_is_refused():
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        SimulatedRunner("H100:llama-3.1-8b", clock=VirtualClock(), gpu_memory_utilization=1.5)


def test_the_simulator_never_loads_torch():
    """A laptop without torch's weight can run it: a small reproduction in a fresh
    interpreter leaves torch unimported."""
    import subprocess
    import sys

    code = (
        "import sys; from minicb.sim.paper_reproductions import scale; scale(0.02); "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_configs_tensor_parallel_degree_reaches_the_step_time_model():
    config = EngineConfig.from_kwargs(tensor_parallel_size=2)
    runner = SimulatedRunner("H200:llama-3.1-70b", config, clock=VirtualClock())
    assert runner.profile.tp == 2 and runner.describe()["profile"] == "H200 x2:llama-3.1-70b"
    assert runner.profile.terms([(1, 512, True)] * 8)["comm_s"] > 0
