"""minicb's own Llama-family model: one flat ragged batch in, paged KV cache read and written.

Unlike transformers' forward, there is no batch dimension and no padding: all tokens
scheduled this iteration, from every request, form one sequence of length T. The linear
layers (most of the FLOPs) run over all T tokens at once; only attention is split per
request, through the AttentionMetadata (Orca's "selective batching"). Module and
parameter names follow Hugging Face's, except two fused layers per decoder layer, as serving
engines have them: ``qkv_proj`` (q, k and v as one product) and ``gate_up_proj`` (gate and
up as one), filled at load from the checkpoint's separate tensors (``load_weights``). Fewer,
larger products (4 a layer, not 7), each call's fixed cost paid once: measured on CPU in
docs/performance.md, "Forward pass".

Covers Llama 2/3, SmolLM/SmolLM2, Mistral, Qwen2 (bias on q/k/v) and Qwen3 (RMSNorm on
q and k per head).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import nn

from minicb.kernels.attention import AttentionBackend, AttentionMetadata


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

    @classmethod
    def from_hf(cls, hf: Any) -> ModelConfig:
        arch = (getattr(hf, "architectures", None) or [""])[0]
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        max_pos = hf.max_position_embeddings
        if getattr(hf, "sliding_window", None) and getattr(hf, "use_sliding_window", True):
            # No sliding-window attention here: cap the context where it would start to matter.
            max_pos = min(max_pos, hf.sliding_window)
        return cls(
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


RopeTables = tuple[torch.Tensor, torch.Tensor]  # (cos, signed sin), each (T, 1, head_dim)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position, indexed by each token's own position."""

    def __init__(self, hf: Any, head_dim: int, max_positions: int) -> None:
        super().__init__()
        inv_freq, scaling = rope_inv_freq(hf, head_dim)
        freqs = torch.outer(torch.arange(max_positions).float(), inv_freq)
        angles = torch.cat([freqs, freqs], dim=-1)  # (max_positions, head_dim)
        # rotate_half(x) * sin = cat(-x2, x1) * sin = roll(x) * (sign * sin), sign -1 on the
        # first half: folding the sign into the table saves the negation and the concatenation
        # of q and of k in every layer, and is exact (a product's rounding is sign-symmetric).
        sign = torch.ones(head_dim)
        sign[: head_dim // 2] = -1.0
        self.register_buffer("cos", angles.cos() * scaling, persistent=False)
        self.register_buffer("sin_signed", angles.sin() * scaling * sign, persistent=False)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> RopeTables:
        """cos and signed sin of this step's tokens, (T, 1, head_dim) each, in ``dtype``:
        gathered once per step and shared by every layer (not once per layer for q and k)."""
        cos, sin = self.cos[positions], self.sin_signed[positions]
        return cos.unsqueeze(1).to(dtype), sin.unsqueeze(1).to(dtype)


def apply_rope(x: torch.Tensor, tables: RopeTables) -> torch.Tensor:
    """Rotate x (T, heads, head_dim) by its tokens' angles ("rotate_half" convention, the sign
    of its first half folded into the sin table)."""
    cos, sin_signed = tables
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin_signed


# The fused layers and the checkpoint's separate projections each one stacks, in row order.
FUSED_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def fused_sizes(cfg: ModelConfig) -> dict[str, list[int]]:
    """Output rows of each part of a fused layer, in ``FUSED_PARTS`` order."""
    q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return {"qkv_proj": [q_size, kv_size, kv_size], "gate_up_proj": [cfg.intermediate_size] * 2}


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        # q, k and v as ONE product (vLLM's QKVParallelLinear): rows [q | k | v], filled from
        # the checkpoint's three tensors by load_weights. One larger GEMM instead of three.
        self.qkv_sizes = fused_sizes(cfg)["qkv_proj"]
        self.qkv_proj = nn.Linear(cfg.hidden_size, sum(self.qkv_sizes), bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.qkv_sizes[0], cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.scale = cfg.head_dim**-0.5

    def project(self, x: torch.Tensor, rope: RopeTables) -> tuple[torch.Tensor, ...]:
        """q (T, heads, head_dim), k and v (T, kv_heads, head_dim), rotated and normed."""
        num_tokens, head_dim = x.shape[0], self.cfg.head_dim
        # (T, q + 2 kv) split into column views: no copies (v reaches the cache as a view).
        q, k, v = self.qkv_proj(x).split(self.qkv_sizes, dim=-1)
        q = q.view(num_tokens, -1, head_dim)
        k = k.view(num_tokens, -1, head_dim)
        v = v.view(num_tokens, -1, head_dim)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, rope), apply_rope(k, rope), v


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # gate and up as ONE product (vLLM's MergedColumnParallelLinear): rows [gate | up].
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (T, intermediate) views each
        return self.down_proj(nn.functional.silu(gate) * up)


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
        fns: LayerFunctions,
    ) -> torch.Tensor:  # (T, hidden)
        q, k, v = fns.attention_inputs(self, x, rope)
        k_cache, v_cache = kv_cache
        # Store first, then attend: each chunk sees its own keys through the cache.
        backend.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = backend.attention(q, k_cache, v_cache, meta, self.self_attn.scale)
        return fns.layer_output(self, x, out.flatten(1))


