"""The real engine's utilisation: each step's bytes and FLOPs (the step-time model's) against
this machine's rates over its forward time, worked out by hand from fixed plans and rates
given to the runner (no probe, no timing), and carried through a tiny model's engine to its
step events; the probes' sizing rules."""

import pytest
import torch

from minicb import LLMEngine, SamplingParams
from minicb.core.config import EngineConfig
from minicb.core.runner.fake import FakeRunner
from minicb.core.runner.model_runner import ModelRunner
from minicb.cost_model.step_time import ModelShape
from minicb.utilisation.occupancy import Occupancy, UtilisationRunner
from minicb.utilisation.probes import MachineRates, copy_bytes, matmul_size, measure_matmul_flops

# The shape of tests/sim/test_utilisation.py: one layer of 160 matmul parameters, 224
# streamed (with the lm_head): 448 bytes in bf16; KV 16 bytes per token.
SHAPE = ModelShape("toy", 1, 4, 8, 1, 1, 4, 16, 64)
RATES = MachineRates(copy_bandwidth=1000.0, matmul_flops=1000.0)


def _plans(prompt_len: int, max_tokens: int) -> list:
    """The StepPlans of one request on a fake runner: its prefill, then its decodes."""
    config = EngineConfig(enable_prefix_caching=False, block_size=16)
    engine = LLMEngine(config=config, runner=FakeRunner(num_kv_blocks=8, max_model_len=64))
    engine.add_request([3] * prompt_len, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return [engine.step().event.plan for _ in range(max_tokens)]


def test_utilisation_of_a_prefill_and_a_decode_by_hand():
    prefill, decode = _plans(8, 2)
    occupancy = Occupancy(SHAPE, RATES, elem_bytes=2)
    # prefill of 8 tokens, context 8: bytes 448 + 8 x 16 = 576; FLOPs 2 x 160 x 8 + 2 x 16 x 4
    # (one row samples) + 4 x 4 x 36 pairs = 3,264; in 2 s at 1,000 B/s and 1,000 FLOP/s:
    bw, fl = occupancy.utilisation(prefill, forward_s=2.0)
    assert bw == pytest.approx(576 / 2000) and fl == pytest.approx(3264 / 2000)
    # decode of 1 token, context 9: bytes 448 + 144 = 592; FLOPs 320 + 128 + 16 x 9 = 592
    bw, fl = occupancy.utilisation(decode, forward_s=0.5)
    assert bw == pytest.approx(592 / 500) and fl == pytest.approx(592 / 500)
    # two ranks: each reads and computes half in the same time
    half = Occupancy(SHAPE, RATES, elem_bytes=2, tp=2).utilisation(decode, forward_s=0.5)
    assert half == pytest.approx((592 / 1000, 592 / 1000))


def test_an_untimed_step_has_no_utilisation():
    (prefill,) = _plans(4, 1)
    assert Occupancy(SHAPE, RATES, 2).utilisation(prefill, forward_s=0.0) == (None, None)


def _engine(path: str, measure: bool, rates: MachineRates | None = RATES) -> LLMEngine:
    """With ``measure``: the model runner wrapped by hand, to give it ``rates``; without:
    the runner the engine builds itself for the config."""
    config = EngineConfig.from_kwargs(
        device="cpu", dtype="float32", max_num_seqs=4, num_kv_blocks=32, measure_utilisation=measure
    )
    if not measure:
        return LLMEngine(path, config)
    runner = UtilisationRunner(ModelRunner(path, config), rates)
    return LLMEngine(config=config, runner=runner)


def _events(engine: LLMEngine) -> list:
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    for prompt in ([5, 6, 7], [8, 9, 10, 11, 12]):
        engine.add_request(prompt, params)
    return [engine.step().event for _ in range(4)]


def test_the_tiny_model_engine_reports_it_when_asked(tiny_llama_dir):
    engine = _engine(tiny_llama_dir, measure=True)
    events = _events(engine)
    occupancy = engine.runner.occupancy
    assert occupancy.rates is RATES and occupancy.elem_bytes == 4  # float32, no probe run
    for event in events:
        expected = occupancy.utilisation(event.plan, event.forward_s)
        assert (event.bandwidth_util, event.flop_util) == pytest.approx(expected)
        assert event.bandwidth_util > 0 and event.flop_util > 0
    assert engine.describe()["runner"]["machine_rates"]["copy_gb_s"] == round(1000 / 1e9, 2)
    sibling = engine.runner.with_config(engine.config.with_(batching="static"))
    assert sibling.occupancy.rates is RATES  # the static engine beside it probes nothing


def test_the_tiny_model_engine_reports_none_by_default(tiny_llama_dir):
    engine = _engine(tiny_llama_dir, measure=False, rates=None)
    assert getattr(engine.runner, "occupancy", None) is None
    assert "machine_rates" not in engine.describe()["runner"]
    for event in _events(engine):
        assert event.bandwidth_util is None and event.flop_util is None


def test_the_occupancy_counts_the_config_not_the_parameters(tiny_llama_dir):
    # Packed bf16 weights keep a second copy in memory; a step still reads the weights once.
    engine = _engine(tiny_llama_dir, measure=True)
    shape = engine.runner.occupancy.shape
    cfg = engine.runner.model_config
    assert shape.num_layers == cfg.num_layers and shape.num_kv_heads == cfg.num_kv_heads
    assert shape.streamed_params == (
        cfg.num_layers * shape.layer_params + cfg.vocab_size * cfg.hidden_size
    )


def test_the_probes_are_sized_to_be_short():
    assert copy_bytes(1 << 20) == 256 << 20  # at least 256 MiB, out of a CPU's caches
    assert copy_bytes(300 << 20) == 600 << 20  # twice the weights
    assert copy_bytes(8 << 30) == 1 << 30  # at most 1 GiB
    # A target of 0 s: the first product (128^3) is already long enough; an unreachable
    # target: the probe stops at its cap rather than grow without end.
    assert matmul_size(torch.float32, cap=1024, target_s=0.0) == 128
    assert matmul_size(torch.float32, cap=256, target_s=float("inf")) == 256
    assert measure_matmul_flops(torch.float32, 128, repeats=1) > 0


def test_the_rates_describe_themselves_for_the_page():
    rates = MachineRates(12.345e9, 678.9e9, copy_bytes=256 << 20, matmul_n=2048)
    assert rates.describe() == {
        "copy_gb_s": 12.35,
        "matmul_gflop_s": 678.9,
        "copy_bytes": 256 << 20,
        "matmul_n": 2048,
    }
