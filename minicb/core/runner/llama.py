"""minicb's own Llama-family model: one flat ragged batch in, paged KV cache read and written.

Unlike transformers' forward, there is no batch dimension and no padding: all tokens
scheduled this iteration, from every request, form one sequence of length T. The linear
layers (most of the FLOPs) run over all T tokens at once; only attention is split per
request, through the AttentionMetadata (Orca's "selective batching"). Module and
parameter names follow Hugging Face's, so a checkpoint's state dict loads as it is
(build_model.py reads the config and loads the weights).

Covers Llama 2/3, SmolLM/SmolLM2, Mistral, Qwen2 (bias on q/k/v) and Qwen3 (RMSNorm on
q and k per head).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from minicb.core.attention.backend import AttentionBackend, AttentionMetadata


@dataclass(frozen=True)
class ModelConfig:
    """The architecture numbers minicb needs, read once from a Hugging Face config."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 and scale in the input dtype, exactly as the HF models do.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


# The residual add and the MLP's activation, named so that a tracer can substitute its own
# forms (the performance lab's compiled step rounds them as these do: perflab/compiled.py).
def residual_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


def silu(x: torch.Tensor) -> torch.Tensor:
    return nn.functional.silu(x)


def rope_inv_freq(hf: Any, head_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and attention scaling for the config's rope type."""
    params = getattr(hf, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        theta = params.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        return 1.0 / (theta**exponents), 1.0
    # Scaled variants (llama3, yarn, ...): transformers' own initialisers are the definition.
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"unsupported rope type {rope_type!r}")
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf, torch.device("cpu"))
    return inv_freq.float(), float(scaling)


RopeTables = tuple[torch.Tensor, torch.Tensor]  # (cos, sin), each (T, 1, head_dim)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position, indexed by each token's own position."""

    def __init__(self, hf: Any, head_dim: int, max_positions: int) -> None:
        super().__init__()
        inv_freq, scaling = rope_inv_freq(hf, head_dim)
        freqs = torch.outer(torch.arange(max_positions).float(), inv_freq)
        angles = torch.cat([freqs, freqs], dim=-1)  # (max_positions, head_dim)
        self.register_buffer("cos", angles.cos() * scaling, persistent=False)
        self.register_buffer("sin", angles.sin() * scaling, persistent=False)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> RopeTables:
        """cos and sin of this step's tokens, (T, 1, head_dim) each, in ``dtype``: gathered
        once per step and shared by every layer (not once per layer for q and for k)."""
        cos, sin = self.cos[positions], self.sin[positions]
        return cos.unsqueeze(1).to(dtype), sin.unsqueeze(1).to(dtype)


def apply_rope(x: torch.Tensor, tables: RopeTables) -> torch.Tensor:
    """Rotate x (T, heads, head_dim) by its tokens' angles ("rotate_half" convention)."""
    cos, sin = tables
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_size, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_size, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.scale = cfg.head_dim**-0.5

    def project(self, x: torch.Tensor, rope: RopeTables) -> tuple[torch.Tensor, ...]:
        """q (T, heads, head_dim), k and v (T, kv_heads, head_dim), rotated and normed."""
        num_tokens, head_dim = x.shape[0], self.cfg.head_dim
        q = self.q_proj(x).view(num_tokens, -1, head_dim)
        k = self.k_proj(x).view(num_tokens, -1, head_dim)
        v = self.v_proj(x).view(num_tokens, -1, head_dim)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, rope), apply_rope(k, rope), v


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        x: torch.Tensor,  # (T, hidden)
        rope: RopeTables,
        meta: AttentionMetadata,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        backend: AttentionBackend,
    ) -> torch.Tensor:  # (T, hidden)
        q, k, v = self.self_attn.project(self.input_layernorm(x), rope)
        k_cache, v_cache = kv_cache
        # Store first, then attend: each chunk sees its own keys through the cache.
        backend.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = backend.attention(q, k_cache, v_cache, meta, self.self_attn.scale)
        x = residual_add(x, self.self_attn.o_proj(out.flatten(1)))
        return residual_add(x, self.mlp(self.post_attention_layernorm(x)))


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaModel(nn.Module):
    """The whole causal LM. ``forward`` returns final hidden states; ``logits`` projects rows."""

    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding | None) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rope = rope

    def forward(
        self,
        input_ids: torch.Tensor,  # (T,)
        positions: torch.Tensor,  # (T,)
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # per layer (k_cache, v_cache)
        backend: AttentionBackend,
    ) -> torch.Tensor:  # (T, hidden)
        x = self.model.embed_tokens(input_ids)
        rope = self.rope.tables(positions, x.dtype)
        for layer, kv_cache in zip(self.model.layers, kv_caches, strict=True):
            x = layer(x, rope, meta, kv_cache, backend)
        return self.model.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(N, hidden) -> (N, vocab) in the model's dtype: the sampler takes greedy argmaxes
        on these as they are and converts only the rows it samples to fp32."""
        return self.lm_head(hidden)
