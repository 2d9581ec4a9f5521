"""The same burst of requests through static and continuous batching, in one run.

Both engines share one copy of the default model's weights (same dtype, threads, KV
pool and limits), so the ratio measures scheduling and nothing else. Output lengths are
drawn from a capped exponential (seeded) and forced with ignore_eos, so every request
generates exactly what the workload says.

    .venv/bin/python scripts/bench_static_vs_continuous.py --requests 32 --max-num-seqs 8
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch


def workload(n: int, mean_out: int, cap: int, prompt_len: int, seed: int):
    rng = random.Random(seed)
    prompts = [[100 + rng.randrange(2000) for _ in range(prompt_len)] for _ in range(n)]
    outs = [max(1, min(cap, int(rng.expovariate(1 / mean_out)))) for _ in range(n)]
    return prompts, outs


def run_burst(engine, prompts, outs) -> float:
    from minicb import SamplingParams

    start = time.perf_counter()
    for p, m in zip(prompts, outs, strict=True):
        engine.add_request(p, SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))
    engine.run_until_done()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--mean-output", type=int, default=32)
    parser.add_argument("--cap", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from minicb import EngineConfig, LLMEngine

    common = dict(dtype=args.dtype, max_num_seqs=args.max_num_seqs, num_kv_blocks=1024)
    continuous = LLMEngine(config=EngineConfig(batching="continuous", **common))
    static = LLMEngine(
        config=EngineConfig(batching="static", **common), share_weights_with=continuous
    )
    prompts, outs = workload(args.requests, args.mean_output, args.cap, args.prompt_len, args.seed)
    tokens = sum(outs)
    run_burst(continuous, prompts[:4], outs[:4])  # warm-up
    run_burst(static, prompts[:4], outs[:4])
    times = {"static": [], "continuous": []}
    for _ in range(args.repeats):  # alternate, so machine noise hits both alike
        times["static"].append(run_burst(static, prompts, outs))
        times["continuous"].append(run_burst(continuous, prompts, outs))
    print(
        f"{args.requests} requests, outputs capped-exp mean {args.mean_output} cap {args.cap} "
        f"({tokens} tokens), prompt {args.prompt_len}, max_num_seqs {args.max_num_seqs}, "
        f"{args.dtype}, {args.threads} threads, median of {args.repeats}"
    )
    print("| mode | output tok/s (median) | min | max |")
    print("|---|---:|---:|---:|")
    rate = {}
    for mode, ts in times.items():
        rate[mode] = tokens / statistics.median(ts)
        print(f"| {mode} | {rate[mode]:.1f} | {tokens / max(ts):.1f} | {tokens / min(ts):.1f} |")
    print(f"continuous / static = {rate['continuous'] / rate['static']:.2f}")


if __name__ == "__main__":
    main()
