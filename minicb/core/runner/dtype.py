"""Which floating-point type holds the weights and the KV cache, and why.

``dtype="auto"`` is decided here, once per engine, from the hardware:

- CUDA: bfloat16 (tensor cores compute it natively; half the bytes of float32 to read), or
  float16 on a GPU older than Ampere, which has fp16 tensor cores but only emulates bf16.
- CPU with AMX-BF16 or AVX-512 BF16 (recent Intel Xeons, AMD Zen 4 and later): bfloat16,
  since oneDNN's bf16 matmul runs on those instructions. Measured on a 2-core Xeon with AMX:
  a 32 x 576 x 1536 linear layer at 423 GFLOP/s in bf16 against 66 in fp32.
- any other CPU (most laptops: AVX2 only, or Arm): float32. Without native bf16 torch falls
  back to a generic kernel that converts every element, 4x slower than fp32 (issue 14:
  15 against 63 GFLOP/s on an AVX2 EPYC).

The decision reads the CPU's instruction-set flags (``torch.cpu.get_capabilities()``, or
/proc/cpuinfo on a torch without it) rather than timing a probe: the flags are free,
deterministic and say exactly which kernels torch will pick, while a timing probe on a busy
shared machine could choose differently from one run to the next. An explicit dtype always
wins. The reason is a sentence the CLI prints and ``runner.describe()`` reports.

bfloat16 keeps only 8 bits of mantissa, so its greedy tokens can differ from float32's,
from transformers' own bf16 (other kernels round at other places) and between batch shapes
(a different reduction order rounds differently): the exact-token oracle runs in float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# CPU capability flag -> its name in the reason, in order of preference.
NATIVE_BF16 = (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX-512 BF16"))


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype an engine computes in and, in words, why."""

    dtype: torch.dtype
    reason: str

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


def cpu_capabilities(cpuinfo: Path = Path("/proc/cpuinfo")) -> Mapping[str, Any]:
    """The CPU's instruction-set flags, as ``torch.cpu.get_capabilities()`` names them
    (Linux's /proc/cpuinfo uses the same names for the two that matter here)."""
    if hasattr(torch.cpu, "get_capabilities"):  # recent torch; cached by torch
        return torch.cpu.get_capabilities()
    if not cpuinfo.exists():  # no flags to read: the safe choice, float32
        return {}
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return {flag: True for flag in line.split(":", 1)[1].split()}
    return {}


def choose_dtype(
    name: str, device: torch.device, capabilities: Mapping[str, Any] | None = None
) -> DtypeChoice:
    """``name`` ("auto" or one of DTYPES) on ``device``; ``capabilities`` defaults to this
    CPU's flags (a test passes its own)."""
    if name != "auto":
        if name not in DTYPES:
            raise ValueError(f"unknown dtype {name!r}; choose auto or one of {', '.join(DTYPES)}")
        return DtypeChoice(DTYPES[name], "asked for")
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return DtypeChoice(torch.bfloat16, "auto: native bf16 tensor cores on CUDA")
        # Before Ampere (a T4, a V100) bf16 is emulated, slowly; fp16 tensor cores exist.
        return DtypeChoice(torch.float16, "auto: this GPU has no native bf16; fp16 tensor cores")
    if device.type != "cpu":
        return DtypeChoice(torch.float32, f"auto: float32 on {device.type}")
    caps = cpu_capabilities() if capabilities is None else capabilities
    found = [label for flag, label in NATIVE_BF16 if caps.get(flag)]
    if found:
        return DtypeChoice(
            torch.bfloat16, f"auto: this CPU has {' and '.join(found)}, native bf16 matmuls"
        )
    return DtypeChoice(
        torch.float32,
        "auto: this CPU has neither AMX-BF16 nor AVX-512 BF16, so bf16 matmuls would "
        "fall back to a slow generic kernel",
    )
