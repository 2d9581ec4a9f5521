"""The cpu profile's construction and the per-step error, by hand; the simulated ratio on a
bench workload."""

import pytest

from minicb.bench.calibration import (
    cpu_profile,
    predict_workload,
    probe_steps,
    step_errors,
    step_kind,
)
from minicb.bench.recipes import capped_exponential
from minicb.core.config import EngineConfig
from minicb.cost_model.catalogue import load_profile
from minicb.cost_model.step_time import step_totals
from tests.helpers import fake_engine
from tests.sim.test_step_time import SHAPE

HW = {"copy_bandwidth": 1000.0, "matmul_flops": 1e4}


def test_the_overhead_is_the_probe_less_its_memory_and_compute():
    # A decode of context 8: 656 + 8 x 16 = 784 bytes at 1000 B/s (0.784 s) and
    # 576 + 80 + 256 = 912 FLOPs at 1e4 FLOP/s (0.0912 s), added; the probe took 5 s.
    probe = {"batch": 1, "context": 8.0, "step_s": 5.0}
    profile = cpu_profile(HW, SHAPE, 2, probe)
    assert profile.efficiency.step_overhead_s == pytest.approx(5.0 - 0.784 - 0.0912)
    assert (profile.efficiency.flops, profile.efficiency.chunk_step_s) == (1.0, 0.0)
    assert profile.terms([(1, 8, True)])["step_s"] == pytest.approx(5.0)


def row(dt: float, rows: list[tuple[int, int]]) -> dict[str, float]:
    """A step row of (num_tokens, context_len) rows, all sampling, as step_row has it."""
    tokens, sampling, context, pairs = step_totals((n, c, True) for n, c in rows)
    return {"dt": dt, "tokens": tokens, "sampling_rows": sampling, "context_tokens": context,
            "attended_pairs": pairs, "decode_rows": sum(n == 1 for n, _ in rows),
            "prefill_tokens": sum(n for n, _ in rows if n > 1)}  # fmt: skip


DECODE3 = [(1, 8)] * 3
MIXED = [*DECODE3, (4, 4)]  # a 4-token prompt joins the three decodes


def hand_probe():
    # Three decodes of context 8: 656 + 24 x 16 = 1040 bytes (1.040 s), 3 x 912 FLOPs
    # (0.2736 s at the square-matmul rate). Timed at 5 + 0.256 + 0.3648 s: the 0.1824 s
    # the two extra rows' FLOPs took is twice the square-matmul time, efficiency 0.5.
    # The overhead is then 5 - 0.784 - 0.0912 / 0.5 = 4.0336 s. The mixed step: 1104 bytes
    # (1.104 s), 7 x 576 + 4 x 80 + 34 pairs x 32 = 5440 FLOPs (1.088 s at 5e3 FLOP/s),
    # predicted 6.2256 s without its own cost; timed 0.5 s longer.
    steps = [row(5.6208, DECODE3), row(6.7256, MIXED), row(5.6208, DECODE3)]
    return {"batch": 1, "context": 8.0, "step_s": 5.0, "steps": steps}


def test_the_flop_rate_and_the_chunk_step_cost_are_read_off_the_probe():
    profile = cpu_profile(HW, SHAPE, 2, hand_probe())
    assert profile.efficiency.flops == pytest.approx(0.5)
    assert profile.efficiency.step_overhead_s == pytest.approx(4.0336)
    assert profile.efficiency.chunk_step_s == pytest.approx(0.5)
    assert profile.terms([(1, 8, True)])["step_s"] == pytest.approx(5.0)
    assert profile.terms([(1, 8, True)] * 3)["step_s"] == pytest.approx(5.6208)
    assert profile.terms([(n, c, True) for n, c in MIXED])["step_s"] == pytest.approx(6.7256)


def test_step_errors_are_predicted_over_measured_overall_and_per_kind():
    profile = cpu_profile(HW, SHAPE, 2, hand_probe())
    steps = [row(5.6208 / 1.25, DECODE3), row(5.6208, DECODE3), row(5.6208 * 2, DECODE3),
             row(6.7256 / 1.1, MIXED), row(1.0, [(4, 4)])]  # fmt: skip
    errors = step_errors(profile, steps)
    assert errors["n"] == 5
    assert errors["median"] == pytest.approx(0.1)  # +25 %, 0 %, -50 %, +10 %, and a prefill
    assert errors["kinds"]["decode"] == {"n": 3, "median": pytest.approx(0.0)}
    assert errors["kinds"]["mixed"] == {"n": 1, "median": pytest.approx(0.1)}
    # the prefill alone: 656 + 64 bytes, 4 x 576 + 80 + 10 x 32 FLOPs at 5e3, the overhead
    # and the chunk-step cost
    prefill = 0.72 + 2704 / 5e3 + 4.0336 + 0.5
    assert errors["kinds"]["prefill"] == {"n": 1, "median": pytest.approx(prefill - 1)}
    assert step_kind(steps[0]) == "decode" and step_kind(steps[3]) == "mixed"


def test_the_probe_alternates_decode_and_mixed_steps():
    narrow = fake_engine(num_kv_blocks=16, max_num_seqs=1, block_size=4)
    wide = fake_engine(num_kv_blocks=64, max_num_seqs=4, block_size=4, step_time=0.5)
    probe = probe_steps(narrow, wide, prompt_len=6, pairs=3)
    steps = probe["steps"]
    assert [step_kind(s) for s in steps] == ["mixed", "decode"] * 3
    assert all(s["decode_rows"] == 3 and s["dt"] == 0.5 for s in steps)
    assert [s["prefill_tokens"] for s in steps] == [6, 0] * 3
    # after its prompt and a first decode (context 7), the batch-1 request's six probed
    # decodes see contexts 8 to 13, mean 10.5
    assert (probe["batch"], probe["step_s"], probe["context"]) == (1, 0.0, 10.5)
    for engine, blocks in ((narrow, 16), (wide, 64)):
        assert not engine.has_unfinished() and engine.kv_snapshot().num_free == blocks


def test_the_simulated_ratio_favours_continuous_batching():
    w = capped_exponential(16, prompt_len=16, mean_output=8, cap=32, vocab=256, seed=0)
    config = EngineConfig(max_num_seqs=8, num_kv_blocks=128, num_swap_blocks=0)
    pred = predict_workload(load_profile("L4:smollm2-135m"), config, w)
    assert pred["ratio"] > 1.0
    assert pred["wall_s"]["minicb-static"] > pred["wall_s"]["minicb-continuous"] > 0
