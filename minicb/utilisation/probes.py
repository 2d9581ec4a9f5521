"""The machine's rates: copy bandwidth and matmul FLOP/s, measured with torch on a device.

Two probes, the roofline's denominators, shared by the performance lab's decode
roofline (perflab/roofline.py) and the model runner (minicb.utilisation.occupancy: the
utilisation of each step):

- copy bandwidth: bytes read plus written per second by one large ``dst.copy_(src)``, as
  STREAM counts it; the copy is at least 256 MiB and twice the weights (``copy_bytes``), so
  that it does not fit in a CPU's caches when the weights would not;
- matmul FLOP/s: a square matmul in the engine's dtype, whose side grows from 128 until one
  product takes about ``PROBE_S`` (``matmul_size``).

Each probe keeps the best of a few runs and stops repeating after ``BUDGET_S``: a CPU
without native bfloat16 runs a large bf16 matmul in a slow fallback, and no probe may take
minutes (issue 14). ``machine_rates`` measures both once per device, dtype and copy size in
a process and caches them: a static engine beside a continuous one pays nothing more.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

PROBE_S = 0.2  # the matmul probe grows until one product takes this long
BUDGET_S = 5.0  # a probe stops repeating once its runs have taken this long
MIN_COPY_BYTES = 256 << 20
MAX_COPY_BYTES = 1 << 30


@dataclass(frozen=True)
class MachineRates:
    """What the probes measured: the roofline's two rates, and the sizes they used."""

    copy_bandwidth: float  # bytes/s, read + write
    matmul_flops: float  # FLOP/s in the engine's dtype
    copy_bytes: int = 0  # bytes copied by the bandwidth probe (0: given, not measured)
    matmul_n: int = 0  # side of the probe's square matmul

    def describe(self) -> dict[str, Any]:
        """JSON-safe, for the runner's description (the page names the rates)."""
        return {
            "copy_gb_s": round(self.copy_bandwidth / 1e9, 2),
            "matmul_gflop_s": round(self.matmul_flops / 1e9, 1),
            "copy_bytes": self.copy_bytes,
            "matmul_n": self.matmul_n,
        }


def copy_bytes(weight_bytes: int) -> int:
    """The bandwidth probe's size: twice the weights, at least 256 MiB, at most 1 GiB."""
    return min(MAX_COPY_BYTES, max(MIN_COPY_BYTES, 2 * weight_bytes))


def sync(device: Any) -> None:
    """Wait for the work queued on a GPU, so a timer around it counts it; nothing on CPU."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _best_time(fn: Callable[[], Any], repeats: int, device: Any = "cpu") -> float:
    """Best seconds of ``fn`` over ``repeats`` runs after a warm-up (first-touch page
    faults, the allocator), fewer once the runs have taken ``BUDGET_S``."""
    fn()
    sync(device)
    best, start = float("inf"), time.perf_counter()
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t)
        if time.perf_counter() - start >= BUDGET_S:
            break
    return best


def measure_copy_bandwidth(nbytes: int, repeats: int = 5, device: Any = "cpu") -> float:
    """Bytes per second of ``dst.copy_(src)`` over ``nbytes``, read plus write, best run."""
    import torch

    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / _best_time(lambda: dst.copy_(src), repeats, device)


def matmul_size(dtype: Any, cap: int = 2048, target_s: float = PROBE_S, device: Any = "cpu") -> int:
    """The side of the probe's square matmul: doubled from 128 until one product takes
    ``target_s``, at most ``cap``. A CPU without native bf16 runs a 2048-cubed bf16 matmul
    for minutes in torch's fallback; this way no probe product takes more than ~8x target."""
    import torch

    n = 128
    while n < cap:
        a = torch.randn(n, n, device=device).to(dtype)
        sync(device)
        t = time.perf_counter()
        a @ a
        sync(device)
        if time.perf_counter() - t >= target_s:
            break
        n *= 2
    return n


def measure_matmul_flops(dtype: Any, n: int, repeats: int = 5, device: Any = "cpu") -> float:
    """FLOP/s of an n x n x n matmul in ``dtype``, best run."""
    import torch

    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    return 2 * n**3 / _best_time(lambda: a @ b, repeats, device)


@cache
def machine_rates(device: str, dtype: Any, nbytes: int) -> MachineRates:
    """Both probes on ``device`` (a GPU's largest matmul side is 8192: one product there
    is milliseconds), measured once per process for each (device, dtype, copy size)."""
    import torch

    cap = 8192 if torch.device(device).type == "cuda" else 2048
    n = matmul_size(dtype, cap=cap, device=device)
    return MachineRates(
        copy_bandwidth=measure_copy_bandwidth(nbytes, device=device),
        matmul_flops=measure_matmul_flops(dtype, n, device=device),
        copy_bytes=nbytes,
        matmul_n=n,
    )
