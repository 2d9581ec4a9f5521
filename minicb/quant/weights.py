"""8-bit weights (weight-only, per output channel) for the decoder's linear layers.

A decode step streams every weight once per step whatever the batch, so at small batches its
time follows the bytes of the weights: int8 holds a quarter of fp32's (half of bf16's). Only
the weights are 8-bit; activations, the KV cache (unless ``kv_cache_dtype`` says otherwise) and
the arithmetic stay in the compute dtype.

Format: symmetric int8, one scale per output channel (row of ``W``, shape (out, in)):
``scale = amax(|row|) / 127`` and ``q = round(w / scale)``, so ``|w - q * scale| <= scale / 2``
on every element. A scale per row is what lets the scale factor out of the product:
``x @ (q * s)^T = (x @ q^T) * s``, column by column of the output.

The product: ``torch.ops.aten._weight_int8pack_mm(x, q, scales)``, torch's own weight-only
int8 CPU kernel (in the torch we already depend on; torchao, the usual library, is not
installed here and would bring the same kind of kernel). It takes x in fp32, bf16 or fp16,
q int8 (out, in) and the scales in x's dtype, and reads the int8 weight directly, never a
dequantised copy. Its source has a vectorised path for AVX-512 CPUs; on this AVX2 machine it
measured slower than dequantising first (one 1536x576 layer, one thread: 1.32 ms against
0.83 at 1 row, 59.7 against 1.58 at 32 rows; fp32 F.linear 0.14 and 1.10; 2-core AMD EPYC),
so it is used only where torch reports AVX-512 (not measured here: no such machine).
Everywhere else (AVX2 CPUs, CUDA), and as the reference the tests compare with, ``dequantize``
then ``F.linear``: the same result, with a full-precision copy of the weight made per call,
so int8 saves memory there but not time.

Which layers: q/k/v/o and gate/up/down of every decoder layer. Not the LM head: with tied
embeddings (SmolLM2) its weight is the embedding table, which the lookup needs in full
precision, so an int8 copy would add bytes rather than save them; and the logits are the
most sensitive product (GPTQ, AWQ and vLLM's weight-only formats leave it alone by default).
Not the norms or the embedding (a lookup reads one row per token, not the whole table).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

INT8_MAX = 127
# Where torch's int8 kernel has its vectorised path (AVX-512; expected, not measured, to beat
# dequantise-then-matmul there); on AVX2 it measured slower (see above).
INT8_KERNEL = torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` (out, in) -> (q int8 (out, in), scales fp32 (out,)), symmetric per row."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    # An all-zero row would give scale 0 and 0/0: any positive scale represents it exactly.
    scales = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
    q = torch.round(w / scales[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scales


def dequantize(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The weight the int8 one stands for, (out, in) in ``dtype``."""
    return (q.float() * scales.float()[:, None]).to(dtype)


def int8_linear_reference(
    x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x @ W^T (+ bias) with W dequantised first: the reference for ``Int8Linear``."""
    return F.linear(x, dequantize(q, scales, x.dtype), bias)


def int8_linear_kernel(
    x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x (..., in) @ W^T (+ bias) by torch's int8 CPU kernel, reading q directly."""
    flat = x.reshape(-1, q.shape[1])
    out = torch.ops.aten._weight_int8pack_mm(flat, q, scales)
    if bias is not None:
        out = out + bias
    return out.view(*x.shape[:-1], q.shape[0])


class Int8Linear(nn.Module):
    """A linear layer holding its weight as int8 with an fp scale per output channel."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        q, scales = quantize_per_channel(linear.weight)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # Buffers, not parameters: nothing trains them, and state_dict still lists them.
        self.register_buffer("weight_int8", q.to(linear.weight.device))
        # In the compute dtype, as the kernel wants them (bf16 rounds the scale by <= 2^-9).
        dtype = linear.weight.dtype
        self.register_buffer("scales", scales.to(linear.weight.device, dtype))
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        use_kernel = INT8_KERNEL and x.device.type == "cpu"
        product = int8_linear_kernel if use_kernel else int8_linear_reference
        return product(x, self.weight_int8, self.scales, self.bias)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int8 per output channel"


def quantize_linears(model: nn.Module) -> int:
    """Replace every plain ``nn.Linear`` of the decoder layers (``model.model.layers``) by an
    ``Int8Linear``; the LM head and embedding stay. Returns how many were replaced."""
    targets = [
        (parent, name, child)
        for parent in model.model.layers.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear  # subclasses (tensor-parallel shards) keep their own
    ]
    for parent, name, child in targets:
        setattr(parent, name, Int8Linear(child))
    return len(targets)


def weight_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes the decoder layers' linear weights take: {"int8": ..., "float": ...} (int8 weights
    with their scales, and any linear still in full precision)."""
    sizes = {"int8": 0, "float": 0}
    for module in model.model.layers.modules():
        if isinstance(module, Int8Linear):
            sizes["int8"] += module.weight_int8.nbytes + module.scales.nbytes
        elif type(module) is nn.Linear:
            sizes["float"] += module.weight.nbytes
    return sizes


class Int8Weights:
    """The int8 weight form at the model build's seam (minicb/core/runner/wrappers.py):
    ``weight_dtype="int8"``."""

    unshareable = "cannot share weights held in another weight_dtype"

    def fits(self, device: torch.device, dtype: torch.dtype) -> bool:
        return True  # the reference product runs anywhere; the kernel where it is faster

    def apply(self, model: nn.Module) -> None:
        quantize_linears(model)

    def held_by(self, model: nn.Module) -> bool:
        return any(isinstance(m, Int8Linear) for m in model.modules())

    def describe(self) -> dict[str, str]:
        words = "int8 (a scale per output channel; LM head and embedding unquantised)"
        return {"weight_dtype": words}
