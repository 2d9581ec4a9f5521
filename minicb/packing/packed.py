"""Linear layers with their weights packed once for oneDNN, for bfloat16 on CPU.

A decode step of a small model on a CPU is mostly matrix-vector products (batch 1) or thin
matrix products (batch 32). ``nn.functional.linear`` in bfloat16 hands oneDNN a plain
row-major weight on every call, which it re-lays out into its blocked format (the one its
AMX / AVX-512 BF16 microkernels read) each time: measured here, half the time of the
product. ``PackedLinear`` does that re-layout once, at load, and calls oneDNN's linear on
the packed copy; the plain ``weight`` parameter stays (state dict, tied embeddings, sizes)
and is what the reference path and transformers read. Results equal ``F.linear``'s up to
bf16 rounding (oneDNN may block a long input differently); tests check greedy tokens.

Used where ``packed_weights`` (settings.py) allows it, the device is CPU, the dtype is
bfloat16 and torch was built with oneDNN; fp32 keeps MKL's ``linear`` (faster at batch 1).
"""

from __future__ import annotations

import torch
from torch import nn

from minicb.core.runner.dtype import cpu_capabilities

# The row count oneDNN is told to expect when it lays the weight out. Any count runs on any
# layout, but the layout decides how fast. The model's 211 products, laid out for one row
# (a decode of batch 1) against 64 rows: 34.5 against 31.2 ms at 32 rows, 37.1 against 31.8
# at 48 (15 decodes beside a 32-token chunk), 72.7 against 60.5 at 256; at 1 to 15 rows the
# layout for one row is 1 to 3 % faster (25.9 against 26.6 ms at one). AMX machine, bf16,
# one thread, perflab/packed_layout_cpu_time.py. Every step with a prompt chunk and every
# decode batch from about 20 rows gains more than the small batches lose.
PACKED_FOR_ROWS = 64


class PackedLinear(nn.Module):
    """``nn.Linear`` whose forward reads a oneDNN-packed copy of the weight."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight = linear.weight  # (out, in), kept: ties, state dict, size accounting
        self.bias = linear.bias
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), PACKED_FOR_ROWS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, in) -> (T, out)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


# oneDNN's bf16 weight reorder needs one of these (its own error names them); an AVX2-only
# CPU (some AMD EPYCs) has neither, and asking for bf16 there must not crash the engine.
ONEDNN_BF16 = (("avx512_bw", "avx512_vl", "avx512_dq"), ("avx_ne_convert",))


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    if device.type != "cpu" or dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return False
    flags = cpu_capabilities()
    return any(all(flags.get(f) for f in needs) for needs in ONEDNN_BF16)


def pack_linears(model: nn.Module) -> int:
    """Replace every plain ``nn.Linear`` of ``model`` by a PackedLinear; how many."""
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear  # subclasses (e.g. sharded layers) keep their own forward
    ]
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child))
    return len(targets)


class PackedWeights:
    """The oneDNN-packed weight form at the model build's seam
    (minicb/core/runner/wrappers.py): ``packed_weights`` in bfloat16 on a CPU that can."""

    unshareable = "cannot share weights packed for oneDNN with an engine without packed_weights"

    def fits(self, device: torch.device, dtype: torch.dtype) -> bool:
        return can_pack(device, dtype)

    def apply(self, model: nn.Module) -> None:
        pack_linears(model)

    def held_by(self, model: nn.Module) -> bool:
        return any(isinstance(m, PackedLinear) for m in model.modules())

    def describe(self) -> dict[str, str]:
        return {"linear": "onednn-packed"}
