"""Fused projections (minicb.runner.llama): q/k/v as one ``qkv_proj`` and gate/up as one
``gate_up_proj``, filled at load from the checkpoint's separate tensors.

The greedy tokens of the fused model are checked against transformers' elsewhere
(tests/test_greedy_parity.py, every tiny architecture); here, that each checkpoint tensor
lands in its own rows, on one rank and on each of two tensor-parallel ranks (where KV heads
are split, and where one KV head is replicated), and that a checkpoint that does not fit is
refused by name.
"""

from __future__ import annotations

import pytest
import torch

from minicb.runner.llama import LlamaModel, ModelConfig
from minicb.runner.loader import (
    TINY_ARCHITECTURES,
    iter_safetensors,
    make_tiny_model_dir,
    open_model,
)
from minicb.runner.tensor_parallel import Shard, iter_shard, shard_config, shard_model

LAYER = "model.layers.1."


def _load(path, cfg: ModelConfig) -> LlamaModel:
    model = LlamaModel(cfg, rope=None)
    model.load_weights(iter_safetensors(path))
    return model


@pytest.mark.parametrize("arch", TINY_ARCHITECTURES)
def test_each_checkpoint_tensor_fills_its_rows_of_the_fused_layer(arch, tmp_path):
    path = make_tiny_model_dir(arch, tmp_path / arch, seed=2)
    cfg = ModelConfig.from_hf(open_model(path).hf_config)
    full = dict(iter_safetensors(path))
    layer = _load(path, cfg).model.layers[1]
    attn, mlp = f"{LAYER}self_attn.", f"{LAYER}mlp."
    qkv = [full[f"{attn}{p}_proj.weight"] for p in "qkv"]
    assert torch.equal(layer.self_attn.qkv_proj.weight, torch.cat(qkv))
    gate_up = [full[f"{mlp}{p}_proj.weight"] for p in ("gate", "up")]
    assert torch.equal(layer.mlp.gate_up_proj.weight, torch.cat(gate_up))
    bias = layer.self_attn.qkv_proj.bias
    assert (bias is not None) == cfg.qkv_bias == (arch == "qwen2")
    if bias is not None:
        assert torch.equal(bias, torch.cat([full[f"{attn}{p}_proj.bias"] for p in "qkv"]))


@pytest.mark.parametrize(
    "name, kv_heads, k_rows",
    [
        ("qwen2", 2, lambda rank: slice(16 * rank, 16 * rank + 16)),  # one KV head each
        ("llama-1kv", 1, lambda rank: slice(0, 16)),  # the one KV head on both ranks
    ],
)
def test_each_rank_fuses_its_own_slices(name, kv_heads, k_rows, tmp_path):
    # 4 query heads of 16 dims, MLP 128: a rank holds 2 query heads and 64 MLP columns.
    arch = name.split("-")[0]
    path = make_tiny_model_dir(arch, tmp_path / name, seed=3, num_key_value_heads=kv_heads)
    cfg = ModelConfig.from_hf(open_model(path).hf_config)
    full = dict(iter_safetensors(path))
    attn, mlp = f"{LAYER}self_attn.", f"{LAYER}mlp."
    for rank in range(2):
        with torch.device("meta"):
            model = shard_model(LlamaModel(shard_config(cfg, 2), rope=None), Shard(rank, 2))
        model = model.to_empty(device="cpu")
        names = model.checkpoint_names()
        assert ("lm_head.weight" in names) == (rank == 0)  # the LM head lives on rank 0
        model.load_weights(iter_shard(path, cfg, rank, 2, names))
        layer = model.model.layers[1]
        q_rows, mlp_rows = slice(32 * rank, 32 * rank + 32), slice(64 * rank, 64 * rank + 64)
        parts = [full[f"{attn}q_proj.weight"][q_rows]]
        parts += [full[f"{attn}{p}_proj.weight"][k_rows(rank)] for p in "kv"]
        assert torch.equal(layer.self_attn.qkv_proj.weight, torch.cat(parts))
        gate_up = [full[f"{mlp}{p}_proj.weight"][mlp_rows] for p in ("gate", "up")]
        assert torch.equal(layer.mlp.gate_up_proj.weight, torch.cat(gate_up))
        o_proj = full[f"{attn}o_proj.weight"][:, q_rows]
        assert torch.equal(layer.self_attn.o_proj.weight, o_proj)
        if arch == "qwen2":
            bias = [full[f"{attn}q_proj.bias"][q_rows]]
            bias += [full[f"{attn}{p}_proj.bias"][k_rows(rank)] for p in "kv"]
            assert torch.equal(layer.self_attn.qkv_proj.bias, torch.cat(bias))


def test_a_checkpoint_that_does_not_fit_is_refused_by_name(tmp_path):
    path = make_tiny_model_dir("llama", tmp_path / "llama", seed=4)
    cfg = ModelConfig.from_hf(open_model(path).hf_config)
    full = dict(iter_safetensors(path))
    k_name = f"{LAYER}self_attn.k_proj.weight"
    wrong = dict(full, **{k_name: full[k_name][:-1]})  # one row short
    with pytest.raises(ValueError, match=rf"{k_name} has shape \(31, 64\); the model holds"):
        LlamaModel(cfg, rope=None).load_weights(wrong.items())
    without = {n: t for n, t in full.items() if n != f"{LAYER}mlp.up_proj.weight"}
    with pytest.raises(ValueError, match="checkpoint lacks 1 tensors.*mlp.up_proj.weight"):
        LlamaModel(cfg, rope=None).load_weights(without.items())
    with pytest.raises(ValueError, match="model.layers.1.mlp.fused.weight has no place"):
        extra = dict(full, **{f"{LAYER}mlp.fused.weight": full[k_name]})
        LlamaModel(cfg, rope=None).load_weights(extra.items())
