"""What computes a draft: a second, smaller model, or the target's own first layers.

Either is a ``DraftNetwork``: the architecture numbers its KV needs (``cfg``), a forward
over one ragged batch that reads and writes its own paged KV (the target's attention
backend, the same metadata), and an LM head. Both are built from the target's model runner,
once the engine hands it over (``Drafter.attach``):

- ``draft_model``: any Llama-family folder whose vocabulary is the target's (the same
  tokenizer, or its ids mean other words), loaded on the target's device in its dtype; the
  target's own folder (or "default" for the embedded default when it is the target) shares
  the target's weights instead of loading a copy;
- ``early_exit``: the target's first ``draft_layers`` decoder layers, then its final norm
  and LM head (self-speculation, as LayerSkip and transformers' ``assistant_early_exit``):
  the same weights, no copy; only the KV of those layers is the draft's own. With every
  layer it is the target itself, and every guess is accepted.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

import torch

from minicb.core.attention.backend import AttentionBackend, AttentionMetadata
from minicb.core.runner.build_model import build_model, model_config
from minicb.core.runner.llama import LlamaModel, ModelConfig
from minicb.core.runner.loader import ModelLoadError, open_model
from minicb.core.runner.model_runner import ModelRunner


class DraftNetwork(Protocol):
    cfg: ModelConfig  # its layers, KV heads and head size: the shape of its KV pool
    max_model_len: int  # the longest context it can draft in

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """(T, hidden) final hidden states of the ragged batch, its KV stored."""
        ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


class WholeModel:
    """A draft model: a ``LlamaModel`` of its own (or the target's, as its own draft)."""

    def __init__(self, model: LlamaModel, max_model_len: int) -> None:
        self.model, self.cfg, self.max_model_len = model, model.cfg, max_model_len

    def __call__(self, input_ids, positions, meta, kv_caches, backend) -> torch.Tensor:
        return self.model(input_ids, positions, meta, kv_caches, backend)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.logits(hidden)


class EarlyExit:
    """The target's first ``num_layers`` layers, its final norm and its LM head."""

    def __init__(self, model: LlamaModel, num_layers: int, max_model_len: int) -> None:
        self.model, self.max_model_len = model, max_model_len
        self.layers = model.model.layers[:num_layers]
        self.cfg = replace(model.cfg, num_layers=num_layers)

    def __call__(self, input_ids, positions, meta, kv_caches, backend) -> torch.Tensor:
        # LlamaModel.forward, stopped after the first layers: the exit the name says.
        model = self.model
        x = model.model.embed_tokens(input_ids)
        rope = model.rope.tables(positions, x.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, rope, meta, kv_cache, backend)
        return model.model.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.logits(hidden)


def draft_model(name: str | None, target: ModelRunner) -> WholeModel:
    """The draft model ``name`` names (``EngineConfig.draft_model``), on the target's
    device in its dtype; ValueError naming the limit for a missing one or one whose
    vocabulary is not the target's."""
    if not name:
        raise ValueError(
            "speculative='draft' needs draft_model: a Llama-family model folder with the "
            "target's tokenizer, or 'default' for the embedded default model"
        )
    try:
        files = open_model(name)
    except ModelLoadError as e:
        raise ValueError(f"draft_model={name!r} cannot be opened: {e}") from e
    cfg = model_config(files.hf_config)
    if cfg.vocab_size != target.vocab_size or not same_vocabulary(files.tokenizer, target):
        raise ValueError(
            f"draft_model={name!r} has a vocabulary of {cfg.vocab_size} tokens and the target "
            f"{target.model_name!r} one of {target.vocab_size}"
            + ("" if cfg.vocab_size != target.vocab_size else " with other token strings")
            + ": a draft must share the target's tokenizer (its token ids are what it proposes)"
        )
    max_len = min(target.max_model_len, cfg.max_position_embeddings)
    if files.path.resolve() == target.files.path.resolve():
        return WholeModel(target.model, max_len)  # the target as its own draft: no copy
    return WholeModel(build_model(files, cfg, [], target.device, target.dtype, max_len), max_len)


def same_vocabulary(tokenizer, target: ModelRunner) -> bool:
    """Whether two tokenizers give every token the same id (True when either has none:
    then only the vocabulary sizes can be compared)."""
    if tokenizer is None or target.tokenizer is None:
        return True
    return tokenizer.get_vocab() == target.tokenizer.get_vocab()


def early_exit(num_layers: int | None, target: ModelRunner) -> EarlyExit:
    """The target's first ``num_layers`` layers (None: half of them, rounded up)."""
    total = target.model_config.num_layers
    layers = num_layers if num_layers is not None else -(-total // 2)
    if layers > total:
        raise ValueError(
            f"draft_layers={layers} exceeds the target's {total} decoder layers "
            f"({target.model_name!r}): early exit drafts with at most all of them"
        )
    return EarlyExit(target.model, layers, target.max_model_len)
