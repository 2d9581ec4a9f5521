"""CPU time of the torch backend's attention against the reference, 30 layers of one step.

The default model's shapes (9 query heads, 3 KV heads, head dim 64, blocks of 16) on three
step kinds: decodes beside a prompt chunk (what continuous batching runs whenever it admits a
request), a step of prompt chunks only, and one long chunk. Thread CPU time, median of 7, one
thread, so other work on the machine drops out. Prints both, the ratio and the largest
difference of the outputs (0: the same SDPA calls on the same values).

    .venv/bin/python -m perflab.mixed_attention_cpu_time
"""

from __future__ import annotations

import statistics
import time

import torch

from minicb.core.attention import reference
from minicb.core.attention.backend import TorchBackend
from tests.kernels import make_paged_case

LAYERS, SCALE = 30, 64**-0.5
STEPS = {
    "15 decodes + a chunk of 32": ([1] * 15 + [32], [40] * 15 + [32]),
    "16 chunks of 32": ([32] * 16, [32] * 16),
    "1 chunk of 512": ([512], [512]),
}


def cpu_ms(layer_fn, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        step = layer_fn()  # a fresh backend per step: the index is built once, as in the engine
        start = time.thread_time()
        for _ in range(LAYERS):
            step()
        times.append(time.thread_time() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    torch.set_num_threads(1)
    for dtype in (torch.bfloat16, torch.float32):
        for name, (query_lens, context_lens) in STEPS.items():
            q, k, v, meta = make_paged_case(query_lens, context_lens, 9, 3, 64, 16, dtype)

            def backend_step(q=q, k=k, v=v, meta=meta):
                backend = TorchBackend()
                return lambda: backend.attention(q, k, v, meta, SCALE)

            ref = cpu_ms(lambda q=q, k=k, v=v, meta=meta: lambda: reference.paged_attention(
                q, k, v, meta, SCALE))  # fmt: skip
            new = cpu_ms(backend_step)
            diff = (backend_step()() - reference.paged_attention(q, k, v, meta, SCALE)).abs()
            print(
                f"{str(dtype):15} {name:27} reference {ref:7.2f} ms  torch backend {new:7.2f} ms"
                f"  ratio {ref / new:.2f}  max diff {diff.max().item():.1e}"
            )


if __name__ == "__main__":
    main()
