"""8-bit weights (minicb/quant/weights.py): the format's error bound, the int8 product against
the dequantise-then-matmul reference, the option, the bytes, and the oracle in its own form
(greedy tokens under int8 weights equal across batching modes, a chunk size and preemption).
Tiny random Llama, fp32 compute. Agreement with the unquantised model is measured, not
asserted (perflab/kv_quant_agreement.py --weight-dtype int8)."""

from __future__ import annotations

import argparse

import pytest
import torch
from torch import nn

from minicb import LLM
from minicb.core.config import EngineConfig
from minicb.engine_options import add_engine_options, engine_kwargs
from minicb.quant import weights
from minicb.quant.settings import QuantSettings
from minicb.quant.weights import (
    Int8Linear,
    dequantize,
    int8_linear_kernel,
    int8_linear_reference,
    quantize_per_channel,
    weight_bytes,
)
from tests.helpers import MIXED, MIXED_MAX, greedy_tokens

# Half of the shared mixed set: enough to batch, chunk and preempt, at half the time.
PROMPTS, MAX_TOKENS = MIXED[:8], MIXED_MAX[:8]


def test_dequantised_weight_is_within_half_a_scale_per_row():
    gen = torch.Generator().manual_seed(0)
    # Rows of very different magnitudes (what a per-row scale is for) and an all-zero row.
    w = torch.randn(48, 96, generator=gen) * torch.logspace(-3, 1, 48)[:, None]
    w[5] = 0.0
    q, scales = quantize_per_channel(w)
    assert q.dtype == torch.int8 and scales.shape == (48,)
    nonzero = w.abs().amax(dim=1) > 0  # each such row uses the full range: its max is 127
    assert q.abs().max() <= 127 and (q.abs().amax(dim=1)[nonzero] == 127).all()
    error = (w - dequantize(q, scales, torch.float32)).abs()
    bound = scales[:, None] / 2
    assert (error <= bound * (1 + 1e-5)).all()
    assert torch.equal(dequantize(q, scales, torch.float32)[5], torch.zeros(96))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("use_kernel", [False, True])
def test_int8_linear_equals_the_dequantised_reference(dtype, bias, use_kernel, monkeypatch):
    """torch's int8 kernel, and the module on either path (the kernel is chosen by CPU)."""
    monkeypatch.setattr(weights, "INT8_KERNEL", use_kernel)
    torch.manual_seed(0)
    linear = nn.Linear(64, 40, bias=bias).to(dtype)
    int8 = Int8Linear(linear)
    q, scales = int8.weight_int8, int8.scales
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for shape in [(1, 64), (7, 64), (2, 3, 64)]:  # one decode row, a chunk, a leading batch
        x = torch.randn(shape).to(dtype)
        reference = int8_linear_reference(x, q, scales, linear.bias)
        kernel = int8_linear_kernel(x, q, scales, linear.bias)
        torch.testing.assert_close(kernel, reference, rtol=tol, atol=tol)
        torch.testing.assert_close(int8(x), reference, rtol=tol, atol=tol)
        # and close to the unquantised layer: the difference is the weights' rounding
        assert (int8(x).float() - linear(x).float()).abs().max() < 0.05


def test_an_unknown_weight_dtype_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="weight_dtype 'int4'; choose one of auto, int8"):
        EngineConfig.from_kwargs(weight_dtype="int4")
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        EngineConfig.from_kwargs(weight_dtype="int8", tensor_parallel_size=2)
    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    args = parser.parse_args(["--weight-dtype", "int8"])
    assert QuantSettings.of(EngineConfig.from_kwargs(**engine_kwargs(args))).weight_dtype == "int8"


def llm(model_dir: str, **options) -> LLM:
    base = dict(dtype="float32", num_kv_blocks=256, block_size=16, weight_dtype="int8")
    return LLM(model=model_dir, **(base | options))


def test_the_decoder_linears_are_int8_at_a_quarter_of_the_bytes(tiny_llama_dir):
    quantised = llm(tiny_llama_dir).engine.runner
    model = quantised.model
    per_layer = 7  # q, k, v, o, gate, up, down
    int8 = [m for m in model.modules() if isinstance(m, Int8Linear)]
    assert len(int8) == per_layer * model.cfg.num_layers
    assert type(model.lm_head) is nn.Linear  # tied to the embedding: left alone
    assert quantised.describe()["weight_dtype"].startswith("int8")
    fp32 = weight_bytes(llm(tiny_llama_dir, weight_dtype="auto").engine.runner.model)
    sizes = weight_bytes(model)
    assert sizes["float"] == 0 and fp32["int8"] == 0
    # int8 plus one fp32 scale per row: a quarter of fp32's, and a little more
    assert 0.25 < sizes["int8"] / fp32["float"] < 0.3


@pytest.fixture(scope="module")
def one_at_a_time(tiny_llama_dir) -> list[list[int]]:
    """No batching at all, int8 weights: what every mode must reproduce."""
    return greedy_tokens(llm(tiny_llama_dir, max_num_seqs=1), PROMPTS, MAX_TOKENS)


MODES = {
    "static": dict(batching="static"),
    "chunk-7": dict(max_num_batched_tokens=7),
    # a pool of 72 tokens for 8 requests: preemption is forced
    "recompute": dict(num_kv_blocks=18, block_size=4, max_num_batched_tokens=32),
    "swap": dict(
        num_kv_blocks=18,
        block_size=4,
        num_swap_blocks=18,
        preemption_mode="swap",
        max_num_batched_tokens=32,
    ),
}


@pytest.mark.parametrize("name", MODES)
def test_same_tokens_in_every_mode_under_int8_weights(name, tiny_llama_dir, one_at_a_time):
    engine_llm = llm(tiny_llama_dir, **MODES[name])
    preempted: list = []
    engine_llm.engine.bus.subscribe(
        lambda es: preempted.extend(d for e in es for d in e.plan.preempted), kinds=["step"]
    )
    assert greedy_tokens(engine_llm, PROMPTS, MAX_TOKENS) == one_at_a_time
    assert bool(preempted) == (name in ("recompute", "swap"))
    engine_llm.engine.scheduler.blocks.check()
