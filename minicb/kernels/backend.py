"""Choosing the attention implementation: "torch" reference, "triton", or "auto".

"auto" takes Triton on CUDA and the torch reference on CPU (where Triton would only run
under its slow interpreter).
"""

from __future__ import annotations

from typing import Protocol

import torch

from minicb.kernels import reference
from minicb.kernels.metadata import AttentionMetadata


class AttentionBackend(Protocol):
    name: str

    def store_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None: ...

    def attention(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor: ...


class TorchBackend:
    name = "torch"

    def store_kv(self, key, value, k_cache, v_cache, slot_mapping) -> None:
        reference.store_kv(key, value, k_cache, v_cache, slot_mapping)

    def attention(self, query, k_cache, v_cache, meta, scale) -> torch.Tensor:
        return reference.paged_attention(query, k_cache, v_cache, meta, scale)


def get_backend(name: str, device: torch.device) -> AttentionBackend:
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "torch":
        return TorchBackend()
    if name == "triton":
        from minicb.kernels.triton_backend import TritonBackend

        return TritonBackend()
    raise ValueError(f"unknown attention_backend {name!r}; choose auto, torch or triton")
