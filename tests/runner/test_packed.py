"""Linear layers on oneDNN-packed weights (minicb.packing.packed) against plain nn.Linear."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from minicb import LLM, SamplingParams
from minicb.packing.packed import PackedLinear, can_pack, pack_linears
from minicb.tiny_models import TINY_ARCHITECTURES, make_tiny_model_dir

pytestmark = pytest.mark.skipif(
    not can_pack(torch.device("cpu"), torch.bfloat16),
    reason="oneDNN cannot pack bf16 here (no oneDNN; no AVX-512 BW/VL/DQ nor AVX-NE-CONVERT)",
)


def test_packed_linear_equals_linear_and_keeps_the_weight_parameter():
    linear = nn.Linear(64, 96, bias=True).bfloat16()
    x = torch.randn(5, 64).bfloat16()
    packed = PackedLinear(linear)
    assert packed.weight is linear.weight and packed.bias is linear.bias
    torch.testing.assert_close(packed(x), linear(x), atol=0, rtol=0)


def test_pack_linears_replaces_plain_layers_only_and_keeps_ties():
    class Sharded(nn.Linear):  # a subclass brings its own forward: left alone
        pass

    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 10, bias=False), Sharded(8, 8))
    model[1].weight = model[0].weight
    model = model.bfloat16()
    assert pack_linears(model) == 1
    assert isinstance(model[1], PackedLinear) and type(model[2]) is Sharded
    assert model[1].weight is model[0].weight


@pytest.mark.parametrize("arch", TINY_ARCHITECTURES)
def test_packed_weights_give_the_plain_greedy_tokens_in_bf16(arch, tmp_path):
    path = str(make_tiny_model_dir(arch, tmp_path, seed=3))
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = [[5, 6, 7], [9] * 20, list(range(3, 40))]
    runs = {}
    for packed in (False, True):
        llm = LLM(model=path, num_kv_blocks=64, dtype="bfloat16", packed_weights=packed)
        runs[packed] = [o.token_ids for o in llm.generate(prompts, params)]
        expected = "onednn-packed" if packed else "plain"
        assert llm.engine.runner.describe()["linear"] == expected
    assert runs[True] == runs[False]
