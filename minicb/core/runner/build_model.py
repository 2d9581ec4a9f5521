"""A model runner's ``LlamaModel``, built from its files, and the check that lets a second
runner share one already built (static beside continuous on the same weights).

The architecture's numbers are read from the Hugging Face config (``model_config``) and the
checkpoint's tensors copied in by name (``load_weights``): what the model is, in
llama.py, is kept apart from how a checkpoint fills it.

The skeleton is made on the meta device (no memory), materialised on the target device and
filled from the safetensors files: under tensor parallelism only this rank's slices are read
(minicb/parallel/tensor_parallel.py). After the cast to the compute dtype the linear layers
may be quantised to int8 (minicb/quant/weights.py) or packed for oneDNN (packed.py), and under
``batch_invariant`` each is wrapped to run in fixed row tiles (minicb/kernels/batch_invariant.py);
the rope tables are attached last, so they stay fp32, as in transformers.
"""

from __future__ import annotations

from typing import Any

import torch

from minicb.core.config import EngineConfig
from minicb.core.runner.llama import LlamaModel, ModelConfig, RotaryEmbedding
from minicb.core.runner.loader import ModelFiles, iter_safetensors
from minicb.kernels.batch_invariant import RowTiledLinear, tile_linears
from minicb.packing.packed import can_pack, pack_linears
from minicb.parallel.tensor_parallel import Shard, iter_shard, shard_model
from minicb.quant.weights import Int8Linear, quantize_linears


def model_config(hf: Any) -> ModelConfig:
    """The architecture numbers minicb needs, read from a Hugging Face config."""
    arch = (getattr(hf, "architectures", None) or [""])[0]
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    max_pos = hf.max_position_embeddings
    if getattr(hf, "sliding_window", None) and getattr(hf, "use_sliding_window", True):
        # No sliding-window attention here: cap the context where it would start to matter.
        max_pos = min(max_pos, hf.sliding_window)
    return ModelConfig(
        vocab_size=hf.vocab_size,
        hidden_size=hf.hidden_size,
        intermediate_size=hf.intermediate_size,
        num_layers=hf.num_hidden_layers,
        num_heads=hf.num_attention_heads,
        num_kv_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
        head_dim=head_dim,
        rms_norm_eps=hf.rms_norm_eps,
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
        qkv_bias=arch.startswith("Qwen2") or bool(getattr(hf, "attention_bias", False)),
        qk_norm=arch.startswith("Qwen3"),
    )


def load_weights(model: LlamaModel, named_tensors) -> None:
    """Copy checkpoint tensors in by name; complain about anything missing."""
    params = dict(model.named_parameters())
    loaded = set()
    for name, tensor in named_tensors:
        if name not in params:
            if name.endswith("rotary_emb.inv_freq") or (
                name == "lm_head.weight" and model.cfg.tie_word_embeddings
            ):
                continue
            raise ValueError(f"checkpoint tensor {name} has no place in the model")
        with torch.no_grad():
            params[name].copy_(tensor.to(params[name].dtype))
        loaded.add(name)
    missing = set(params) - loaded
    if model.cfg.tie_word_embeddings:
        missing.discard("lm_head.weight")
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")


def build_model(
    files: ModelFiles,
    cfg: ModelConfig,
    config: EngineConfig,
    device: torch.device,
    dtype: torch.dtype,
    max_model_len: int,
    shard: Shard | None = None,
) -> LlamaModel:
    """The model of shape ``cfg`` (this rank's part, with ``shard``), weights loaded, on
    ``device`` in ``dtype``, as ``config`` holds its linear layers."""
    # Skeleton on the meta device (no memory), materialised on the target, then filled.
    with torch.device("meta"):
        model = LlamaModel(cfg, rope=None)
    if shard is not None:
        shard_model(model, shard)
    model = model.to_empty(device=device)
    if cfg.tie_word_embeddings and model.lm_head is not None:
        # to_empty gives each module its own tensor: tie again
        model.lm_head.weight = model.model.embed_tokens.weight
    if shard is None:
        load_weights(model, iter_safetensors(files.path))
    else:  # only this rank's slices are read from the files
        full, names = model_config(files.hf_config), set(model.state_dict())
        load_weights(model, iter_shard(files.path, full, shard.rank, shard.world, names))
    model = model.to(dtype).eval()
    if config.weight_dtype == "int8":
        quantize_linears(model)  # after the cast: scales in the compute dtype, as kernels want
    if config.packed_weights and can_pack(device, dtype):
        pack_linears(model)  # after the cast: the packed copies are made in this dtype
    if config.batch_invariant:
        tile_linears(model)  # last: it wraps whichever linears the model now holds
    # Rope tables are attached after the dtype cast so they stay fp32, as in transformers.
    rope = RotaryEmbedding(files.hf_config, cfg.head_dim, max_model_len)
    model.rope = rope.to(device)
    return model


def check_shareable(
    model: LlamaModel,
    cfg: ModelConfig,
    config: EngineConfig,
    device: torch.device,
    dtype: torch.dtype,
    max_model_len: int,
) -> None:
    """Raise ValueError, saying why, unless a runner of these settings can use ``model``."""
    if model.cfg != cfg:
        raise ValueError(
            "cannot share weights split for another tensor_parallel_size; build a new engine"
        )
    weight = model.model.embed_tokens.weight
    if weight.device != device or weight.dtype != dtype:
        raise ValueError(
            f"cannot share weights held as {weight.dtype} on {weight.device} with an engine "
            f"that wants {dtype} on {device}"
        )
    int8 = any(isinstance(m, Int8Linear) for m in model.modules())
    if int8 != (config.weight_dtype == "int8"):
        raise ValueError("cannot share weights held in another weight_dtype")
    tiled = any(isinstance(m, RowTiledLinear) for m in model.modules())
    if tiled != config.batch_invariant:
        raise ValueError("cannot share weights between batch_invariant and plain engines")
    if model.rope.cos.shape[0] < max_model_len:
        raise ValueError("cannot share weights: the shared model has a shorter context")
