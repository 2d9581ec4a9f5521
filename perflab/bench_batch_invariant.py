"""What batch invariance costs: decode steps and a prompt's prefill, plain against
``batch_invariant=True``, in the same run (minicb/kernels/batch_invariant.py).

Two engines on the embedded default model (float32, the oracle's dtype, and the KV cache
format asked for) built up front; rounds alternate between them with the order rotated, so
that drift in the machine's load falls on both alike. Per batch size: the median pure
decode step of each and their ratio; then the median time of one prompt's whole prefill.

    python -m perflab.bench_batch_invariant --threads 2 --rounds 3 --batches 1 8 32 --kv int8
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from minicb import EngineConfig, LLMEngine, SamplingParams
from perflab.roofline import time_decode

MODES = ("plain", "batch_invariant")


def prefill_s(engine: LLMEngine, prompt_len: int) -> float:
    """Wall time of one prompt's prefill step (one chunk: the budget holds it)."""
    engine.add_request(list(range(100, 100 + prompt_len)), SamplingParams(max_tokens=1))
    start = time.perf_counter()
    engine.step()
    elapsed = time.perf_counter() - start
    engine.run_until_done()
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds per mode and batch")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32], help="batch sizes")
    p.add_argument("--kv", default="int8", choices=("auto", "int8", "fp8"), help="KV format")
    p.add_argument("--prompt-len", type=int, default=32, help="tokens per decode prompt")
    p.add_argument("--prefill-len", type=int, default=256, help="tokens of the timed prefill")
    p.add_argument("--steps", type=int, default=8, help="timed decode steps (after 2 untimed)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    blocks = max(args.batches) * (-(-(args.prompt_len + args.steps + 3) // 16)) + 32
    base = EngineConfig.from_kwargs(
        dtype="float32",
        attention_backend="torch",
        kv_cache_dtype=args.kv,
        num_kv_blocks=blocks,
        max_num_seqs=max(args.batches),
        max_num_batched_tokens=max(512, args.prefill_len),
    )
    engines = {
        mode: LLMEngine(config=base.with_(batch_invariant=mode == "batch_invariant"))
        for mode in MODES
    }
    steps: dict[tuple[str, int], list[float]] = {(m, b): [] for m in MODES for b in args.batches}
    prefills: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in MODES[r % 2 :] + MODES[: r % 2]:  # rotate which mode goes first
            engine = engines[mode]
            for b in args.batches:
                steps[(mode, b)].append(
                    time_decode(engine, b, args.prompt_len, 2, args.steps)["step_s"]
                )
            prefills[mode].append(prefill_s(engine, args.prefill_len))
    print(f"float32, kv {args.kv}, {args.threads} threads, {args.rounds} rounds (medians)")
    print("\n| batch | plain step (ms) | batch-invariant step (ms) | invariant / plain |")
    print("| ---: | ---: | ---: | ---: |")
    for b in args.batches:
        plain, inv = (statistics.median(steps[(m, b)]) for m in MODES)
        print(f"| {b} | {plain * 1e3:.1f} | {inv * 1e3:.1f} | {inv / plain:.2f} |")
    plain, inv = (statistics.median(prefills[m]) for m in MODES)
    print(
        f"| prefill of {args.prefill_len} | {plain * 1e3:.1f} | {inv * 1e3:.1f} "
        f"| {inv / plain:.2f} |"
    )


if __name__ == "__main__":
    main()
