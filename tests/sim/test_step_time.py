"""The step-time formulas and the KV pool sizing against values worked out by hand, and the
catalogue's profile names."""

import json
from dataclasses import replace

import pytest

from minicb.cost_model.catalogue import load_profile, model_shape
from minicb.cost_model.step_time import (
    GIB,
    Efficiency,
    GPUSpec,
    ModelShape,
    StepTimeModel,
    attended_pairs,
    has_chunk,
)

# A shape small enough to count by hand: per layer q, o = 4 x 2 x 2 each, k, v = 4 x 1 x 2
# each (48), gated MLP 3 x 4 x 8 (96): 144 per layer; 2 layers + untied 10 x 4 embeddings
# and lm_head: 368 parameters, 328 streamed (the embedding table is only gathered).
SHAPE = ModelShape("hand", num_layers=2, hidden_size=4, intermediate_size=8, num_heads=2,
                   num_kv_heads=1, head_dim=2, vocab_size=10, max_model_len=64)  # fmt: skip
GPU = GPUSpec("toy", memory_bytes=10_000, bandwidth=1000.0, flops=1e4, interconnect=100.0)
EFF = Efficiency(bandwidth=0.5, flops=0.5, interconnect=0.5, step_overhead_s=0.1,
                 allreduce_latency_s=0.01)  # fmt: skip


def model(tp=1):
    return StepTimeModel(GPU, SHAPE, EFF, elem_bytes=2, tp=tp)


def test_parameter_counts():
    assert SHAPE.layer_params == 144
    assert SHAPE.num_params == 368
    assert SHAPE.streamed_params == 328
    assert SHAPE.kv_bytes_per_token(2) == 16  # K and V x 2 layers x 1 head x 2 dims x 2 bytes


def test_attended_pairs_of_a_causal_chunk():
    assert attended_pairs(1, 8) == 8  # a decode sees its whole context
    assert attended_pairs(3, 5) == 3 + 4 + 5
    assert attended_pairs(4, 4) == 1 + 2 + 3 + 4


def test_a_memory_bound_step():
    # Rows (3 tokens, context 5) and (1, 8), both sampling: T = 4, S = 2, 20 pairs.
    terms = model().terms([(3, 5, True), (1, 8, True)])
    # bytes: 328 x 2 weights + 13 context tokens x 16 = 864, at 1000 x 0.5 B/s
    assert terms["memory_s"] == pytest.approx(1.728)
    # flops: 2 x 288 x 4 + 2 x 40 x 2 + 4 x 2 x 2 x 2 x 20 = 3104, at 1e4 x 0.5
    assert terms["compute_s"] == pytest.approx(0.6208)
    assert terms["comm_s"] == 0.0
    assert terms["step_s"] == pytest.approx(1.728 + 0.1)


def test_a_compute_bound_prefill():
    # One chunk of 100 tokens from position 0: 5050 pairs; flops 57600 + 80 + 161600.
    terms = model().terms([(100, 100, True)])
    assert terms["compute_s"] == pytest.approx(219_280 / 5000)
    assert terms["memory_s"] == pytest.approx((656 + 1600) / 500)
    assert terms["step_s"] == pytest.approx(219_280 / 5000 + 0.1)


def test_a_cpu_adds_memory_and_compute():
    # The rows of the memory-bound step above, with overlap off: 1.728 + 0.6208 + 0.1.
    cpu = replace(model(), efficiency=replace(EFF, overlap=False))
    assert cpu.terms([(3, 5, True), (1, 8, True)])["step_s"] == pytest.approx(2.4488)


