"""What dtype "auto" picks on this machine, and a decode step in float32 against bfloat16.

Prints the choice and its reason (minicb/core/runner/dtype.py); the speed of one of the
model's linear layers (32 rows through a 576 x 1536 weight, the shape issue 14 measured)
in each dtype; then times pure decode steps of the embedded default model at each batch
size in both dtypes, in the same run: two engines (one per dtype) built up front, rounds
alternating between them with the order rotated, so that drift in the machine's load
falls on both alike. Per batch size it prints the median step time of each dtype over the
rounds and their ratio.

    python -m perflab.bench_dtype --threads 1 --rounds 3 --batches 1 32
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from minicb import EngineConfig, LLMEngine
from minicb.core.runner.dtype import DTYPES as TORCH_DTYPES
from minicb.core.runner.dtype import choose_dtype
from minicb.core.runner.model_runner import resolve_device
from perflab.roofline import time_decode

DTYPES = ("float32", "bfloat16")


def linear_gflops(dtype: torch.dtype, rows: int = 32, calls: int = 50) -> float:
    """GFLOP/s of ``rows`` x 576 through a 576 x 1536 weight, best of 5 runs of ``calls``."""
    x, w = torch.randn(rows, 576).to(dtype), torch.randn(1536, 576).to(dtype)
    torch.nn.functional.linear(x, w)  # warm-up
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            torch.nn.functional.linear(x, w)
        best = min(best, time.perf_counter() - start)
    return 2 * rows * 576 * 1536 * calls / best / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="torch threads, pinned")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds per dtype and batch")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32], help="batch sizes")
    p.add_argument("--prompt-len", type=int, default=32, help="tokens per prompt")
    p.add_argument("--steps", type=int, default=8, help="timed decode steps (after 2 untimed)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    device = resolve_device("auto")
    choice = choose_dtype("auto", device)
    print(f"dtype auto on {device}: {choice.name} ({choice.reason})")
    f32, bf16 = (linear_gflops(TORCH_DTYPES[d]) for d in DTYPES)
    print(f"32 x 576 x 1536 linear: float32 {f32:.0f} GFLOP/s, bfloat16 {bf16:.0f} GFLOP/s")
    blocks = max(args.batches) * (-(-(args.prompt_len + args.steps + 3) // 16)) + 1
    engines = {
        d: LLMEngine(
            config=EngineConfig(dtype=d, num_kv_blocks=blocks, max_num_seqs=max(args.batches))
        )
        for d in DTYPES
    }
    times: dict[tuple[str, int], list[float]] = {(d, b): [] for d in DTYPES for b in args.batches}
    for r in range(args.rounds):
        for b in args.batches:
            for d in DTYPES[r % 2 :] + DTYPES[: r % 2]:  # rotate which dtype goes first
                times[(d, b)].append(
                    time_decode(engines[d], b, args.prompt_len, 2, args.steps)["step_s"]
                )
    print("\n| batch | float32 step (ms) | bfloat16 step (ms) | float32 / bfloat16 |")
    print("| ---: | ---: | ---: | ---: |")
    for b in args.batches:
        f32, bf16 = (statistics.median(times[(d, b)]) for d in DTYPES)
        print(f"| {b} | {f32 * 1e3:.1f} | {bf16 * 1e3:.1f} | {f32 / bf16:.2f} |")


if __name__ == "__main__":
    main()
