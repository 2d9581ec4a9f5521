"""A model runner's ``LlamaModel``, built from its files, and the check that lets a second
runner share one already built (static beside continuous on the same weights).

The architecture's numbers are read from the Hugging Face config (``model_config``) and the
checkpoint's tensors copied in by name (``load_weights``): what the model is, in
llama.py, is kept apart from how a checkpoint fills it.

The skeleton is made on the meta device (no memory), materialised on the target device and
filled from the safetensors files: of a model part (a tensor-parallel shard, wrappers.py's
``ModelPart``) only its slices are read. After the cast to the compute dtype each weight
form the config asks for (int8, packed for oneDNN, batch-invariant row tiles; wrappers.py)
replaces the linear layers, in order; the rope tables are attached last, so they stay fp32,
as in transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from minicb.core.runner.llama import LlamaModel, ModelConfig, RotaryEmbedding
from minicb.core.runner.loader import ModelFiles, iter_safetensors
from minicb.core.runner.wrappers import registered_weight_forms

if TYPE_CHECKING:
    from minicb.core.runner.wrappers import ModelPart, WeightForm


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
    forms: list[WeightForm],
    device: torch.device,
    dtype: torch.dtype,
    max_model_len: int,
    part: ModelPart | None = None,
) -> LlamaModel:
    """The model of shape ``cfg`` (the ``part``'s, if one), weights loaded, on ``device``
    in ``dtype``, its linear layers in each of ``forms`` in turn."""
    # Skeleton on the meta device (no memory), materialised on the target, then filled.
    with torch.device("meta"):
        model = LlamaModel(cfg, rope=None)
    if part is not None:
        part.shape(model)
    model = model.to_empty(device=device)
    if cfg.tie_word_embeddings and model.lm_head is not None:
        # to_empty gives each module its own tensor: tie again
        model.lm_head.weight = model.model.embed_tokens.weight
    if part is None:
        load_weights(model, iter_safetensors(files.path))
    else:  # only the part's slices are read from the files
        load_weights(model, part.weights(files, set(model.state_dict())))
    model = model.to(dtype).eval()
    for form in forms:  # after the cast: scales and packed copies in the compute dtype
        form.apply(model)
    # Rope tables are attached after the dtype cast so they stay fp32, as in transformers.
    rope = RotaryEmbedding(files.hf_config, cfg.head_dim, max_model_len)
    model.rope = rope.to(device)
    return model


def check_shareable(
    model: LlamaModel,
    cfg: ModelConfig,
    forms: list[WeightForm],
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
    asked = {type(form) for form in forms}
    for form in registered_weight_forms():
        if form.held_by(model) != (type(form) in asked):
            raise ValueError(form.unshareable)
    if model.rope.cos.shape[0] < max_model_len:
        raise ValueError("cannot share weights: the shared model has a shorter context")
