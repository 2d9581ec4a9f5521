"""The cpu profile's construction and the per-step error, by hand; the simulated ratio on a
bench workload."""

import pytest

from minicb.bench.calibration import cpu_profile, simulated_ratio, step_errors
from minicb.bench.workloads import capped_exponential
from minicb.config import EngineConfig
from minicb.runner.catalogue import load_profile
from tests.sim.test_step_time import SHAPE

HW = {"copy_bandwidth": 1000.0, "matmul_flops": 1e4}


def test_the_overhead_is_the_probe_less_its_roofline():
    # A decode of context 8: 656 + 8 x 16 = 784 bytes at 1000 B/s (0.784 s) beats
    # 576 + 80 + 256 = 912 FLOPs at 1e4 FLOP/s; the probe took 5 s.
    probe = {"batch": 1, "context": 8.0, "step_s": 5.0}
    profile = cpu_profile(HW, SHAPE, 2, probe)
    assert profile.efficiency.step_overhead_s == pytest.approx(5.0 - 0.784)
    assert profile.terms([(1, 8, True)])["step_s"] == pytest.approx(5.0)


def test_step_errors_are_predicted_over_measured():
    profile = cpu_profile(HW, SHAPE, 2, {"batch": 1, "context": 8.0, "step_s": 5.0})
    one = {"tokens": 1, "sampling_rows": 1, "context_tokens": 8, "attended_pairs": 8}
    errors = step_errors(profile, [{**one, "dt": 4.0}, {**one, "dt": 5.0}, {**one, "dt": 10.0}])
    assert errors["n"] == 3
    assert errors["median"] == pytest.approx(0.0)  # +25 %, 0 %, -50 %
    assert errors["median_abs"] == pytest.approx(0.25)


def test_the_simulated_ratio_favours_continuous_batching():
    w = capped_exponential(16, prompt_len=16, mean_output=8, cap=32, vocab=256, seed=0)
    config = EngineConfig(max_num_seqs=8, num_kv_blocks=128, num_swap_blocks=0)
    assert simulated_ratio(load_profile("L4:smollm2-135m"), config, w) > 1.0
