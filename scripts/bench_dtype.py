"""What dtype "auto" picks on this machine, and a decode step in float32 against bfloat16.

Prints the choice and its reason (minicb/runner/dtype.py), then times pure decode steps
of the embedded default model at each batch size in both dtypes, in the same run: two
engines (one per dtype) built up front, rounds alternating between them with the order
rotated, so that drift in the machine's load falls on both alike. Per batch size it
prints the median step time of each dtype over the rounds and their ratio.

    python scripts/bench_dtype.py --threads 1 --rounds 3 --batches 1 32
"""

from __future__ import annotations

import argparse
import statistics

import torch

from minicb import EngineConfig, LLMEngine
from minicb.bench.theory import time_decode
from minicb.runner.dtype import choose_dtype
from minicb.runner.model_runner import resolve_device

DTYPES = ("float32", "bfloat16")


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
