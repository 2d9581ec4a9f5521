"""A model runner's ``LlamaModel``, built from its files, and the check that lets a second
runner share one already built (static beside continuous on the same weights).

The skeleton is made on the meta device (no memory), materialised on the target device and
filled from the safetensors files: under tensor parallelism only this rank's slices are read
(minicb/runner/tensor_parallel.py). After the cast to the compute dtype the linear layers
may be quantised to int8 (minicb/quant/weights.py) or packed for oneDNN (packed.py), and under
``batch_invariant`` each is wrapped to run in fixed row tiles (minicb/kernels/batch_invariant.py);
the rope tables are attached last, so they stay fp32, as in transformers.
"""

from __future__ import annotations

import torch

from minicb.config import EngineConfig
from minicb.kernels.batch_invariant import RowTiledLinear, tile_linears
from minicb.quant.weights import Int8Linear, quantize_linears
from minicb.runner.llama import LlamaModel, ModelConfig, RotaryEmbedding
from minicb.runner.loader import ModelFiles, iter_safetensors
from minicb.runner.packed import can_pack, pack_linears
from minicb.runner.tensor_parallel import Shard, iter_shard, shard_model


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
        model.load_weights(iter_safetensors(files.path))
    else:  # only this rank's slices are read from the files
        full, names = ModelConfig.from_hf(files.hf_config), set(model.state_dict())
        model.load_weights(iter_shard(files.path, full, shard.rank, shard.world, names))
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
