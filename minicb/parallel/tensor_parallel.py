"""Tensor parallelism, Megatron-style: which slice of every weight a rank holds, and the
one layer that talks to the other ranks.

Each decoder layer is split over ``world`` ranks by heads and by MLP columns:

- q/k/v, gate and up are **column-parallel**: a rank holds some of their output rows
  (its query heads, its KV heads, its share of the MLP width) and computes them from the
  full hidden state with no communication at all;
- o and down are **row-parallel**: a rank holds the input columns that match, so its
  product is a partial sum of the full output; an all-reduce (sum) over the ranks after
  each one gives every rank the whole hidden state again (two all-reduces per layer).

So a rank is just minicb's ``LlamaModel`` built from a smaller ``ModelConfig`` (fewer
heads, a narrower MLP: ``shard_config``) with o_proj and down_proj swapped for
``RowParallelLinear`` (``shard_model``); attention, the paged KV cache and both attention
backends run unchanged on the rank's own heads. Where there are fewer KV heads than ranks,
each KV head is replicated: rank r keeps the one head its query heads read.

The embedding is replicated on every rank (a lookup needs no communication) and the LM
head lives on rank 0 only, beside the sampler. The alternative, splitting the vocabulary,
saves memory on very large vocabularies but costs an all-reduce for the embedding and a
gather of the logits every step; on the small models minicb runs, the copy is cheaper and
the logits are the unsplit model's own computation.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from minicb.core.runner.build_model import model_config
from minicb.core.runner.llama import LlamaModel, ModelConfig
from minicb.core.runner.loader import ModelFiles, open_safetensors


@dataclass
class CollectiveTimer:
    """Seconds spent in collectives since the last ``take()``."""

    seconds: float = 0.0
    sync_cuda: bool = False  # a CUDA collective is asynchronous: wait for it to time it

    def take(self) -> float:
        spent, self.seconds = self.seconds, 0.0
        return spent


@dataclass
class Shard:
    """Where this process stands in the tensor-parallel group, and so which part of the
    model it holds: a ``ModelPart`` (minicb/core/runner/wrappers.py), which the model runner
    builds in place of the whole model, on rank 0 and on every worker alike."""

    rank: int
    world: int
    group: Any = None  # the ProcessGroup the all-reduces run on (None: the default group)
    timer: CollectiveTimer = field(default_factory=CollectiveTimer)

    def config(self, whole: ModelConfig) -> ModelConfig:
        return shard_config(whole, self.world)

    def shape(self, model: LlamaModel) -> None:
        shard_model(model, self)

    def weights(self, files: ModelFiles, names: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
        """Only this rank's slices are read from the files."""
        whole = model_config(files.hf_config)
        return iter_shard(files.path, whole, self.rank, self.world, names)


def check_divisible(cfg: ModelConfig, world: int) -> None:
    """Raise ValueError naming the dimension that ``world`` ranks cannot split evenly."""
    if cfg.num_heads % world:
        raise ValueError(
            f"tensor_parallel_size {world} must divide the {cfg.num_heads} attention heads"
        )
    if cfg.num_kv_heads % world and world % cfg.num_kv_heads:
        raise ValueError(
            f"tensor_parallel_size {world} must divide the {cfg.num_kv_heads} KV heads, or be "
            "a multiple of them (each KV head is then replicated)"
        )
    if cfg.intermediate_size % world:
        raise ValueError(
            f"tensor_parallel_size {world} must divide the MLP width {cfg.intermediate_size}"
        )


def shard_config(cfg: ModelConfig, world: int) -> ModelConfig:
    """The architecture one rank holds: 1/world of the heads and of the MLP width."""
    check_divisible(cfg, world)
    return dataclasses.replace(
        cfg,
        num_heads=cfg.num_heads // world,
        num_kv_heads=max(1, cfg.num_kv_heads // world),
        intermediate_size=cfg.intermediate_size // world,
    )


def kv_head_start(cfg: ModelConfig, rank: int, world: int) -> int:
    """The first KV head of ``rank`` (of the full model's ``cfg``)."""
    if cfg.num_kv_heads >= world:
        return rank * (cfg.num_kv_heads // world)
    # Fewer KV heads than ranks: rank r's query heads all read KV head r * kv / world.
    return rank * cfg.num_kv_heads // world


class RowParallelLinear(nn.Linear):
    """A linear layer whose input columns are split over the ranks: each rank's product is
    a partial sum, and an all-reduce adds them up. Same parameter name as ``nn.Linear``."""

    def __init__(self, in_features: int, out_features: int, shard: Shard) -> None:
        super().__init__(in_features, out_features, bias=False)
        self.shard = shard

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, in/world) -> (T, out)
        out = super().forward(x)
        timer = self.shard.timer
        if timer.sync_cuda:
            torch.cuda.synchronize(out.device)
        t0 = time.perf_counter()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.shard.group)
        if timer.sync_cuda:
            torch.cuda.synchronize(out.device)
        timer.seconds += time.perf_counter() - t0
        return out


def shard_model(model: LlamaModel, shard: Shard) -> LlamaModel:
    """Swap o_proj and down_proj of a model built from ``shard_config`` for row-parallel
    layers; ranks other than 0 drop the LM head (only rank 0 samples). Works on the meta
    device, before any weight is materialised."""
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.o_proj = RowParallelLinear(attn.o_proj.in_features, attn.o_proj.out_features, shard)
        mlp.down_proj = RowParallelLinear(
            mlp.down_proj.in_features, mlp.down_proj.out_features, shard
        )
    if shard.rank != 0:
        model.lm_head = None
    return model


def _slice_of(name: str, cfg: ModelConfig, rank: int, world: int) -> tuple[int, int, int] | None:
    """(dim, start, stop) of the checkpoint tensor ``name`` that ``rank`` holds; None: all."""
    hd, part = cfg.head_dim, shard_config(cfg, world)
    q = (rank * part.num_heads * hd, (rank + 1) * part.num_heads * hd)
    kv_start = kv_head_start(cfg, rank, world) * hd
    kv = (kv_start, kv_start + part.num_kv_heads * hd)
    mlp = (rank * part.intermediate_size, (rank + 1) * part.intermediate_size)
    module = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else ""
    spans = {
        "q_proj": (0, *q),
        "k_proj": (0, *kv),
        "v_proj": (0, *kv),
        "o_proj": (1, *q),
        "gate_proj": (0, *mlp),
        "up_proj": (0, *mlp),
        "down_proj": (1, *mlp),
    }
    return spans.get(module)


def iter_shard(
    path: Path, cfg: ModelConfig, rank: int, world: int, wanted: set[str]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) of ``rank``'s slice of every checkpoint tensor in ``wanted``,
    reading only that slice from the safetensors files (``get_slice``)."""
    for f in open_safetensors(path):
        for name in f.keys():
            if name not in wanted:
                continue
            span = _slice_of(name, cfg, rank, world)
            if span is None:
                yield name, f.get_tensor(name)
                continue
            dim, start, stop = span
            part = f.get_slice(name)
            yield name, part[start:stop] if dim == 0 else part[:, start:stop]
