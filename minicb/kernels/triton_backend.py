"""The "triton" attention backend: the same two calls as the torch one, on our kernels.

``store_kv`` scatters this step's K/V into the paged cache (store_kv.py); ``attention``
takes the decode kernel when every request brings exactly one query token (the common
steady state, where one program per KV head reads the context once for the whole GQA
group: decode_attention.py), and the chunked-prefill kernel otherwise, which also serves
decode rows mixed into a prefill batch (prefill_attention.py). The kernels run on CUDA
tensors, or on CPU tensors under Triton's interpreter, which Triton switches on only if
``TRITON_INTERPRET=1`` is in the environment when the kernels are defined (at import).
Anything else is refused with a clear error instead of a crash deep inside Triton. Triton
itself is imported only when this backend runs a kernel; the core's ``get_backend``
(backend_choice.py) imports this file, through the entry minicb/kernels/__init__.py registers,
only when the triton backend is chosen.
"""

from __future__ import annotations

import torch

from minicb.core.attention.backend import AttentionMetadata


def kernels_are_interpreted() -> bool:
    """True when Triton compiled our kernels for its CPU interpreter."""
    from triton.runtime.jit import JITFunction

    from minicb.kernels.decode_attention import _decode_kernel

    return not isinstance(_decode_kernel, JITFunction)


def _check_device(tensor: torch.Tensor) -> None:
    if tensor.device.type == "cuda" or kernels_are_interpreted():
        return
    raise RuntimeError(
        f"The triton attention backend got {tensor.device.type} tensors, but Triton runs on "
        "CPU only under its interpreter, and TRITON_INTERPRET=1 must be set before triton "
        "is first imported (importing transformers can import it). Set it at the top of "
        "your script or in the environment, or use attention_backend='torch' on CPU."
    )


class TritonBackend:
    """Our Triton kernels behind the interface the model calls (``AttentionBackend``)."""

    name = "triton"

    def __init__(self, reason: str = "asked for") -> None:
        self.reason = reason

    def store_kv(
        self,
        key: torch.Tensor,  # (T, num_kv_heads, head_dim)
        value: torch.Tensor,  # (T, num_kv_heads, head_dim)
        k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,  # (T,) int64; -1: do not store
    ) -> None:
        from minicb.kernels.store_kv import store_kv

        _check_device(key)
        store_kv(key, value, k_cache, v_cache, slot_mapping)

    def attention(
        self,
        query: torch.Tensor,  # (T, num_heads, head_dim)
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # (T, num_heads, head_dim), query dtype
        from minicb.kernels.decode_attention import paged_decode_attention
        from minicb.kernels.prefill_attention import paged_prefill_attention

        _check_device(query)
        if meta.is_decode_only:
            return paged_decode_attention(
                query,
                k_cache,
                v_cache,
                meta.block_tables,
                meta.context_lens,
                scale,
                meta.max_context_len,
            )
        return paged_prefill_attention(
            query,
            k_cache,
            v_cache,
            meta.block_tables,
            meta.context_lens,
            meta.query_start,
            scale,
            meta.max_query_len,
        )
