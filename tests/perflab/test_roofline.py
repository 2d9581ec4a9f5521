"""The decode roofline's figures from fixed inputs (perflab/roofline.py): bytes, FLOPs, the
ceiling and the fraction of it a step reaches, worked by hand."""

import pytest

from minicb.cost_model.step_time import ModelShape
from perflab import roofline

# Two layers: q, o = 8 x 4 x 2 x 2 (128), k, v = 8 x 2 x 2 x 2 (64), gated MLP 3 x 8 x 16
# (384): 576 per layer; streamed 2 x 576 + lm_head 10 x 8 = 1,232; KV 2 x 2 x 2 x 2 x 2 = 32 B.
SHAPE = ModelShape("hand", num_layers=2, hidden_size=8, intermediate_size=16, num_heads=4,
                   num_kv_heads=2, head_dim=2, vocab_size=10, max_model_len=64)  # fmt: skip


def test_decode_cost_and_ceiling_by_hand():
    nbytes, flops = roofline.decode_cost(SHAPE, 2, batch=3, context=5)
    assert nbytes == 1232 * 2 + 3 * 5 * 32
    # per row: 2 FLOPs per streamed weight, 4 x layers x heads x head_dim per key attended
    assert flops == 3 * (2 * 1232 + 4 * 2 * 4 * 2 * 5)
    assert roofline.ceiling(1000, 10, bandwidth=100, peak=1000) == (10.0, "memory")
    assert roofline.ceiling(10, 1000, bandwidth=100, peak=10) == (100.0, "compute")
    hw = {"copy_bandwidth": 2944 / 0.5, "matmul_flops": 1e12}  # memory-bound: t_min 0.5 s
    point = roofline.roofline_point(
        {"step_s": 2.0, "forward_s": 1.0, "context": 5}, SHAPE, 2, 3, hw
    )
    assert point["ceiling_tok_s"] == pytest.approx(6.0) and point["bound"] == "memory"
    assert point["tok_s"] == 1.5 and point["fraction"] == pytest.approx(0.25)
    assert point["forward_fraction"] == pytest.approx(0.5)
    assert "linears_fraction" not in point  # not timed: no bound claimed
    timed = {"step_s": 2.0, "forward_s": 1.0, "context": 5, "linears_s": 0.8}
    point = roofline.roofline_point(timed, SHAPE, 2, 3, hw)
    # t_min 0.5 s against 0.8 s of linear layers: no step on this library beats 62.5 %
    assert point["linears_fraction"] == pytest.approx(0.625)
    assert point["linears_tok_s"] == pytest.approx(3 / 0.8)


def test_model_sizes_count_what_a_step_streams_from_the_config():
    # The layers and the lm_head: an untied embedding table is only gathered, a tied one is
    # the lm_head (read once either way); counted from the shape, whatever the runner holds.
    expected = {"weight_bytes": 1232 * 2, "matmul_params": 1232, "kv_bytes_per_token": 32}
    assert roofline.model_sizes(SHAPE, elem=2) == expected
    tied = ModelShape(**{**vars(SHAPE), "tie_word_embeddings": True})
    assert roofline.model_sizes(tied, elem=2) == expected