def attention_inputs(
    layer: DecoderLayer, x: torch.Tensor, rope: RopeTables
) -> tuple[torch.Tensor, ...]:
    """The layer's work before attention: RMSNorm, q/k/v projections, rope."""
    return layer.self_attn.project(layer.input_layernorm(x), rope)


def layer_output(layer: DecoderLayer, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """The layer's work after attention (attn: (T, heads * head_dim)): output projection,
    residual add, RMSNorm, gated MLP, residual add."""
    x = x + layer.self_attn.o_proj(attn)
    return x + layer.mlp(layer.post_attention_layernorm(x))


class LayerFunctions(NamedTuple):
    """The two halves of a decoder layer around attention. Plain functions of (layer,
    tensors), so one compiled version serves every layer (minicb.runner.compiled); the
    attention between them stays eager, since it loops over requests."""

    attention_inputs: Callable[..., tuple[torch.Tensor, ...]]
    layer_output: Callable[..., torch.Tensor]


EAGER = LayerFunctions(attention_inputs, layer_output)


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
        fns: LayerFunctions = EAGER,
    ) -> torch.Tensor:  # (T, hidden)
        x = self.model.embed_tokens(input_ids)
        rope = self.rope.tables(positions, x.dtype)
        for layer, kv_cache in zip(self.model.layers, kv_caches, strict=True):
            x = layer(x, rope, meta, kv_cache, backend, fns)
        return self.model.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(N, hidden) -> (N, vocab) in the model's dtype: the sampler takes greedy argmaxes
        on these as they are and converts only the rows it samples to fp32."""
        return self.lm_head(hidden)

    def checkpoint_names(self) -> set[str]:
        """The checkpoint tensors this model takes: its parameters' names, each fused layer's
        replaced by those of the separate tensors it stacks (q/k/v, gate/up)."""
        names = set()
        for name in dict(self.named_parameters()):  # a tied LM head once, as the embedding
            prefix, module, leaf = _split(name)
            names.update(f"{prefix}{part}.{leaf}" for part in FUSED_PARTS.get(module, (module,)))
        return names

    def load_weights(self, named_tensors) -> None:
        """Copy checkpoint tensors in by name, q/k/v and gate/up each into its rows of the
        fused layer; complain about anything missing, misplaced or misshapen."""
        params, wanted, loaded = dict(self.named_parameters()), self.checkpoint_names(), set()
        for name, tensor in named_tensors:
            if name not in wanted:
                if name.endswith("rotary_emb.inv_freq") or (
                    name == "lm_head.weight" and self.cfg.tie_word_embeddings
                ):
                    continue
                raise ValueError(f"checkpoint tensor {name} has no place in the model")
            with torch.no_grad():
                target = self._destination(name, params)
                if target.shape != tensor.shape:
                    raise ValueError(
                        f"checkpoint tensor {name} has shape {tuple(tensor.shape)}; the model "
                        f"holds {tuple(target.shape)}"
                    )
                target.copy_(tensor.to(target.dtype))
            loaded.add(name)
        missing = wanted - loaded
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")

    def _destination(self, name: str, params: dict[str, nn.Parameter]) -> torch.Tensor:
        """The parameter, or the rows of a fused one, that checkpoint tensor ``name`` fills."""
        prefix, module, leaf = _split(name)
        for fused, parts in FUSED_PARTS.items():
            if module in parts:
                sizes, index = fused_sizes(self.cfg)[fused], parts.index(module)
                return params[f"{prefix}{fused}.{leaf}"].narrow(0, sum(sizes[:index]), sizes[index])
        return params[name]


def _split(name: str) -> tuple[str, str, str]:
    """ "model.layers.0.mlp.up_proj.weight" -> ("model.layers.0.mlp.", "up_proj", "weight")."""
    head, _, leaf = name.rpartition(".")
    prefix, _, module = head.rpartition(".")
    return (prefix + "." if prefix else ""), module, leaf
