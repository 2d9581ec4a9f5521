"""The simulated GPU's utilisation: each step's bytes and FLOPs against the profile's peaks
over the predicted step time, checked against numbers worked out by hand, carried from the
runner through the engine to the step event and its JSON."""

import pytest

from minicb import LLMEngine, SamplingParams, VirtualClock
from minicb.core.config import EngineConfig
from minicb.cost_model.step_time import Efficiency, GPUSpec, ModelShape, StepTimeModel
from minicb.sim.simulated_runner import SimulatedRunner
from minicb.telemetry.event_json import from_dict, to_dict

# Round numbers: 1,000 B/s and 1,000 FLOP/s at half efficiency, 0.1 s overhead per step.
GPU = GPUSpec("toy", memory_bytes=1e6, bandwidth=1000.0, flops=1000.0)
# One layer: q, o, k, v = 4 x 16 x 2 = 32 + 32 params, MLP 3 x 4 x 8 = 96: 160 per layer;
# streamed: 160 + lm_head 16 x 4 = 224 params = 448 bytes in bf16; KV: 2 x 4 x 2 = 16 B/token.
SHAPE = ModelShape("toy", 1, 4, 8, 1, 1, 4, 16, 64)
EFF = Efficiency(
    bandwidth=0.5, flops=0.5, interconnect=1.0, step_overhead_s=0.1, allreduce_latency_s=0.0
)
PROFILE = StepTimeModel(GPU, SHAPE, EFF)


def _steps(prompt_len: int, max_tokens: int) -> list:
    clock = VirtualClock()
    config = EngineConfig(enable_prefix_caching=False, block_size=16)
    engine = LLMEngine(
        config=config, runner=SimulatedRunner(PROFILE, config, clock=clock), clock=clock
    )
    engine.add_request([3] * prompt_len, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return [engine.step().event for _ in range(max_tokens)]


def test_a_prefill_and_a_decode_step_by_hand():
    prefill, decode = _steps(8, 2)
    # prefill of 8 tokens, context 8: bytes 448 + 8 x 16 = 576; FLOPs 2 x 160 x 8 (matmuls)
    # + 2 x 16 x 4 (lm_head, one row samples) + 4 x 4 x 36 pairs (8 x 8 - 28) = 3,264
    # memory 576 / 500 = 1.152 s, compute 3,264 / 500 = 6.528 s: step 6.628 s
    assert prefill.forward_s == pytest.approx(6.628)
    assert prefill.bandwidth_util == pytest.approx(0.576 / 6.628)
    assert prefill.flop_util == pytest.approx(3.264 / 6.628)
    # decode of 1 token, context 9: bytes 448 + 144 = 592; FLOPs 320 + 128 + 16 x 9 = 592
    # memory = compute = 592 / 500 = 1.184 s: step 1.284 s, both halves of the peak but the
    # overhead's share
    assert decode.forward_s == pytest.approx(1.284)
    assert decode.bandwidth_util == pytest.approx(0.592 / 1.284)
    assert decode.flop_util == pytest.approx(0.592 / 1.284)
    assert 0 < decode.bandwidth_util < EFF.bandwidth  # never above the efficiency it assumes


def test_the_utilisation_round_trips_and_old_traces_read_as_unknown():
    event = _steps(8, 1)[0]
    data = to_dict(event)
    assert data["bandwidth_util"] == event.bandwidth_util and 0 < data["flop_util"] <= 1
    again = from_dict(data)
    assert (again.bandwidth_util, again.flop_util) == (event.bandwidth_util, event.flop_util)
    del data["bandwidth_util"], data["flop_util"]  # a trace written before they existed
    old = from_dict(data)
    assert old.bandwidth_util is None and old.flop_util is None
