"""Tiny random models, for tests and graded labs with no download.

Each config keeps the quirks of its family (Qwen2's q/k/v bias, Qwen3's q/k RMSNorm, Llama
3's rope scaling, grouped-query attention) at a size that runs in milliseconds; a folder
saved here loads as any Hugging Face folder does (minicb.core.runner.loader). Not part of
the engine a student reads: the core never builds one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TINY_ARCHITECTURES = ("llama", "llama3", "mistral", "qwen2", "qwen3")


def tiny_hf_config(arch: str, **overrides: Any) -> Any:
    """A transformers config for a tiny model of the named architecture."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common: dict[str, Any] = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    if arch == "llama":
        cfg = LlamaConfig(**common)
    elif arch == "llama3":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 128,
        }
        cfg = LlamaConfig(**common, rope_parameters=rope)
    elif arch == "mistral":
        cfg = MistralConfig(**common, sliding_window=None)
    elif arch == "qwen2":
        cfg = Qwen2Config(**common)
    elif arch == "qwen3":
        cfg = Qwen3Config(**common)
    else:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {TINY_ARCHITECTURES}")
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def make_tiny_model_dir(arch: str, folder: str | Path, seed: int = 0, **overrides: Any) -> Path:
    """Save a seeded random transformers model of ``arch`` to ``folder`` and return it."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    cfg = tiny_hf_config(arch, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    # Random init gives tiny norms weights of exactly 1; perturb them so a wrong
    # norm would show in the logits.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    return folder