def test_the_chunk_step_cost_is_paid_by_every_step_with_a_prompt_chunk():
    cpu = replace(model(), efficiency=replace(EFF, chunk_step_s=0.05))
    mixed = cpu.terms([(3, 5, True), (1, 8, True)])
    assert mixed["overhead_s"] == pytest.approx(0.15)
    assert mixed["step_s"] == pytest.approx(1.728 + 0.15)
    assert cpu.terms([(3, 5, True), (2, 8, True)])["overhead_s"] == pytest.approx(0.15)
    assert cpu.terms([(1, 5, True), (1, 8, False)])["overhead_s"] == pytest.approx(0.1)
    assert model().terms([(3, 5, True), (1, 8, True)])["overhead_s"] == pytest.approx(0.1)
    assert has_chunk([3, 1]) and has_chunk([4, 2]) and not has_chunk([1, 1]) and not has_chunk([])


def test_tensor_parallel_splits_the_work_and_adds_two_all_reduces_per_layer():
    terms = model(tp=2).terms([(3, 5, True), (1, 8, True)])
    assert terms["memory_s"] == pytest.approx(0.864)
    assert terms["compute_s"] == pytest.approx(0.3104)
    # 2 layers x 2 x (10 ms + 2 x 1/2 x 4 tokens x 4 hidden x 2 bytes / (100 x 0.5))
    assert terms["comm_s"] == pytest.approx(4 * (0.01 + 32 / 50))
    assert terms["step_s"] == pytest.approx(0.864 + 0.1 + 2.6)


def test_an_empty_step_costs_nothing():
    assert model().terms([])["step_s"] == 0.0


def test_pool_sizing_by_hand():
    # 10,000 x 0.9 - 736 bytes of weights = 8,264; a block of 4 tokens is 64 bytes.
    assert model().block_bytes(4) == 64
    assert model().num_kv_blocks(4) == 129
    assert model(tp=2).num_kv_blocks(4) == (2 * 9000 - 736) // 64 == 269
    assert model().num_kv_blocks(4, utilisation=0.5) == (5000 - 736) // 64


def test_opt_13b_on_an_a100_40gb_holds_the_kv_the_vllm_paper_counts():
    # 12.84e9 parameters in bf16 in 90 % of 40 GiB leave 12.97e9 bytes; a token's KV is
    # 2 x 40 layers x 5120 x 2 bytes = 800 KiB (the vLLM paper's "800 KB"): 989 blocks of 16.
    p = load_profile("A100-40GB:opt-13b")
    assert p.model.num_params == 12_840_304_640
    assert p.model.kv_bytes_per_token(2) == 819_200
    free = 40 * GIB * 0.9 - 2 * 12_840_304_640
    assert p.num_kv_blocks(16) == int(free // (16 * 819_200)) == 989


def test_weights_that_do_not_fit_are_refused_naming_the_memory():
    with pytest.raises(ValueError, match="141 GiB"):
        load_profile("H200:llama-3.1-70b").num_kv_blocks(16)
    assert load_profile("H200:llama-3.1-70b", tensor_parallel_size=2).num_kv_blocks(16) > 0


def test_profile_names():
    p = load_profile("h100:LLAMA-3.1-8B")
    assert p.name == "H100-SXM:llama-3.1-8b" and p.gpu.bandwidth == 3.35e12
    norms = (2 * 32 + 1) * 4096  # two RMSNorms per layer and the final one: not matmuls
    assert p.model.num_params + norms == 8_030_261_248  # the published parameter count
    with pytest.raises(ValueError, match="A100-40GB, A100-80GB"):
        load_profile("A100:opt-13b")  # ambiguous prefix
    with pytest.raises(ValueError, match="GPU:MODEL"):
        load_profile("H100")
    with pytest.raises(ValueError, match="not in the catalogue"):
        load_profile("H100:gpt-5")


def test_a_model_folder_config_gives_the_shape(tmp_path):
    raw = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2,
           "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(raw))
    shape = model_shape(str(tmp_path))
    assert (shape.head_dim, shape.num_kv_heads, shape.tie_word_embeddings) == (16, 2, False)
    assert load_profile(f"L4:{tmp_path / 'config.json'}").model == shape
