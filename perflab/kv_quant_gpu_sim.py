"""8-bit KV cache and 8-bit weights at GPU scale, in the simulator: blocks, batch, throughput,
TBT.

The same requests through the real engine on a simulated GPU (minicb/sim/) four times:
``weight_dtype`` "auto" (bf16) or "int8" (a byte per decoder-layer parameter and a scale per
output channel) times ``kv_cache_dtype`` "auto" (bf16) or "int8" (one byte a value and an
fp32 scale per token and KV head): the pool the engine sizes from the same memory (what the
weights leave, in blocks of the KV format), the running batch it then holds, output tokens/s
and the time between tokens, each against bf16/bf16 in the same run. Long requests
all at once, so the batch is bound by the KV pool, not by ``max_num_seqs``. Simulated
seconds, not a measurement: the step-time model's (docs/simulation.md).

    python -m perflab.kv_quant_gpu_sim --profile H100:llama-3.1-8b --requests 400
"""

from __future__ import annotations

import argparse

from minicb.core.config import EngineConfig
from minicb.cost_model.catalogue import load_profile
from minicb.sim.run import run_simulated
from minicb.workload import from_lengths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="H100:llama-3.1-8b", help="GPU:MODEL (minicb.sim)")
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--prompt-len", type=int, default=3000)
    p.add_argument("--output-len", type=int, default=500)
    p.add_argument("--max-num-seqs", type=int, default=512)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    args = p.parse_args()

    profile = load_profile(args.profile)
    requests = from_lengths([args.prompt_len] * args.requests, [args.output_len] * args.requests)
    print(
        f"{profile.name}, {args.requests} requests of {args.prompt_len} + {args.output_len} "
        f"tokens at once, max_num_seqs {args.max_num_seqs}, block 16 (simulated)"
    )
    header = (
        "weights",
        "kv",
        "W GiB",
        "B/block",
        "blocks",
        "rows/step",
        "out tok/s",
        "TBT ms",
        "TTFT s",
        "preempt",
    )
    print("  ".join(f"{h:>10}" for h in header))
    base = None
    for weights, kv in [(w, k) for w in ("auto", "int8") for k in ("auto", "int8")]:
        config = EngineConfig.from_kwargs(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            kv_cache_dtype=kv,
            weight_dtype=weights,
        )
        run = run_simulated(profile, config, requests)
        s, runner = run["summary"], run["runner"]
        tok_s = s["throughput"]["output_tokens_per_s"]
        base = base or tok_s
        row = (
            weights,
            kv,
            runner["weight_gib"],
            runner["bytes_per_block"],
            runner["num_kv_blocks"],
            f"{s['batch']['mean_rows_per_step']:.1f}",
            f"{tok_s:.0f}",
            f"{s['latency']['tpot_s']['mean'] * 1e3:.1f}",
            f"{s['latency']['ttft_s']['mean']:.2f}",
            s["preemptions"]["total"],
        )
        print("  ".join(f"{v:>10}" for v in row) + f"   x{tok_s / base:.2f} tok/s")


if __name__ == "__main__":
    main()
